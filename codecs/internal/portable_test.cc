#include "codecs/internal/portable.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace actpack::codecs::portable {
namespace {

TEST(HalfTest, RoundTripsEveryHalf) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(f))));
      continue;
    }
    EXPECT_EQ(FloatToHalf(f), h) << "half 0x" << std::hex << h;
  }
}

// Every finite half against its value from the definition: (1024 + m) * 2^(e - 25), or
// m * 2^-24 for a subnormal, signed.
TEST(HalfTest, EveryFiniteHalfHasItsValue) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint32_t e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0x1f) continue;
    const double magnitude = e == 0 ? std::ldexp(m, -24) : std::ldexp(1024 + m, e - 25);
    const float expected = static_cast<float>((h & 0x8000) != 0 ? -magnitude : magnitude);
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    EXPECT_EQ(std::memcmp(&f, &expected, 4), 0) << "half 0x" << std::hex << h;
  }
}

TEST(HalfTest, RoundsToNearestEven) {
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);  // halfway to the next binade: rounds to inf
  EXPECT_EQ(FloatToHalf(1.0f + 1.0f / 2048), 0x3c00);          // tie, even stays
  EXPECT_EQ(FloatToHalf(1.0f + 3.0f / 2048), 0x3c02);          // tie, odd rounds up
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);       // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -26)), 0x0000);       // below half of it
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
}

TEST(Bf16Test, DirectedRounding) {
  const float x = 1.0f + 1.0f / 1024;  // not representable in bf16 (7 mantissa bits)
  EXPECT_LT(Bf16ToFloat(FloatToBf16Down(x)), x);
  EXPECT_GT(Bf16ToFloat(FloatToBf16Up(x)), x);
  EXPECT_LT(Bf16ToFloat(FloatToBf16Down(-x)), -x);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16Down(2.0f)), 2.0f);
  EXPECT_EQ(Bf16ToFloat(FloatToBf16Up(2.0f)), 2.0f);
  EXPECT_EQ(FloatToBf16(1.0f), 0x3f80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}

TEST(UniformTest, InUnitIntervalWithMeanOneHalf) {
  double sum = 0;
  const int n = 1 << 20;
  for (int i = 0; i < n; ++i) {
    const float u = UniformFloat(42, i);
    ASSERT_GE(u, 0.0f);
    ASSERT_LT(u, 1.0f);
    sum += u;
  }
  EXPECT_NEAR(sum / n, 0.5, 1e-3);
  EXPECT_NE(UniformFloat(1, 7), UniformFloat(2, 7));
}

TEST(FloorTest, MatchesStdFloor) {
  for (float x : {0.0f, 0.5f, 1.0f, 2.999f, 3.0f, -0.5f, 255.9f, 1e6f + 0.5f}) {
    EXPECT_EQ(Floor(x), std::floor(x)) << x;
  }
}

}  // namespace
// Every payload word index gets its own term: past 8 GiB of payload the indices used to meet
// the header's (2^31 + j) and, past 16 GiB, each other's 2^32 positions away, so swapping two
// such words left the checksum unchanged.
TEST(ChecksumTest, PayloadWordsNeverShareATermWithHeaderWordsOrFarWords) {
  for (uint32_t word : {0u, 1u, 0xdeadbeefu}) {
    for (uint32_t j : {0u, 1u, 29u}) {
      EXPECT_NE(ChecksumTerm(word, (uint64_t{1} << 31) + j), HeaderChecksumTerm(word, j));
    }
    for (uint64_t i : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 31) + 7}) {
      EXPECT_NE(ChecksumTerm(word, i), ChecksumTerm(word, i + (uint64_t{1} << 32)));
      EXPECT_NE(ChecksumTerm(word, i), ChecksumTerm(word, i + (uint64_t{3} << 32)));
    }
  }
}

// Below 2^31 words the payload term is the formula of the first release: every buffer written
// since still verifies.
TEST(ChecksumTest, TermsBelowEightGibibytesAreUnchanged) {
  for (uint64_t i : {uint64_t{0}, uint64_t{1}, uint64_t{123456}, (uint64_t{1} << 31) - 1}) {
    EXPECT_EQ(ChecksumTerm(0x01020304u, i),
              SplitMix64((i << 32) ^ 0x01020304u ^ 0x5851f42d4c957f2dull));
  }
  EXPECT_EQ(HeaderChecksumTerm(7, 3),
            SplitMix64((((uint64_t{1} << 31) + 3) << 32) ^ 7 ^ 0x5851f42d4c957f2dull));
}

TEST(Divisor32Test, DividesExactlyAsTheDivisionOperator) {
  // Every divisor to 4096 and those around powers of two and the top of the range, each against
  // the numerators where quotients change (multiples of d and their neighbours, the top of the
  // range) and random ones.
  std::vector<uint32_t> divisors;
  for (uint32_t d = 1; d <= 4096; ++d) divisors.push_back(d);
  for (uint32_t k = 12; k < 32; ++k) {
    for (int64_t delta = -2; delta <= 2; ++delta) {
      divisors.push_back(static_cast<uint32_t>((int64_t{1} << k) + delta));
    }
  }
  divisors.push_back(0xffffffffu);
  divisors.push_back(0xfffffffeu);
  divisors.push_back(0x80000001u);
  std::mt19937 rng(7);
  for (uint32_t d : divisors) {
    const Divisor32 divisor = MakeDivisor32(d);
    std::vector<uint32_t> numerators = {0, 1, d - 1, d, d + 1, 0xffffffffu, 0xfffffffeu,
                                        0x80000000u, 0x7fffffffu};
    const uint32_t top = 0xffffffffu / d;
    for (uint32_t q : {1u, 2u, 3u, top / 2, top - 1, top}) {
      if (q == 0) continue;
      const uint64_t at = uint64_t{q} * d;
      for (int64_t delta = -1; delta <= 1; ++delta) {
        const int64_t n = static_cast<int64_t>(at) + delta;
        if (n >= 0 && n <= 0xffffffff) numerators.push_back(static_cast<uint32_t>(n));
      }
    }
    for (int i = 0; i < 64; ++i) numerators.push_back(static_cast<uint32_t>(rng()));
    for (uint32_t n : numerators) {
      ASSERT_EQ(Divide(n, divisor), n / d) << n << " / " << d;
    }
  }
}

}  // namespace actpack::codecs::portable

#include "codecs/cast.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "codecs/codec.h"
#include "codecs/internal/portable.h"
#include "codecs/testing/test_util.h"
#include "codecs/registry.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

using testing::DecodeFloats;
using testing::EncodeFloats;

std::vector<float> Gaussian(size_t n, uint32_t seed) { return testing::Gaussian(n, seed, 0.0f, 10.0f); }

class CastTest : public ::testing::TestWithParam<const char*> {};

// Decoding gives exactly the input rounded to the storage type, for odd sizes too.
TEST_P(CastTest, RoundTripIsTheRoundedValue) {
  const CodecParams params = *ParseCodecSpec(GetParam());
  const bool bf16 = params.cast_to == DType::kBFloat16;
  for (size_t n : {1u, 2u, 31u, 33u, 1001u, 100000u}) {
    std::vector<float> x = Gaussian(n, static_cast<uint32_t>(n));
    if (n > 3) x[3] = 1e-6f;  // subnormal in float16
    const std::vector<uint8_t> buffer = *EncodeFloats(x, {static_cast<int64_t>(n)}, params);
    EXPECT_EQ(buffer.size(), kHeaderSize + 4 * ((n + 1) / 2));
    const std::vector<float> y = DecodeFloats(buffer, {static_cast<int64_t>(n)});
    for (size_t i = 0; i < n; ++i) {
      const float expected = bf16 ? portable::Bf16ToFloat(portable::FloatToBf16(x[i]))
                                  : portable::HalfToFloat(portable::FloatToHalf(x[i]));
      ASSERT_EQ(y[i], expected) << GetParam() << " n " << n << " i " << i;
      ASSERT_LE(std::abs(y[i] - x[i]), std::abs(x[i]) * (bf16 ? 1.0f / 256 : 1.0f / 2048) + 1e-7f);
    }
  }
}

TEST_P(CastTest, EmptyAndScalar) {
  const CodecParams params = *ParseCodecSpec(GetParam());
  const std::vector<uint8_t> empty = *EncodeFloats({}, {0, 7}, params);
  EXPECT_EQ(empty.size(), kHeaderSize);
  EXPECT_TRUE(DecodeFloats(empty, {0, 7}).empty());
  const std::vector<uint8_t> scalar = *EncodeFloats({1.5f}, {}, params);
  EXPECT_EQ(DecodeFloats(scalar, {}), std::vector<float>{1.5f});
}

TEST_P(CastTest, KeepsNaNAndInfinity) {
  const CodecParams params = *ParseCodecSpec(GetParam());
  const float inf = std::numeric_limits<float>::infinity();
  const std::vector<float> x = {std::nanf(""), inf, -inf, 0.0f, -0.0f};
  const std::vector<float> y = DecodeFloats(*EncodeFloats(x, {5}, params), {5});
  EXPECT_TRUE(std::isnan(y[0]));
  EXPECT_EQ(y[1], inf);
  EXPECT_EQ(y[2], -inf);
  EXPECT_EQ(portable::FloatBits(y[3]), 0u);
  EXPECT_EQ(portable::FloatBits(y[4]), 0x80000000u);
}

INSTANTIATE_TEST_SUITE_P(Targets, CastTest, ::testing::Values("cast:fp16", "cast:bf16"));

TEST(CastOverflowTest, Float16RefusesValuesBeyondItsRange) {
  const CodecParams fp16 = *ParseCodecSpec("fp16");
  EXPECT_TRUE(EncodeFloats({65504.0f, -65504.0f}, {2}, fp16).ok());
  for (float big : {65520.0f, -70000.0f, 3e38f}) {
    const absl::StatusOr<std::vector<uint8_t>> r = EncodeFloats({1.0f, big, 2.0f}, {3}, fp16);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << big;
    EXPECT_NE(r.status().message().find("keep exact"), absl::string_view::npos);
  }
  // bfloat16 has float's range: only the very top rounds to infinity.
  EXPECT_TRUE(EncodeFloats({70000.0f, 3e38f}, {2}, *ParseCodecSpec("bf16")).ok());
  EXPECT_EQ(EncodeFloats({std::numeric_limits<float>::max()}, {1}, *ParseCodecSpec("bf16"))
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(CastDtypeTest, OnlyFloat32) {
  std::vector<uint16_t> half(4);
  TensorView input{half.data(), DType::kFloat16, {4}, Device::kCpu};
  EXPECT_EQ(MaxEncodedSize(input.Spec(), *ParseCodecSpec("cast:bf16")).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CastCorruptTest, BadStorageDtypeIsDataLoss) {
  std::vector<uint8_t> buffer = *EncodeFloats({1.0f, 2.0f, 3.0f}, {3}, *ParseCodecSpec("bf16"));
  absl::StatusOr<Header> header = ParseHeader(buffer.data(), buffer.size());
  ASSERT_TRUE(header.ok());
  header->params[0] = static_cast<uint8_t>(DType::kFloat32);
  header->checksum = CombineChecksum(HeaderChecksum(*header),
                                     PayloadChecksum(buffer.data() + kHeaderSize,
                                                     header->payload_size));
  WriteHeader(*header, buffer.data());
  std::vector<float> out(3);
  MutableTensorView output{out.data(), DType::kFloat32, {3}, Device::kCpu};
  EXPECT_EQ(Decode(buffer.data(), buffer.size(), output, {}).code(), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace actpack::codecs

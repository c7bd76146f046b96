// Every vector target the CPU runs (AVX2, AVX-512) against the scalar reference, byte for byte:
// encoded buffers and decoded tensors of every codec over odd sizes, tails past groups, blocks
// and windows, and non-finite values; the kernels on their own where the codecs cannot reach
// (draw streams that wrap at 2^32 elements, checksum indices past 2^31).
#include "codecs/internal/simd.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"
#include "codecs/registry.h"
#include "codecs/testing/test_util.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

using simd::Target;

// Runs fn() under each target and restores the default after.
template <typename Fn>
void ForEachTarget(Fn fn) {
  for (Target target : simd::SupportedTargets()) {
    simd::SetTargetForTest(target);
    ASSERT_EQ(simd::ActiveTarget(), target);
    fn(target);
  }
  simd::SetTargetForTest(std::nullopt);
}

TEST(SimdTest, TheScalarReferenceIsAlwaysATarget) {
  const std::vector<Target> targets = simd::SupportedTargets();
  ASSERT_FALSE(targets.empty());
  EXPECT_EQ(targets.front(), Target::kScalar);
  for (Target t : targets) std::printf("target: %s\n", simd::TargetName(t));
}

enum class Data {
  kGaussian, kRelu, kMask, kNonFinite, kWide, kTiny, kConstant,
  kSmooth,       // a smooth field over the last two dims: eb picks row and 2-D Lorenzo there
  kBitPatterns,  // random float bits: NaN payloads, infinities, subnormals, every exponent
};

// `n` values of a tensor whose last dim is `cols`.
std::vector<float> MakeData(size_t n, Data data, uint32_t seed, size_t cols = 1) {
  std::vector<float> v = testing::Gaussian(n, seed);
  for (size_t i = 0; i < n; ++i) {
    switch (data) {
      case Data::kSmooth: {
        const float r = static_cast<float>(i / cols), c = static_cast<float>(i % cols);
        v[i] = 3.0f * std::sin(c / 9.0f + r / 31.0f) + 0.25f * std::cos(r / 5.0f) + 0.01f * v[i];
        break;
      }
      case Data::kBitPatterns:
        v[i] = portable::BitsToFloat(portable::Hash32(static_cast<uint32_t>(i) ^ seed));
        break;
      case Data::kRelu: v[i] = std::max(0.0f, v[i]); break;
      case Data::kMask: v[i] = v[i] > 0.0f ? 2.0f : 0.0f; break;
      case Data::kNonFinite:
        if (i % 97 == 5) v[i] = std::numeric_limits<float>::quiet_NaN();
        if (i % 89 == 7) v[i] = -std::numeric_limits<float>::infinity();
        if (i % 101 == 3) v[i] = -0.0f;
        break;
      case Data::kWide: v[i] = std::ldexp(v[i], static_cast<int>(i % 60) - 30); break;
      // Down to float16's subnormals and below, without overflowing it.
      case Data::kTiny: v[i] = std::ldexp(v[i], -static_cast<int>(i % 32)); break;
      case Data::kConstant: v[i] = 1.5f; break;
      default: break;
    }
  }
  return v;
}

struct Outcome {
  absl::StatusCode code;
  std::vector<uint8_t> encoded;
  std::vector<uint8_t> decoded;
};

Outcome RunCodec(const std::vector<uint8_t>& input, DType dtype, const std::vector<int64_t>& shape,
                 const CodecParams& params) {
  Outcome out;
  absl::StatusOr<std::vector<uint8_t>> encoded =
      testing::EncodeToVector(input.data(), dtype, shape, params);
  out.code = encoded.status().code();
  if (!encoded.ok()) return out;
  out.encoded = *encoded;
  out.decoded.assign(input.size(), 0xa5);
  MutableTensorView view{out.decoded.data(), dtype, shape, Device::kCpu};
  const absl::Status decoded = Decode(out.encoded.data(), out.encoded.size(), view, {});
  EXPECT_TRUE(decoded.ok()) << decoded;
  return out;
}

// Encodes and decodes every (spec, dtype, shape, data) with the scalar reference and then with
// each target, and compares status, buffer and decoded tensor byte for byte. Returns the
// comparisons made.
int CompareTargets(const std::vector<std::string>& specs,
                   const std::vector<std::vector<int64_t>>& shapes, const std::vector<Data>& kinds) {
  int compared = 0;
  for (const std::string& spec : specs) {
    absl::StatusOr<CodecParams> params = ParseCodecSpec(spec);
    EXPECT_TRUE(params.ok()) << spec;
    if (!params.ok()) continue;
    params->seed = 12345;
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (const std::vector<int64_t>& shape : shapes) {
        if (!MaxEncodedSize({dtype, shape}, *params).ok()) continue;
        uint64_t numel = 1;
        for (int64_t d : shape) numel *= d;
        for (Data kind : kinds) {
          const size_t cols = shape.empty() ? 1 : static_cast<size_t>(shape.back());
          const std::vector<uint8_t> input =
              testing::ToBytes(MakeData(numel, kind, static_cast<uint32_t>(numel), cols), dtype);
          simd::SetTargetForTest(Target::kScalar);
          const Outcome reference = RunCodec(input, dtype, shape, *params);
          bool same = true;
          ForEachTarget([&](Target target) {
            if (!same) return;
            const Outcome got = RunCodec(input, dtype, shape, *params);
            const std::string where =
                absl::StrCat(spec, " ", DTypeName(dtype), " numel ", numel, " data ",
                             static_cast<int>(kind), " on ", simd::TargetName(target));
            EXPECT_EQ(got.code, reference.code) << where;
            EXPECT_EQ(got.encoded, reference.encoded) << where;
            EXPECT_EQ(got.decoded, reference.decoded) << where;
            same = got.code == reference.code && got.encoded == reference.encoded &&
                   got.decoded == reference.decoded;
            ++compared;
          });
          simd::SetTargetForTest(std::nullopt);
          if (!same) return compared;  // one failure is enough to read
        }
      }
    }
  }
  return compared;
}

const std::vector<Data> kAllData = {Data::kGaussian,  Data::kRelu,   Data::kMask,
                                    Data::kNonFinite, Data::kWide,   Data::kTiny,
                                    Data::kConstant,  Data::kSmooth, Data::kBitPatterns};

TEST(SimdTest, EveryCodecWritesTheReferenceBytesOnEveryTarget) {
  const std::vector<std::string> specs = {
      "quant1", "quant2", "quant4", "quant8", "quant:bits=2,group=64",
      "quant:bits=8,group=4096", "quant:bits=1,group=2048", "cast:fp16", "cast:bf16", "mask",
      "pool2", "pool3", "pool4", "pool:k=64", "division", "division:block=4,bits=4",
      "division:bits=1", "division:bits=8", "division:block=2", "division:block=3",
      "division:block=5", "division:block=16", "division:block=64", "eb:rel=1e-2", "eb:abs=0.01", "eb:rel=1e-4",
      "identity"};
  const std::vector<std::vector<int64_t>> shapes = {
      {}, {1}, {7}, {31}, {33}, {255}, {257}, {1000}, {4100}, {3, 37}, {5, 9, 17},
      {2, 3, 16, 19}, {2, 4, 64, 64}, {1, 2, 24, 300}, {3, 130, 40}, {70001}};
  std::printf("compared %d encodes and decodes\n", CompareTargets(specs, shapes, kAllData));
}

// Tensors large enough that the codecs split them over several parallel tasks (eb's tasks
// write their data in place and move it down afterwards; division encodes tensors of many small
// planes a plane at a time, the others in two passes).
TEST(SimdTest, LargeTensorsSplitAcrossTasks) {
  const std::vector<std::string> specs = {"eb:rel=1e-2", "eb:rel=1e-5", "division",
                                          "division:block=5,bits=4", "quant2", "mask", "pool4"};
  const std::vector<std::vector<int64_t>> shapes = {{3, 301, 203}, {270001}, {2, 3, 130, 270},
                                                    {4, 40, 12, 13}, {160, 16, 24}};
  const std::vector<Data> kinds = {Data::kGaussian, Data::kSmooth, Data::kNonFinite,
                                   Data::kBitPatterns};
  std::printf("compared %d encodes and decodes\n", CompareTargets(specs, shapes, kinds));
}

// `mask` of bool and uint8 tensors (the float dtypes are in the tests above).
TEST(SimdTest, ByteMasksWriteTheReferenceBytesOnEveryTarget) {
  const CodecParams params = *ParseCodecSpec("mask");
  int compared = 0;
  for (DType dtype : {DType::kBool, DType::kUInt8}) {
    for (int64_t numel : {0, 1, 31, 33, 255, 4097, 70001}) {
      for (int kind = 0; kind < 4; ++kind) {
        std::vector<uint8_t> input(numel);
        for (int64_t i = 0; i < numel; ++i) {
          const bool set = portable::Hash32(static_cast<uint32_t>(i)) % 3 == 0;
          switch (kind) {
            case 0: input[i] = set ? 1 : 0; break;                   // a bool mask
            case 1: input[i] = set ? 0xff : 0; break;                // the top byte value
            case 2: input[i] = set ? (i % 2 ? 7 : 9) : 0; break;     // two values: refused
            default: input[i] = 0; break;                            // all zero
          }
        }
        simd::SetTargetForTest(Target::kScalar);
        const Outcome reference = RunCodec(input, dtype, {numel}, params);
        ForEachTarget([&](Target target) {
          const Outcome got = RunCodec(input, dtype, {numel}, params);
          const std::string where = absl::StrCat(DTypeName(dtype), " numel ", numel, " kind ",
                                                 kind, " on ", simd::TargetName(target));
          EXPECT_EQ(got.code, reference.code) << where;
          EXPECT_EQ(got.encoded, reference.encoded) << where;
          EXPECT_EQ(got.decoded, reference.decoded) << where;
          ++compared;
        });
      }
    }
  }
  std::printf("compared %d encodes and decodes\n", compared);
}

TEST(SimdTest, ChecksumWordsMatchesTheTermsAtAnyIndex) {
  std::vector<uint32_t> words(1000);
  for (size_t i = 0; i < words.size(); ++i) words[i] = portable::Hash32(static_cast<uint32_t>(i));
  for (uint64_t first : {uint64_t{0}, uint64_t{5}, (uint64_t{1} << 31) - 300,
                         (uint64_t{1} << 32) - 7, uint64_t{1} << 40}) {
    for (uint64_t count : {0, 1, 7, 8, 9, 15, 16, 17, 999, 1000}) {
      uint64_t expected = 0;
      for (uint64_t i = 0; i < count; ++i) expected += portable::ChecksumTerm(words[i], first + i);
      ForEachTarget([&](Target target) {
        EXPECT_EQ(simd::ChecksumWords(words.data(), count, first), expected)
            << "first " << first << " count " << count << " on " << simd::TargetName(target);
      });
    }
  }
}

// The group quantizer straight from the per-element functions, for groups the codecs only reach
// past 2^32 elements (a group whose draws cross from one stream of 2^32 into the next).
TEST(SimdTest, GroupQuantizerDrawsAcrossTheTwoToThe32Boundary) {
  const uint32_t n = 200, padded = 256, bits = 2;
  const uint64_t first = (uint64_t{1} << 32) - 77, seed = 99;
  const std::vector<float> x = testing::Gaussian(n, 7);
  float lo = x[0], hi = x[0];
  for (float v : x) lo = std::min(lo, v), hi = std::max(hi, v);
  const quant_math::GroupParams p = quant_math::MakeGroupParams(lo, hi, bits);
  std::vector<uint32_t> expected(1 + padded * bits / 32, 0);
  expected[0] = p.packed;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t code = quant_math::Quantize(x[i], p, portable::UniformFloat(seed, first + i), 3);
    expected[1 + i / 16] |= code << (i % 16 * bits);
  }
  ForEachTarget([&](Target target) {
    if (target == Target::kScalar) return;  // the kernels are the vector targets
    std::vector<uint32_t> words(expected.size(), 0xdeadbeef);
    simd::QuantTotals totals;
simd::QuantizeGroups(elements::kF32, x.data(), nullptr, n, padded, padded, bits, seed, first,
                         words.data(), 0, 1, &totals);
    EXPECT_EQ(words, expected) << simd::TargetName(target);
    EXPECT_EQ(totals.checksum, simd::ChecksumWords(expected.data(), expected.size(), 0));
  });
}

}  // namespace
}  // namespace actpack::codecs

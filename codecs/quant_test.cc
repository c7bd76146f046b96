#include "codecs/quant.h"

#include <cmath>
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
using testing::Gaussian;

CodecParams Quant(int bits, int group = 256, uint64_t seed = 1) {
  CodecParams p;
  p.codec = CodecId::kQuant;
  p.bits = bits;
  p.group_size = group;
  p.seed = seed;
  return p;
}

class QuantBitsTest : public ::testing::TestWithParam<int> {};

// Every decoded value lies within one step of its input: step <= range / levels, rounded up
// to bfloat16 (at most 2^-7 relative), with the minimum rounded down by at most as much.
TEST_P(QuantBitsTest, ErrorWithinOneStepOfTheGroupRange) {
  const int bits = GetParam();
  const std::vector<float> x = Gaussian(10000, 7);  // not a multiple of 256
  const std::vector<float> y = DecodeFloats(*EncodeFloats(x, {10000}, Quant(bits)), {10000});
  const float levels = static_cast<float>((1 << bits) - 1);
  for (size_t g = 0; g * 256 < x.size(); ++g) {
    float lo = x[g * 256], hi = lo;
    for (size_t i = g * 256; i < std::min(x.size(), g * 256 + 256); ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    const float bound = (hi - lo) / levels * 1.02f + std::abs(lo) * 0.008f;
    for (size_t i = g * 256; i < std::min(x.size(), g * 256 + 256); ++i) {
      ASSERT_LE(std::abs(y[i] - x[i]), bound) << "bits " << bits << " i " << i;
    }
  }
}

// Stochastic rounding is unbiased: over many seeds the mean decoded value converges to the
// input, far closer than one quantization step.
TEST_P(QuantBitsTest, StochasticRoundingIsUnbiased) {
  const int bits = GetParam();
  const std::vector<float> x = Gaussian(512, 11);
  std::vector<double> mean(x.size(), 0.0);
  const int draws = 2000;
  for (int seed = 0; seed < draws; ++seed) {
    const std::vector<float> y = DecodeFloats(*EncodeFloats(x, {512}, Quant(bits, 256, seed)), {512});
    for (size_t i = 0; i < x.size(); ++i) mean[i] += y[i];
  }
  double worst_bias = 0, step = 0;
  for (size_t g = 0; g < 2; ++g) {
    float lo = x[g * 256], hi = lo;
    for (size_t i = g * 256; i < g * 256 + 256; ++i) {
      lo = std::min(lo, x[i]);
      hi = std::max(hi, x[i]);
    }
    step = std::max<double>(step, (hi - lo) / ((1 << bits) - 1));
  }
  double mean_bias = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double bias = mean[i] / draws - x[i];
    worst_bias = std::max(worst_bias, std::abs(bias));
    mean_bias += bias;
  }
  mean_bias /= x.size();
  // One draw's error has standard deviation <= step / 2; the mean of 2000 draws <= step / 89.
  // 5 sigma for the worst element, and the average over elements much tighter still.
  EXPECT_LT(worst_bias, 5.0 * step / 2 / std::sqrt(draws) * 1.2) << "bits " << bits;
  EXPECT_LT(std::abs(mean_bias), 5.0 * step / 2 / std::sqrt(draws * 512.0)) << "bits " << bits;
}

INSTANTIATE_TEST_SUITE_P(Bits, QuantBitsTest, ::testing::Values(1, 2, 4, 8));

TEST(QuantTest, TwoBitsCompressFloat32MoreThanFifteenTimes) {
  const std::vector<float> x = Gaussian(1 << 20, 3);
  const std::vector<uint8_t> buffer = *EncodeFloats(x, {1024, 1024}, Quant(2));
  const double ratio = 4.0 * x.size() / buffer.size();
  EXPECT_GT(ratio, 15.0);
  EXPECT_LT(ratio, 15.1);  // 32 / (2 + 32/256) = 15.06
}

TEST(QuantTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::vector<float> x = Gaussian(4096, 5);
  EXPECT_EQ(*EncodeFloats(x, {4096}, Quant(2, 256, 9)), *EncodeFloats(x, {4096}, Quant(2, 256, 9)));
  EXPECT_NE(*EncodeFloats(x, {4096}, Quant(2, 256, 9)), *EncodeFloats(x, {4096}, Quant(2, 256, 10)));
}

TEST(QuantTest, ConstantGroupsDecodeExactly) {
  std::vector<float> x(1000, 0.0f);
  for (size_t i = 500; i < x.size(); ++i) x[i] = 0.375f;  // representable in bf16
  EXPECT_EQ(DecodeFloats(*EncodeFloats(x, {1000}, Quant(2)), {1000}), x);
}

TEST(QuantTest, ConstantNonBf16GroupStaysUnbiased) {
  std::vector<float> x(256, 0.1f);  // 0.1 is not a bfloat16
  double sum = 0;
  for (int seed = 0; seed < 200; ++seed) {
    for (float y : DecodeFloats(*EncodeFloats(x, {256}, Quant(2, 256, seed)), {256})) sum += y;
  }
  EXPECT_NEAR(sum / (200 * 256), 0.1, 1e-5);
}

TEST(QuantTest, EmptyAndScalarTensors) {
  EXPECT_TRUE(DecodeFloats(*EncodeFloats({}, {0, 5}, Quant(2)), {0, 5}).empty());
  const std::vector<float> y = DecodeFloats(*EncodeFloats({3.5f}, {}, Quant(2)), {});
  ASSERT_EQ(y.size(), 1u);
  EXPECT_EQ(y[0], 3.5f);
}

TEST(QuantTest, GroupSizesThatAreNotDivisors) {
  for (int group : {32, 96, 256, 1024}) {
    const std::vector<float> x = Gaussian(1001, group);
    const std::vector<float> y = DecodeFloats(*EncodeFloats(x, {7, 143}, Quant(4, group)), {7, 143});
    double max_err = 0;
    for (size_t i = 0; i < x.size(); ++i) max_err = std::max<double>(max_err, std::abs(y[i] - x[i]));
    EXPECT_LT(max_err, 0.7) << "group " << group;  // 4 bits over a Gaussian's range
  }
}

TEST(QuantTest, NonFiniteValuesAreRefusedNotMangled) {
  std::vector<float> x = Gaussian(600, 1);
  x[17] = std::numeric_limits<float>::infinity();
  x[300] = std::nanf("");
  const absl::StatusOr<std::vector<uint8_t>> encoded = EncodeFloats(x, {600}, Quant(2));
  ASSERT_EQ(encoded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(encoded.status().message().find("2 non-finite"), absl::string_view::npos);
}

TEST(QuantTest, HalfAndBfloat16Inputs) {
  const std::vector<float> x = Gaussian(2048, 8);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> in(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      in[i] = dtype == DType::kFloat16 ? portable::FloatToHalf(x[i]) : portable::FloatToBf16(x[i]);
    }
    TensorView input{in.data(), dtype, {2048}, Device::kCpu};
    const CodecParams params = Quant(8);
    std::vector<uint8_t> buffer(*MaxEncodedSize(input.Spec(), params));
    ASSERT_TRUE(Encode(input, params, buffer.data(), buffer.size(), {}).ok());
    std::vector<uint16_t> out(x.size());
    MutableTensorView output{out.data(), dtype, {2048}, Device::kCpu};
    ASSERT_TRUE(Decode(buffer.data(), buffer.size(), output, {}).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      const float a = dtype == DType::kFloat16 ? portable::HalfToFloat(in[i]) : portable::Bf16ToFloat(in[i]);
      const float b = dtype == DType::kFloat16 ? portable::HalfToFloat(out[i]) : portable::Bf16ToFloat(out[i]);
      ASSERT_NEAR(a, b, 0.05f) << DTypeName(dtype) << " i " << i;
    }
  }
}

// The kernels' draws of group after group (portable::GroupDraws, a stream's key hashed once)
// are each group's own UniformDraws, across 2^32-element streams and a group straddling two.
TEST(QuantTest, GroupDrawsAreEachGroupsOwnAcrossStreams) {
  constexpr uint64_t kStream = uint64_t{1} << 32;
  for (const uint64_t seed : {uint64_t{0}, uint64_t{12345}}) {
    portable::GroupDraws groups(seed);
    for (const uint64_t first : {uint64_t{0}, uint64_t{256}, kStream - 256, kStream - 100,
                                 kStream + 7, 2 * kStream + 1, 3 * kStream - 128}) {
      const uint64_t last = first + 256;
      const portable::UniformDraws kernel = groups.Of(first, last);
      const portable::UniformDraws own(seed, first, last);
      ASSERT_EQ(kernel.one_key, own.one_key) << first;
      ASSERT_EQ(kernel.hashed_key, own.hashed_key) << first;
      for (uint64_t i = first; i < last; ++i) {
        ASSERT_EQ(portable::FloatBits(kernel(i)), portable::FloatBits(own(i))) << first << " " << i;
        ASSERT_EQ(portable::FloatBits(own(i)), portable::FloatBits(portable::UniformFloat(seed, i)));
      }
    }
  }
}

TEST(QuantTest, RejectsUnsupportedDtypeAndParams) {
  std::vector<int32_t> ints(10);
  TensorView input{ints.data(), DType::kInt32, {10}, Device::kCpu};
  const absl::StatusOr<size_t> size = MaxEncodedSize(input.Spec(), Quant(2));
  EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(size.status().message().find("int32"), absl::string_view::npos);
  TensorView floats{nullptr, DType::kFloat32, {10}, Device::kCpu};
  EXPECT_EQ(MaxEncodedSize(floats.Spec(), Quant(3)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MaxEncodedSize(floats.Spec(), Quant(2, 100)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace actpack::codecs

#include "codecs/pool.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codecs/codec.h"
#include "codecs/internal/portable.h"
#include "codecs/testing/test_util.h"
#include "codecs/registry.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

absl::StatusOr<std::vector<uint8_t>> EncodeRaw(const void* data, DType dtype,
                                               std::vector<int64_t> shape, const char* spec) {
  return testing::EncodeToVector(data, dtype, std::move(shape), *ParseCodecSpec(spec));
}

std::vector<float> Gaussian(size_t n, uint32_t seed) { return testing::Gaussian(n, seed, 1.0f, 3.0f); }

// Each decoded value is its window's mean (computed here in double), for row lengths that are
// not multiples of k.
TEST(PoolTest, DecodesToTheWindowMean) {
  for (const char* spec : {"pool2", "pool4", "pool:k=7", "pool64"}) {
    const int k = ParseCodecSpec(spec)->pool_window;
    for (int64_t last : {1, 5, 64, 100}) {
      const std::vector<int64_t> shape = {3, last};
      const std::vector<float> x = Gaussian(3 * last, static_cast<uint32_t>(last));
      absl::StatusOr<std::vector<uint8_t>> buffer =
          EncodeRaw(x.data(), DType::kFloat32, shape, spec);
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      const uint64_t means = 3 * ((last + k - 1) / k);
      EXPECT_EQ(buffer->size(), kHeaderSize + 4 * means);
      std::vector<float> y(x.size());
      MutableTensorView output{y.data(), DType::kFloat32, shape, Device::kCpu};
      ASSERT_TRUE(Decode(buffer->data(), buffer->size(), output, {}).ok());
      for (int64_t r = 0; r < 3; ++r) {
        for (int64_t start = 0; start < last; start += k) {
          const int64_t end = std::min<int64_t>(start + k, last);
          double mean = 0;
          for (int64_t c = start; c < end; ++c) mean += x[r * last + c];
          mean /= static_cast<double>(end - start);
          for (int64_t c = start; c < end; ++c) {
            ASSERT_NEAR(y[r * last + c], mean, 1e-5 * (1 + std::abs(mean)))
                << spec << " last " << last << " r " << r << " c " << c;
          }
        }
      }
    }
  }
}

TEST(PoolTest, HalfTypesStoreTheMeanInTheirOwnType) {
  // A constant row pools to itself exactly; a ramp to its window means rounded to the type.
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> x(2 * 9);
    for (size_t i = 0; i < x.size(); ++i) {
      const float v = static_cast<float>(i % 9);
      x[i] = dtype == DType::kFloat16 ? portable::FloatToHalf(v) : portable::FloatToBf16(v);
    }
    absl::StatusOr<std::vector<uint8_t>> buffer = EncodeRaw(x.data(), dtype, {2, 9}, "pool4");
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_EQ(buffer->size(), kHeaderSize + 12);  // 6 means of 2 bytes
    std::vector<uint16_t> y(x.size());
    MutableTensorView output{y.data(), dtype, {2, 9}, Device::kCpu};
    ASSERT_TRUE(Decode(buffer->data(), buffer->size(), output, {}).ok());
    const float expected[9] = {1.5f, 1.5f, 1.5f, 1.5f, 5.5f, 5.5f, 5.5f, 5.5f, 8.0f};
    for (size_t i = 0; i < y.size(); ++i) {
      const float got = dtype == DType::kFloat16 ? portable::HalfToFloat(y[i])
                                                 : portable::Bf16ToFloat(y[i]);
      EXPECT_EQ(got, expected[i % 9]) << DTypeName(dtype) << " " << i;
    }
  }
}

TEST(PoolTest, EmptyAndScalar) {
  absl::StatusOr<std::vector<uint8_t>> empty = EncodeRaw(nullptr, DType::kFloat32, {4, 0}, "pool4");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), kHeaderSize);
  MutableTensorView none{nullptr, DType::kFloat32, {4, 0}, Device::kCpu};
  EXPECT_TRUE(Decode(empty->data(), empty->size(), none, {}).ok());
  const float scalar = 2.25f;
  absl::StatusOr<std::vector<uint8_t>> one = EncodeRaw(&scalar, DType::kFloat32, {}, "pool4");
  ASSERT_TRUE(one.ok());
  float y = 0;
  MutableTensorView output{&y, DType::kFloat32, {}, Device::kCpu};
  ASSERT_TRUE(Decode(one->data(), one->size(), output, {}).ok());
  EXPECT_EQ(y, 2.25f);
}

TEST(PoolTest, RefusesNonFiniteValuesAndOverflowingSums) {
  for (float bad : {std::nanf(""), INFINITY}) {
    std::vector<float> x(10, 1.0f);
    x[6] = bad;
    EXPECT_EQ(EncodeRaw(x.data(), DType::kFloat32, {10}, "pool4").status().code(),
              absl::StatusCode::kFailedPrecondition);
  }
  const std::vector<float> big = {3e38f, 3e38f};
  EXPECT_EQ(EncodeRaw(big.data(), DType::kFloat32, {2}, "pool2").status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(PoolTest, RefusesBadWindowsAndDtypes) {
  const std::vector<float> x(8, 1.0f);
  for (const char* bad : {"pool1", "pool65", "pool:k=0"}) {
    EXPECT_EQ(ParseCodecSpec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  const std::vector<int32_t> ints(8);
  EXPECT_EQ(EncodeRaw(ints.data(), DType::kInt32, {8}, "pool4").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace actpack::codecs

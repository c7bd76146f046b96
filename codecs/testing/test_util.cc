#include "codecs/testing/test_util.h"

#include <cmath>
#include <random>

#include "gtest/gtest.h"

namespace actpack::codecs::testing {

absl::StatusOr<std::vector<uint8_t>> EncodeToVector(const void* data, DType dtype,
                                                    std::vector<int64_t> shape,
                                                    const CodecParams& params) {
  const TensorView input{data, dtype, std::move(shape), Device::kCpu};
  absl::StatusOr<size_t> max_size = MaxEncodedSize(input.Spec(), params);
  if (!max_size.ok()) return max_size.status();
  std::vector<uint8_t> buffer(*max_size);
  absl::StatusOr<size_t> used = Encode(input, params, buffer.data(), buffer.size(), {});
  if (!used.ok()) return used.status();
  buffer.resize(*used);
  return buffer;
}

absl::StatusOr<std::vector<uint8_t>> EncodeFloats(const std::vector<float>& values,
                                                  std::vector<int64_t> shape,
                                                  const CodecParams& params) {
  return EncodeToVector(values.data(), DType::kFloat32, std::move(shape), params);
}

std::vector<float> DecodeFloats(const std::vector<uint8_t>& buffer, std::vector<int64_t> shape) {
  std::vector<float> out(TensorSpec{DType::kFloat32, shape}.numel(), std::nanf(""));
  const MutableTensorView output{out.data(), DType::kFloat32, std::move(shape), Device::kCpu};
  const absl::Status status = Decode(buffer.data(), buffer.size(), output, {});
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

std::vector<float> Gaussian(size_t n, uint32_t seed, float mean, float stddev) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

}  // namespace actpack::codecs::testing

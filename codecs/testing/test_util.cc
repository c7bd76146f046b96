#include "codecs/testing/test_util.h"

#include <cmath>
#include <cstring>
#include <random>

#include "codecs/internal/portable.h"

#include "gtest/gtest.h"

namespace actpack::codecs::testing {

absl::StatusOr<std::vector<uint8_t>> EncodeToVector(const void* data, DType dtype,
                                                    std::vector<int64_t> shape,
                                                    const CodecParams& params) {
  const TensorView input{data, dtype, std::move(shape), Device::kCpu};
  absl::StatusOr<size_t> max_size = MaxEncodedSize(input.Spec(), params);
  if (!max_size.ok()) return max_size.status();
  // Not zeroed: an encoder must write every byte it returns (callers reuse buffers).
  std::vector<uint8_t> buffer(*max_size, 0xa5);
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

std::vector<uint8_t> ToBytes(const std::vector<float>& values, DType dtype) {
  std::vector<uint8_t> bytes(values.size() * ElementSize(dtype));
  for (size_t i = 0; i < values.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(bytes.data() + 4 * i, &values[i], 4);
    } else {
      const uint16_t bits = dtype == DType::kFloat16 ? portable::FloatToHalf(values[i])
                                                     : portable::FloatToBf16(values[i]);
      std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
  }
  return bytes;
}

std::vector<float> ToFloats(const std::vector<uint8_t>& bytes, DType dtype) {
  const size_t n = bytes.size() / ElementSize(dtype);
  std::vector<float> values(n);
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(&values[i], bytes.data() + 4 * i, 4);
    } else {
      uint16_t bits;
      std::memcpy(&bits, bytes.data() + 2 * i, 2);
      values[i] = dtype == DType::kFloat16 ? portable::HalfToFloat(bits)
                                           : portable::Bf16ToFloat(bits);
    }
  }
  return values;
}

}  // namespace actpack::codecs::testing

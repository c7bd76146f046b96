#include "codecs/mask.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "codecs/codec.h"
#include "codecs/registry.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

// Encodes `values` (raw element bytes of `dtype`) with mask and decodes the result.
absl::StatusOr<std::vector<uint8_t>> RoundTrip(const std::vector<uint8_t>& values, DType dtype,
                                               std::vector<int64_t> shape,
                                               size_t* encoded_size = nullptr) {
  TensorView input{values.data(), dtype, shape, Device::kCpu};
  const CodecParams params = *ParseCodecSpec("mask");
  absl::StatusOr<size_t> max_size = MaxEncodedSize(input.Spec(), params);
  if (!max_size.ok()) return max_size.status();
  std::vector<uint8_t> buffer(*max_size);
  absl::StatusOr<size_t> used = Encode(input, params, buffer.data(), buffer.size(), {});
  if (!used.ok()) return used.status();
  if (encoded_size != nullptr) *encoded_size = *used;
  std::vector<uint8_t> out(values.size(), 0xab);
  MutableTensorView output{out.data(), dtype, shape, Device::kCpu};
  absl::Status status = Decode(buffer.data(), *used, output, {});
  if (!status.ok()) return status;
  return out;
}

template <typename T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

TEST(MaskTest, DropoutMaskRoundTripsExactly) {
  std::mt19937 rng(3);
  for (size_t n : {1u, 31u, 32u, 33u, 1000u, 70001u}) {
    std::vector<float> x(n);
    for (float& v : x) v = (rng() % 10 < 3) ? 0.0f : 1.0f / 0.7f;
    const std::vector<uint8_t> in = Bytes(x);
    size_t size = 0;
    absl::StatusOr<std::vector<uint8_t>> out =
        RoundTrip(in, DType::kFloat32, {static_cast<int64_t>(n)}, &size);
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, in) << n;
    EXPECT_EQ(size, kHeaderSize + 4 * ((n + 31) / 32));
  }
}

TEST(MaskTest, EveryDtype) {
  std::mt19937 rng(5);
  const size_t n = 77;
  struct Case {
    DType dtype;
    size_t width;
    uint32_t value;
  };
  for (const Case& c : {Case{DType::kFloat32, 4, 0x3fa00000u}, Case{DType::kFloat16, 2, 0x3c00u},
                        Case{DType::kBFloat16, 2, 0xbf80u}, Case{DType::kBool, 1, 1u},
                        Case{DType::kUInt8, 1, 200u}, Case{DType::kFloat32, 4, 0x80000000u}}) {
    std::vector<uint8_t> in(n * c.width, 0);
    for (size_t i = 0; i < n; ++i) {
      if (rng() % 2) std::memcpy(in.data() + i * c.width, &c.value, c.width);
    }
    absl::StatusOr<std::vector<uint8_t>> out = RoundTrip(in, c.dtype, {7, 11});
    ASSERT_TRUE(out.ok()) << out.status() << " " << DTypeName(c.dtype);
    EXPECT_EQ(*out, in) << DTypeName(c.dtype);
  }
}

TEST(MaskTest, AllZeroEmptyAndScalar) {
  const std::vector<uint8_t> zeros(4 * 40, 0);
  EXPECT_EQ(*RoundTrip(zeros, DType::kFloat32, {40}), zeros);
  EXPECT_TRUE(RoundTrip({}, DType::kFloat32, {3, 0})->empty());
  const std::vector<uint8_t> scalar = Bytes(std::vector<float>{2.5f});
  EXPECT_EQ(*RoundTrip(scalar, DType::kFloat32, {}), scalar);
  const std::vector<uint8_t> infinity = Bytes(std::vector<float>{0.0f, INFINITY, INFINITY});
  EXPECT_EQ(*RoundTrip(infinity, DType::kFloat32, {3}), infinity);
}

TEST(MaskTest, RefusesTwoValuesAndNaN) {
  for (const std::vector<float>& x :
       {std::vector<float>{0.0f, 1.0f, 2.0f}, std::vector<float>{1.0f, -1.0f},
        std::vector<float>{0.0f, -0.0f, 1.0f}, std::vector<float>{0.0f, std::nanf("")}}) {
    const absl::StatusOr<std::vector<uint8_t>> r = RoundTrip(Bytes(x), DType::kFloat32,
                                                             {static_cast<int64_t>(x.size())});
    EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  }
}

TEST(MaskTest, RefusesOtherDtypes) {
  const std::vector<uint8_t> in(8 * 4, 0);
  EXPECT_EQ(RoundTrip(in, DType::kInt64, {4}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(MaskTest, CorruptValueIsDataLoss) {
  // A bool mask whose value is rewritten to 2 (not a bool), with a recomputed checksum.
  const std::vector<uint8_t> in = {1, 0, 1, 1};
  TensorView input{in.data(), DType::kBool, {4}, Device::kCpu};
  const CodecParams params = *ParseCodecSpec("mask");
  std::vector<uint8_t> buffer(*MaxEncodedSize(input.Spec(), params));
  ASSERT_TRUE(Encode(input, params, buffer.data(), buffer.size(), {}).ok());
  absl::StatusOr<Header> header = ParseHeader(buffer.data(), buffer.size());
  ASSERT_TRUE(header.ok());
  header->params[0] = 2;
  header->checksum = CombineChecksum(HeaderChecksum(*header),
                                     PayloadChecksum(buffer.data() + kHeaderSize,
                                                     header->payload_size));
  WriteHeader(*header, buffer.data());
  std::vector<uint8_t> out(4);
  MutableTensorView output{out.data(), DType::kBool, {4}, Device::kCpu};
  EXPECT_EQ(Decode(buffer.data(), buffer.size(), output, {}).code(), absl::StatusCode::kDataLoss);
}

TEST(MaskTest, BoolTensorHoldingAByteOtherThanOneIsRefused) {
  const std::vector<uint8_t> bytes = {0, 2, 0, 2};  // what u8.view(torch.bool) can hold
  const TensorView input{bytes.data(), DType::kBool, {4}, Device::kCpu};
  const CodecParams params = *ParseCodecSpec("mask");
  std::vector<uint8_t> buffer(*MaxEncodedSize(input.Spec(), params));
  EXPECT_EQ(Encode(input, params, buffer.data(), buffer.size(), {}).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace actpack::codecs

#include "codecs/format.h"

#include <vector>

#include "codecs/codec.h"
#include "codecs/registry.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

std::vector<uint8_t> EncodeRamp(const char* spec, std::vector<int64_t> shape) {
  TensorView input;
  input.dtype = DType::kFloat32;
  input.shape = shape;
  static std::vector<float> values;
  values.assign(input.Spec().numel(), 0.0f);
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * static_cast<float>(i % 97) - 0.3f;
  input.data = values.data();
  const CodecParams params = *ParseCodecSpec(spec);
  std::vector<uint8_t> buffer(*MaxEncodedSize(input.Spec(), params));
  absl::StatusOr<size_t> used = Encode(input, params, buffer.data(), buffer.size(), {});
  EXPECT_TRUE(used.ok()) << used.status();
  buffer.resize(*used);
  return buffer;
}

TEST(FormatTest, HeaderRoundTrips) {
  absl::StatusOr<Header> header = MakeHeader(CodecId::kQuant, DType::kBFloat16, {3, 5, 7});
  ASSERT_TRUE(header.ok());
  header->params[0] = 2;
  header->payload_size = 40;
  header->checksum = 0x1234;
  std::vector<uint8_t> bytes(kHeaderSize + 40);
  WriteHeader(*header, bytes.data());
  absl::StatusOr<Header> parsed = ParseHeader(bytes.data(), bytes.size());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->codec, CodecId::kQuant);
  EXPECT_EQ(parsed->dtype, DType::kBFloat16);
  EXPECT_EQ(parsed->Shape(), (std::vector<int64_t>{3, 5, 7}));
  EXPECT_EQ(parsed->numel, 105u);
  EXPECT_EQ(parsed->params[0], 2);
  EXPECT_EQ(parsed->checksum, 0x1234u);
}

TEST(FormatTest, RejectsTooManyDimsAndNegativeDims) {
  EXPECT_EQ(MakeHeader(CodecId::kQuant, DType::kFloat32, {1, 1, 1, 1, 1, 1, 1, 1, 1})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(MakeHeader(CodecId::kQuant, DType::kFloat32, {4, -1}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(FormatTest, MessagesNameTheProblem) {
  std::vector<uint8_t> buffer = EncodeRamp("quant2", {256});
  std::vector<float> out(256);
  MutableTensorView output{out.data(), DType::kFloat32, {256}, Device::kCpu};
  buffer[0] = 'X';
  EXPECT_NE(Decode(buffer.data(), buffer.size(), output, {}).message().find("magic"),
            absl::string_view::npos);
  buffer = EncodeRamp("quant2", {256});
  buffer[4] = 9;  // version
  EXPECT_NE(Decode(buffer.data(), buffer.size(), output, {}).message().find("version 9"),
            absl::string_view::npos);
  buffer = EncodeRamp("quant2", {256});
  buffer.back() ^= 1;
  EXPECT_NE(Decode(buffer.data(), buffer.size(), output, {}).message().find("checksum"),
            absl::string_view::npos);
  buffer = EncodeRamp("quant2", {256});
  EXPECT_NE(Decode(buffer.data(), 100, output, {}).message().find("truncated"),
            absl::string_view::npos);
}

TEST(FormatTest, DecodeChecksOutputShapeAndDtype) {
  const std::vector<uint8_t> buffer = EncodeRamp("quant2", {4, 64});
  std::vector<float> out(256);
  MutableTensorView wrong_shape{out.data(), DType::kFloat32, {64, 4}, Device::kCpu};
  EXPECT_EQ(Decode(buffer.data(), buffer.size(), wrong_shape, {}).code(),
            absl::StatusCode::kInvalidArgument);
  MutableTensorView wrong_dtype{out.data(), DType::kFloat16, {4, 64}, Device::kCpu};
  EXPECT_EQ(Decode(buffer.data(), buffer.size(), wrong_dtype, {}).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace actpack::codecs

#include "codecs/bitpack.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <type_traits>
#include <vector>

#include "codecs/codec.h"
#include "codecs/format.h"
#include "codecs/registry.h"
#include "codecs/testing/test_util.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

using testing::EncodeToVector;

CodecParams Bitpack() { return *ParseCodecSpec("bitpack"); }

template <typename T>
constexpr DType DTypeOf() {
  if constexpr (std::is_same_v<T, uint8_t>) return DType::kUInt8;
  if constexpr (std::is_same_v<T, int8_t>) return DType::kInt8;
  if constexpr (std::is_same_v<T, int16_t>) return DType::kInt16;
  if constexpr (std::is_same_v<T, int32_t>) return DType::kInt32;
  return DType::kInt64;
}

// Encodes `values` as a tensor of `shape` (1-D when not given).
template <typename T>
absl::StatusOr<std::vector<uint8_t>> EncodeValues(
    const std::vector<T>& values, std::optional<std::vector<int64_t>> shape = std::nullopt) {
  return EncodeToVector(values.data(), DTypeOf<T>(),
                        shape.value_or(std::vector<int64_t>{static_cast<int64_t>(values.size())}),
                        Bitpack());
}

// Decodes into an output poisoned with 0xA5 bytes, so an element the decoder does not write
// shows.
template <typename T>
absl::StatusOr<std::vector<T>> DecodeValues(const std::vector<uint8_t>& buffer,
                                            std::vector<int64_t> shape) {
  std::vector<T> out(TensorSpec{DTypeOf<T>(), shape}.numel());
  if (!out.empty()) std::memset(out.data(), 0xa5, out.size() * sizeof(T));
  const MutableTensorView output{out.data(), DTypeOf<T>(), std::move(shape), Device::kCpu};
  const absl::Status status = Decode(buffer.data(), buffer.size(), output, {});
  if (!status.ok()) return status;
  return out;
}

Header HeaderOf(const std::vector<uint8_t>& buffer) {
  absl::StatusOr<Header> header = ParseHeader(buffer.data(), buffer.size());
  EXPECT_TRUE(header.ok()) << header.status();
  return *header;
}

int64_t BaseOf(const Header& header) {
  int64_t base;
  std::memcpy(&base, header.params.data(), 8);
  return base;
}

// The payload FORMAT.md defines, written bit by bit: element i's offset from `base` at bits
// i * b .. i * b + b - 1 of a little-endian bit stream of 32-bit words, zero-padded.
template <typename T>
std::vector<uint8_t> NaivePayload(const std::vector<T>& values, int64_t base, int b) {
  const uint64_t bits = static_cast<uint64_t>(values.size()) * b;
  std::vector<uint8_t> bytes(4 * ((bits + 31) / 32), 0);
  for (size_t i = 0; i < values.size(); ++i) {
    const uint64_t d = static_cast<uint64_t>(static_cast<int64_t>(values[i])) -
                       static_cast<uint64_t>(base);
    for (int k = 0; k < b; ++k) {
      if ((d >> k) & 1) {
        const uint64_t at = i * b + k;
        bytes[at / 8] |= static_cast<uint8_t>(1u << (at % 8));
      }
    }
  }
  return bytes;
}

std::vector<uint8_t> PayloadOf(const std::vector<uint8_t>& buffer) {
  return {buffer.begin() + kHeaderSize, buffer.end()};
}

// Rewrites the header (fields changed by `edit`) with a checksum that matches again, so that
// the decoder's own checks are what must refuse it.
void Reseal(std::vector<uint8_t>* buffer, const std::function<void(Header*)>& edit) {
  Header header = HeaderOf(*buffer);
  edit(&header);
  buffer->resize(kHeaderSize + header.payload_size);
  header.checksum = CombineChecksum(
      HeaderChecksum(header), PayloadChecksum(buffer->data() + kHeaderSize, header.payload_size));
  WriteHeader(header, buffer->data());
}

template <typename T>
void ExpectRoundTrip(const std::vector<T>& values,
                     std::optional<std::vector<int64_t>> shape_or = std::nullopt) {
  const std::vector<int64_t> shape =
      shape_or.value_or(std::vector<int64_t>{static_cast<int64_t>(values.size())});
  absl::StatusOr<std::vector<uint8_t>> buffer = EncodeValues(values, shape);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  absl::StatusOr<std::vector<T>> out = DecodeValues<T>(*buffer, shape);
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_EQ(*out, values) << DTypeName(DTypeOf<T>()) << " x " << values.size();
}

template <typename T>
std::vector<T> RandomValues(size_t n, uint32_t seed, int64_t lo, int64_t hi) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(dist(rng));
  return v;
}

template <typename T>
void RoundTripsEveryShapeAndRange() {
  const int64_t lowest = std::numeric_limits<T>::min(), highest = std::numeric_limits<T>::max();
  for (size_t n : {size_t{1}, size_t{2}, size_t{31}, size_t{32}, size_t{33}, size_t{95},
                   size_t{1000}, size_t{70001}}) {
    SCOPED_TRACE(n);
    ExpectRoundTrip(RandomValues<T>(n, 1, lowest, highest));  // the whole range
    ExpectRoundTrip(RandomValues<T>(n, 2, 0, 5));
    ExpectRoundTrip(RandomValues<T>(n, 3, std::max<int64_t>(lowest, -3), 3));  // negatives
    ExpectRoundTrip(RandomValues<T>(n, 4, highest - 9, highest));              // the top
    ExpectRoundTrip(RandomValues<T>(n, 5, lowest, lowest + 9));                // the bottom
    std::vector<T> extremes = RandomValues<T>(n, 6, lowest / 2, highest / 2);
    extremes[0] = static_cast<T>(lowest);
    extremes[n - 1] = static_cast<T>(highest);
    ExpectRoundTrip(extremes);
  }
}

TEST(BitpackTest, RoundTripsEveryDtypeExactly) {
  RoundTripsEveryShapeAndRange<uint8_t>();
  RoundTripsEveryShapeAndRange<int8_t>();
  RoundTripsEveryShapeAndRange<int16_t>();
  RoundTripsEveryShapeAndRange<int32_t>();
  RoundTripsEveryShapeAndRange<int64_t>();
}

TEST(BitpackTest, EmptyScalarAndMultiDimensional) {
  ExpectRoundTrip(std::vector<int64_t>{}, std::vector<int64_t>{0});
  ExpectRoundTrip(std::vector<int64_t>{}, std::vector<int64_t>{3, 0, 5});
  ExpectRoundTrip(std::vector<int64_t>{-42}, std::vector<int64_t>{1});
  absl::StatusOr<std::vector<uint8_t>> scalar =
      EncodeValues(std::vector<int32_t>{-7}, std::vector<int64_t>{});
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(HeaderOf(*scalar).ndim, 0);
  EXPECT_EQ(*DecodeValues<int32_t>(*scalar, {}), std::vector<int32_t>{-7});
  ExpectRoundTrip(RandomValues<int64_t>(2 * 3 * 17 * 19, 8, -100, 5000),
                  std::vector<int64_t>{2, 3, 17, 19});
  // An empty tensor stores no payload and b = 0.
  absl::StatusOr<std::vector<uint8_t>> empty =
      EncodeValues(std::vector<int16_t>{}, std::vector<int64_t>{4, 0});
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->size(), kHeaderSize);
  EXPECT_EQ(HeaderOf(*empty).params[8], 0);
}

TEST(BitpackTest, FullInt64RangeTakesSixtyFourBits) {
  std::vector<int64_t> values = RandomValues<int64_t>(100, 9, -1000, 1000);
  values[3] = std::numeric_limits<int64_t>::min();
  values[97] = std::numeric_limits<int64_t>::max();
  absl::StatusOr<std::vector<uint8_t>> buffer = EncodeValues(values);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const Header header = HeaderOf(*buffer);
  EXPECT_EQ(header.params[8], 64);
  EXPECT_EQ(BaseOf(header), std::numeric_limits<int64_t>::min());
  EXPECT_EQ(header.payload_size, 100u * 8);
  EXPECT_EQ(PayloadOf(*buffer), NaivePayload(values, BaseOf(header), 64));
  EXPECT_EQ(*DecodeValues<int64_t>(*buffer, {100}), values);
}

TEST(BitpackTest, AllEqualValuesTakeZeroBitsAndNoPayload) {
  for (int64_t value : {int64_t{0}, int64_t{-7}, int64_t{1} << 40,
                        std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()}) {
    const std::vector<int64_t> values(77, value);
    absl::StatusOr<std::vector<uint8_t>> buffer = EncodeValues(values);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    EXPECT_EQ(buffer->size(), kHeaderSize) << value;
    EXPECT_EQ(HeaderOf(*buffer).params[8], 0);
    EXPECT_EQ(BaseOf(HeaderOf(*buffer)), value);
    EXPECT_EQ(*DecodeValues<int64_t>(*buffer, {77}), values) << value;
  }
  const std::vector<uint8_t> bytes(40, 255);
  ExpectRoundTrip(bytes);
}

// The payload is the format's bit stream for every width 1..64 and element counts on and off
// group boundaries (a wrong shift, a group that starts one word off, a dropped last word all
// change these bytes).
TEST(BitpackTest, PayloadIsTheBitStreamForEveryWidth) {
  for (int b = 1; b <= 64; ++b) {
    const int64_t lo = b == 64 ? std::numeric_limits<int64_t>::min() : -5;
    const int64_t hi = b == 64 ? std::numeric_limits<int64_t>::max()
                               : static_cast<int64_t>(static_cast<uint64_t>(lo) +
                                                      ((uint64_t{1} << (b - 1)) | 1));
    for (size_t n : {size_t{1}, size_t{31}, size_t{32}, size_t{33}, size_t{64}, size_t{100}}) {
      SCOPED_TRACE(::testing::Message() << "b = " << b << ", n = " << n);
      std::vector<int64_t> values = RandomValues<int64_t>(n, 10 + b, lo, hi);
      values[0] = hi;  // width exactly b
      values[n / 2] = lo;
      if (n == 1) values[0] = lo;
      const int expected_bits = n == 1 ? 0 : b;
      absl::StatusOr<std::vector<uint8_t>> buffer = EncodeValues(values);
      ASSERT_TRUE(buffer.ok()) << buffer.status();
      const Header header = HeaderOf(*buffer);
      ASSERT_EQ(header.params[8], expected_bits);
      ASSERT_EQ(BaseOf(header), lo);
      ASSERT_EQ(header.payload_size, 4 * ((n * expected_bits + 31) / 32));
      ASSERT_EQ(PayloadOf(*buffer), NaivePayload(values, lo, expected_bits));
      ASSERT_EQ(*DecodeValues<int64_t>(*buffer, {static_cast<int64_t>(n)}), values);
    }
  }
}

// Chunks of the parallel loops never show in the bytes: a tensor of many chunks gives the
// format's bit stream.
TEST(BitpackTest, LargeTensorIsTheBitStream) {
  const std::vector<int32_t> values = RandomValues<int32_t>((1 << 20) + 13, 11, -70000, 300000);
  absl::StatusOr<std::vector<uint8_t>> buffer = EncodeValues(values);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  const Header header = HeaderOf(*buffer);
  const int64_t lo = *std::min_element(values.begin(), values.end());
  const int64_t hi = *std::max_element(values.begin(), values.end());
  ASSERT_EQ(BaseOf(header), lo);
  ASSERT_EQ(header.params[8], 64 - __builtin_clzll(static_cast<uint64_t>(hi - lo)));
  EXPECT_TRUE(PayloadOf(*buffer) == NaivePayload(values, lo, header.params[8]));
  EXPECT_TRUE(*DecodeValues<int32_t>(*buffer, {static_cast<int64_t>(values.size())}) == values);
}

// max_pool2d's indices: values in [0, H * W), 10 bits for a 32 x 32 plane, 6.4x less than
// int64.
TEST(BitpackTest, MaxPoolIndicesTakeTenBitsEach) {
  const int64_t n = 64 * 16 * 16;
  std::vector<int64_t> indices(n);
  for (int64_t i = 0; i < n; ++i) indices[i] = (i * 37 + i / 7) % 1024;
  indices[5] = 1023;
  indices[6] = 0;
  absl::StatusOr<std::vector<uint8_t>> buffer =
      EncodeValues(indices, std::vector<int64_t>{64, 16, 16});
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(HeaderOf(*buffer).params[8], 10);
  EXPECT_EQ(buffer->size(), kHeaderSize + n * 10 / 8);
  EXPECT_EQ(static_cast<double>(n * 8) / (buffer->size() - kHeaderSize), 6.4);
  EXPECT_EQ(*DecodeValues<int64_t>(*buffer, {64, 16, 16}), indices);
}

// Where min + 2^b - 1 would leave the dtype, base is lowered so that every offset decodes to a
// value of the dtype.
TEST(BitpackTest, BaseIsLoweredAtTheTopOfTheDtype) {
  std::vector<int8_t> top;
  for (int v = 100; v <= 127; ++v) top.push_back(static_cast<int8_t>(v));
  absl::StatusOr<std::vector<uint8_t>> buffer = EncodeValues(top);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(HeaderOf(*buffer).params[8], 5);
  EXPECT_EQ(BaseOf(HeaderOf(*buffer)), 96);
  EXPECT_EQ(PayloadOf(*buffer), NaivePayload(top, 96, 5));
  EXPECT_EQ(*DecodeValues<int8_t>(*buffer, {28}), top);

  const std::vector<uint8_t> bytes = {250, 255, 251, 253};
  buffer = EncodeValues(bytes);
  ASSERT_TRUE(buffer.ok());
  EXPECT_EQ(HeaderOf(*buffer).params[8], 3);
  EXPECT_EQ(BaseOf(HeaderOf(*buffer)), 248);
  EXPECT_EQ(*DecodeValues<uint8_t>(*buffer, {4}), bytes);
}

TEST(BitpackTest, RefusesOtherDtypesNamingThem) {
  const std::vector<float> floats(8, 1.0f);
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kFloat64,
                      DType::kBool}) {
    const absl::StatusOr<size_t> size = MaxEncodedSize({dtype, {8}}, Bitpack());
    ASSERT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << DTypeName(dtype);
    EXPECT_NE(size.status().message().find(DTypeName(dtype)), absl::string_view::npos)
        << size.status();
  }
}

TEST(BitpackTest, SpecHasNoOptions) {
  EXPECT_EQ(ParseCodecSpec("bitpack")->codec, CodecId::kBitpack);
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("bitpack")), "bitpack");
  EXPECT_EQ(FindCodec(CodecId::kBitpack)->name(), "bitpack");
  for (const char* bad : {"bitpack4", "bitpack:bits=3", "bitpack:x=1"}) {
    EXPECT_EQ(ParseCodecSpec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

class BitpackCorruptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    values_ = RandomValues<int8_t>(70, 12, -20, 40);
    absl::StatusOr<std::vector<uint8_t>> buffer = EncodeValues(values_);
    ASSERT_TRUE(buffer.ok());
    buffer_ = *buffer;
    ASSERT_EQ(HeaderOf(buffer_).params[8], 6);
    ASSERT_TRUE(DecodeValues<int8_t>(buffer_, {70}).ok());
  }

  absl::StatusCode DecodeCode(const std::vector<uint8_t>& buffer) {
    return DecodeValues<int8_t>(buffer, {70}).status().code();
  }

  std::vector<int8_t> values_;
  std::vector<uint8_t> buffer_;
};

TEST_F(BitpackCorruptTest, WidthBeyondTheDtypeIsDataLoss) {
  // int8 from -128 with 9 bits (and 255), the payload sized as that width needs: only the
  // width is at fault.
  for (int bits : {9, 64, 255}) {
    std::vector<uint8_t> corrupt = buffer_;
    const uint64_t payload = 4 * ((70 * static_cast<uint64_t>(bits) + 31) / 32);
    corrupt.resize(kHeaderSize + payload, 0);
    Reseal(&corrupt, [&](Header* h) {
      const int64_t base = -128;
      std::memcpy(h->params.data(), &base, 8);
      h->params[8] = static_cast<uint8_t>(bits);
      h->payload_size = payload;
    });
    const absl::StatusOr<std::vector<int8_t>> out = DecodeValues<int8_t>(corrupt, {70});
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << bits;
    EXPECT_NE(out.status().message().find("bits per element"), absl::string_view::npos)
        << out.status();
  }
}

TEST_F(BitpackCorruptTest, BaseWhoseOffsetsLeaveTheDtypeIsDataLoss) {
  // 6 bits hold offsets up to 63: int8 bases from -128 to 127 - 63 = 64 decode within int8.
  for (int64_t base : {int64_t{-129}, int64_t{128}, int64_t{100}, int64_t{65},
                       std::numeric_limits<int64_t>::min()}) {
    std::vector<uint8_t> corrupt = buffer_;
    Reseal(&corrupt, [&](Header* h) { std::memcpy(h->params.data(), &base, 8); });
    EXPECT_EQ(DecodeCode(corrupt), absl::StatusCode::kDataLoss) << base;
  }
  for (int64_t base : {int64_t{-128}, int64_t{64}}) {
    std::vector<uint8_t> edge = buffer_;
    Reseal(&edge, [&](Header* h) { std::memcpy(h->params.data(), &base, 8); });
    EXPECT_TRUE(DecodeValues<int8_t>(edge, {70}).ok()) << base;
  }
}

TEST_F(BitpackCorruptTest, NonzeroUnusedParameterBytesAreDataLoss) {
  for (size_t byte : {size_t{9}, size_t{12}, size_t{23}}) {
    std::vector<uint8_t> corrupt = buffer_;
    Reseal(&corrupt, [&](Header* h) { h->params[byte] = 1; });
    const absl::StatusOr<std::vector<int8_t>> out = DecodeValues<int8_t>(corrupt, {70});
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << byte;
    EXPECT_NE(out.status().message().find("parameter byte"), absl::string_view::npos)
        << out.status();
  }
}

TEST_F(BitpackCorruptTest, WrongPayloadSizeIsDataLoss) {
  for (int64_t delta : {-4, 4, -1}) {
    std::vector<uint8_t> corrupt = buffer_;
    corrupt.resize(corrupt.size() + 8, 0);
    Reseal(&corrupt, [&](Header* h) { h->payload_size += delta; });
    const absl::StatusOr<std::vector<int8_t>> out = DecodeValues<int8_t>(corrupt, {70});
    EXPECT_EQ(out.status().code(), absl::StatusCode::kDataLoss) << delta;
    EXPECT_NE(out.status().message().find("payload"), absl::string_view::npos) << out.status();
  }
  // A width that does not match the payload: 7 bits with 6 bits' words.
  std::vector<uint8_t> corrupt = buffer_;
  Reseal(&corrupt, [](Header* h) { h->params[8] = 7; });
  EXPECT_EQ(DecodeCode(corrupt), absl::StatusCode::kDataLoss);
}

}  // namespace
}  // namespace actpack::codecs

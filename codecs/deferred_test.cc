// The deferred calls (deferred.h) on CUDA: the buffer EncodeDeferred writes is the CPU's,
// byte for byte, once the host has read its status; DecodeDeferred gives the CPU's output; data
// a codec cannot hold, and a buffer corrupted after its encode, decode as NaN (zeros for
// integer and bool tensors) with the reason in the status. Runs on a GPU, or on the CUDA
// emulator under --config=cudaemu.
#include "codecs/deferred.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "codecs/registry.h"
#include "codecs/testing/test_util.h"
#include "gtest/gtest.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#endif
#if defined(CUDAEMU)
#include "cudaemu/control.h"
#endif

namespace actpack::codecs {
namespace {

#if !ACTPACK_WITH_CUDA

TEST(DeferredTest, NeedsCuda) {
  GTEST_SKIP() << "built without CUDA (bazel test --config=cudaemu runs these on the emulator)";
}

#else

// Device memory for the length of a test, and host copies of it.
class DeviceMemory {
 public:
  ~DeviceMemory() {
    cudaDeviceSynchronize();
    for (void* p : live_) cudaFree(p);
  }
  uint8_t* Alloc(size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, bytes == 0 ? 1 : bytes), cudaSuccess);
    live_.push_back(p);
    return static_cast<uint8_t*>(p);
  }
  uint8_t* Upload(const std::vector<uint8_t>& host) {
    uint8_t* p = Alloc(host.size());
    EXPECT_EQ(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    return p;
  }
  static std::vector<uint8_t> Download(const void* p, size_t bytes) {
    std::vector<uint8_t> host(bytes);
    EXPECT_EQ(cudaMemcpy(host.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  std::vector<void*> live_;
};

struct Case {
  const char* spec;
  DType dtype;
};

std::vector<uint8_t> Data(DType dtype, size_t numel, uint32_t seed) {
  if (dtype == DType::kBool) {
    std::vector<uint8_t> bytes(numel);
    for (size_t i = 0; i < numel; ++i) bytes[i] = (i * 7 + seed) % 3 == 0;
    return bytes;
  }
  if (dtype == DType::kInt64) {
    std::vector<uint8_t> bytes(numel * 8);
    for (size_t i = 0; i < numel; ++i) {
      const int64_t v = static_cast<int64_t>((i * 2654435761u + seed) % 1000) - 300;
      std::memcpy(bytes.data() + 8 * i, &v, 8);
    }
    return bytes;
  }
  if (dtype == DType::kFloat64) {
    std::vector<uint8_t> bytes(numel * 8);
    const std::vector<float> g = testing::Gaussian(numel, seed);
    for (size_t i = 0; i < numel; ++i) {
      const double v = g[i];
      std::memcpy(bytes.data() + 8 * i, &v, 8);
    }
    return bytes;
  }
  return testing::ToBytes(testing::Gaussian(numel, seed), dtype);
}

// A CUDA context, device memory and a zeroed DeviceStatus for a test.
class OnDevice : public ::testing::Test {
 protected:
  void SetUp() override {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
      GTEST_SKIP() << "no CUDA device visible";
    }
    context_.device = Device::kCuda;
    status_ = reinterpret_cast<DeviceStatus*>(memory_.Alloc(sizeof(DeviceStatus)));
    ASSERT_EQ(cudaMemset(status_, 0, sizeof(DeviceStatus)), cudaSuccess);
  }

  DeviceStatus ReadStatus() const {
    DeviceStatus read;
    std::memcpy(&read, DeviceMemory::Download(status_, sizeof(read)).data(), sizeof(read));
    return read;
  }

  DeviceMemory memory_;
  ExecContext context_;
  DeviceStatus* status_ = nullptr;
};

class DeferredTest : public OnDevice, public ::testing::WithParamInterface<Case> {
 protected:
  // Encodes `input` on the device without waiting, then reads the status: the buffer's bytes
  // as far as the encoding says, and the encoding resolved.
  std::vector<uint8_t> EncodeOnDevice(const std::vector<uint8_t>& input,
                                      const std::vector<int64_t>& shape,
                                      DeferredEncoding* resolved, uint8_t** buffer) {
    const CodecParams params = *ParseCodecSpec(GetParam().spec);
    const size_t capacity = *MaxEncodedSize({GetParam().dtype, shape}, params);
    *buffer = memory_.Alloc(capacity);
    absl::StatusOr<DeferredEncoding> encoding =
        EncodeDeferred(TensorView{memory_.Upload(input), GetParam().dtype, shape, Device::kCuda},
                       params, *buffer, capacity, context_, status_);
    EXPECT_TRUE(encoding.ok()) << encoding.status();
    if (!encoding.ok()) return {};
    *resolved = Resolve(*encoding, ReadStatus());
    EXPECT_LE(resolved->bytes, capacity);
    return DeviceMemory::Download(*buffer, resolved->bytes);
  }

  std::vector<uint8_t> DecodeOnDevice(const DeferredEncoding& encoding, const uint8_t* buffer,
                                      const std::vector<int64_t>& shape, size_t out_bytes) {
    uint8_t* output = memory_.Alloc(out_bytes);
    const absl::Status decoded = DecodeDeferred(
        encoding, buffer, MutableTensorView{output, GetParam().dtype, shape, Device::kCuda},
        context_, status_);
    EXPECT_TRUE(decoded.ok()) << decoded;
    return DeviceMemory::Download(output, out_bytes);
  }
};

TEST_P(DeferredTest, TheBufferAndTheOutputAreTheCpus) {
  const std::vector<int64_t> shape = {3, 40, 37};
  const size_t numel = 3 * 40 * 37;
  const std::vector<uint8_t> input = Data(GetParam().dtype, numel, 11);
  const CodecParams params = *ParseCodecSpec(GetParam().spec);
  absl::StatusOr<std::vector<uint8_t>> on_cpu =
      testing::EncodeToVector(input.data(), GetParam().dtype, shape, params);
  ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();

  DeferredEncoding resolved;
  uint8_t* buffer = nullptr;
  const std::vector<uint8_t> on_device = EncodeOnDevice(input, shape, &resolved, &buffer);
  ASSERT_EQ(on_device.size(), on_cpu->size());
  for (size_t i = 0; i < on_cpu->size(); ++i) {
    ASSERT_EQ(on_device[i], (*on_cpu)[i]) << "first differing byte " << i;
  }
  // The host's resolved header is the one the device wrote.
  uint8_t header[kHeaderSize];
  WriteHeader(resolved.header, header);
  EXPECT_EQ(std::memcmp(header, on_cpu->data(), kHeaderSize), 0);
  EXPECT_TRUE(CheckEncode(resolved.header, ReadStatus()).ok());

  const size_t out_bytes = numel * ElementSize(GetParam().dtype);
  std::vector<uint8_t> expected(out_bytes);
  ASSERT_TRUE(Decode(on_cpu->data(), on_cpu->size(),
                     {expected.data(), GetParam().dtype, shape, Device::kCpu}, {})
                  .ok());
  // Decoded from the resolved encoding, and (codecs that read their parameters on the device)
  // from the one the host had before it saw the status.
  const std::vector<uint8_t> decoded = DecodeOnDevice(resolved, buffer, shape, out_bytes);
  EXPECT_EQ(decoded, expected);
  EXPECT_EQ(ReadStatus().failures, 0u) << DescribeFailures(ReadStatus().failures);
}

// Decoded before the host has read the encode's status: every codec reads what its data
// decided on the device (bitpack and mask from the buffer's header, eb from the status, here a
// copy of the encode's in another slot, as the runtime decodes), and gives the CPU's output.
TEST_P(DeferredTest, UnresolvedEncodingsDecodeAsOnTheCpu) {
  const std::vector<int64_t> shape = {5, 300};
  const std::vector<uint8_t> input = Data(GetParam().dtype, 1500, 3);
  const CodecParams params = *ParseCodecSpec(GetParam().spec);
  const size_t capacity = *MaxEncodedSize({GetParam().dtype, shape}, params);
  uint8_t* buffer = memory_.Alloc(capacity);
  absl::StatusOr<DeferredEncoding> encoding =
      EncodeDeferred(TensorView{memory_.Upload(input), GetParam().dtype, shape, Device::kCuda},
                     params, buffer, capacity, context_, status_);
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  EXPECT_TRUE(!encoding->device_decided || FindCodec(params.codec)->ReadsDeviceParams());
  auto* decode_status = reinterpret_cast<DeviceStatus*>(memory_.Alloc(sizeof(DeviceStatus)));
  ASSERT_EQ(cudaMemcpyAsync(decode_status, status_, sizeof(DeviceStatus),
                            cudaMemcpyDeviceToDevice, nullptr),
            cudaSuccess);
  const size_t out_bytes = 1500 * ElementSize(GetParam().dtype);
  uint8_t* output = memory_.Alloc(out_bytes);
  const absl::Status decoded = DecodeDeferred(
      *encoding, buffer, MutableTensorView{output, GetParam().dtype, shape, Device::kCuda},
      context_, decode_status);
  ASSERT_TRUE(decoded.ok()) << decoded;
  std::vector<uint8_t> expected(out_bytes);
  const std::vector<uint8_t> on_device = DeviceMemory::Download(buffer, capacity);
  ASSERT_TRUE(Decode(on_device.data(), capacity,
                     {expected.data(), GetParam().dtype, shape, Device::kCpu}, {})
                  .ok());
  EXPECT_EQ(DeviceMemory::Download(output, out_bytes), expected);
  DeviceStatus read;
  std::memcpy(&read, DeviceMemory::Download(decode_status, sizeof(read)).data(), sizeof(read));
  EXPECT_EQ(read.failures, 0u) << DescribeFailures(read.failures);
}

// A byte of the payload changed between the encode and the decode (memory corrupted while the
// tensor waited for backward): the output is NaN (0 for integers and bools), never garbage, and
// the status says the checksum failed.
TEST_P(DeferredTest, ACorruptedPayloadDecodesAsNaN) {
  const std::vector<int64_t> shape = {4, 256};
  const std::vector<uint8_t> input = Data(GetParam().dtype, 1024, 5);
  DeferredEncoding resolved;
  uint8_t* buffer = nullptr;
  const std::vector<uint8_t> bytes = EncodeOnDevice(input, shape, &resolved, &buffer);
  ASSERT_GT(bytes.size(), kHeaderSize);
  const size_t at = kHeaderSize + (bytes.size() - kHeaderSize) / 2;
  const uint8_t flipped = bytes[at] ^ 0x10;
  ASSERT_EQ(cudaMemcpy(buffer + at, &flipped, 1, cudaMemcpyHostToDevice), cudaSuccess);
  const size_t width = ElementSize(GetParam().dtype);
  const std::vector<uint8_t> decoded = DecodeOnDevice(resolved, buffer, shape, 1024 * width);
  const DeviceStatus read = ReadStatus();
  EXPECT_NE(read.failures & kFailChecksum, 0u) << DescribeFailures(read.failures);
  EXPECT_NE(DescribeFailures(read.failures).find("checksum"), std::string::npos);
  std::vector<uint8_t> poison(width, 0);
  switch (GetParam().dtype) {
    case DType::kFloat32: { const uint32_t nan = 0x7fc00000u; std::memcpy(poison.data(), &nan, 4); break; }
    case DType::kFloat16: { const uint16_t nan = 0x7e00u; std::memcpy(poison.data(), &nan, 2); break; }
    case DType::kBFloat16: { const uint16_t nan = 0x7fc0u; std::memcpy(poison.data(), &nan, 2); break; }
    case DType::kFloat64: { const uint64_t nan = 0x7ff8000000000000ull; std::memcpy(poison.data(), &nan, 8); break; }
    default: break;  // integers and bools: 0
  }
  for (size_t i = 0; i < 1024; ++i) {
    ASSERT_EQ(std::memcmp(decoded.data() + i * width, poison.data(), width), 0) << "element " << i;
  }
  // The header the device wrote, changed too: the check names it.
  const uint8_t ndim = 7;
  ASSERT_EQ(cudaMemcpy(buffer + 9, &ndim, 1, cudaMemcpyHostToDevice), cudaSuccess);
  DecodeOnDevice(resolved, buffer, shape, 1024 * width);
  EXPECT_NE(ReadStatus().failures & kFailHeader, 0u);
}

// A whole, valid buffer of another tensor (a stale pointer, a mixed-up record): its checksum
// matches, so only the comparison with the header the host kept catches it.
TEST_P(DeferredTest, ABufferOfAnotherTensorIsRefused) {
  const std::vector<int64_t> mine = {4, 256}, other = {8, 128};
  DeferredEncoding resolved_mine, resolved_other;
  uint8_t* buffer_mine = nullptr;
  uint8_t* buffer_other = nullptr;
  EncodeOnDevice(Data(GetParam().dtype, 1024, 1), mine, &resolved_mine, &buffer_mine);
  EncodeOnDevice(Data(GetParam().dtype, 1024, 2), other, &resolved_other, &buffer_other);
  // A buffer of the same size (the decode reads as many bytes as the host's header says).
  if (resolved_other.bytes != resolved_mine.bytes) GTEST_SKIP() << "sizes differ by codec";
  const size_t width = ElementSize(GetParam().dtype);
  const std::vector<uint8_t> decoded =
      DecodeOnDevice(resolved_mine, buffer_other, mine, 1024 * width);
  const DeviceStatus read = ReadStatus();
  // The checksum matches: the header's check alone says it.
  EXPECT_EQ(read.failures & ~uint64_t{kFailParams}, kFailHeader) << DescribeFailures(read.failures);
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, DeferredTest,
    ::testing::Values(Case{"identity", DType::kFloat64}, Case{"identity", DType::kFloat32},
                      Case{"quant2", DType::kFloat32}, Case{"quant4", DType::kFloat16},
                      Case{"quant8", DType::kBFloat16}, Case{"cast", DType::kFloat32},
                      Case{"cast:bf16", DType::kFloat32}, Case{"pool", DType::kFloat16},
                      Case{"division", DType::kFloat32}, Case{"division", DType::kBFloat16},
                      Case{"eb", DType::kFloat32}, Case{"eb:abs=1e-3", DType::kFloat16},
                      Case{"mask", DType::kBool}, Case{"bitpack", DType::kInt64}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = std::string(info.param.spec) + "_" +
                         std::string(DTypeName(info.param.dtype));
      for (char& c : name) {
        if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
      }
      return name;
    });

// The fixed-size codecs whose kernels check and finish the buffer in the launch that writes it:
// an encode is the status's memset and one launch (division's: its LFC launch, which zeroes
// the status, and its residual's, which needs every mean), a decode one launch and Poison's.
// The status holds garbage before the encode: the encode clears it. division on [2, 3, 8, 16]
// takes its vector residual kernel, on [3, 333] its scalar one.
struct LaunchCase {
  const char* spec;
  DType dtype;
  std::vector<int64_t> shape = {3, 333};
};
class LaunchesTest : public OnDevice, public ::testing::WithParamInterface<LaunchCase> {};

TEST_P(LaunchesTest, AnEncodeAndADecodeQueueAtMostTwoOperationsEach) {
#if !defined(CUDAEMU)
  GTEST_SKIP() << "the emulator counts the operations (--config=cudaemu)";
#else
  const std::vector<int64_t>& shape = GetParam().shape;
  const size_t numel = TensorSpec{GetParam().dtype, shape}.numel();
  const std::vector<uint8_t> input = Data(GetParam().dtype, numel, 4);
  const CodecParams params = *ParseCodecSpec(GetParam().spec);
  const size_t capacity = *MaxEncodedSize({GetParam().dtype, shape}, params);
  uint8_t* buffer = memory_.Alloc(capacity);
  uint8_t* on_device = memory_.Upload(input);
  const size_t out_bytes = numel * ElementSize(GetParam().dtype);
  uint8_t* output = memory_.Alloc(out_bytes);
  ASSERT_EQ(cudaMemset(status_, 0xa5, sizeof(DeviceStatus)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const uint64_t before_encode = cudaemu::DeviceOperationsQueued();
  absl::StatusOr<DeferredEncoding> encoding =
      EncodeDeferred(TensorView{on_device, GetParam().dtype, shape, Device::kCuda}, params,
                     buffer, capacity, context_, status_);
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  EXPECT_LE(cudaemu::DeviceOperationsQueued() - before_encode, 2u);
  const DeferredEncoding resolved = Resolve(*encoding, ReadStatus());
  const uint64_t before_decode = cudaemu::DeviceOperationsQueued();
  const absl::Status decoded = DecodeDeferred(
      resolved, buffer, MutableTensorView{output, GetParam().dtype, shape, Device::kCuda},
      context_, status_);
  ASSERT_TRUE(decoded.ok()) << decoded;
  EXPECT_LE(cudaemu::DeviceOperationsQueued() - before_decode, 2u);
  EXPECT_EQ(ReadStatus().failures, 0u) << DescribeFailures(ReadStatus().failures);
  std::vector<uint8_t> expected(out_bytes);
  const std::vector<uint8_t> encoded = DeviceMemory::Download(buffer, resolved.bytes);
  ASSERT_TRUE(Decode(encoded.data(), encoded.size(), {expected.data(), GetParam().dtype, shape,
                                                      Device::kCpu}, {})
                  .ok());
  EXPECT_EQ(DeviceMemory::Download(output, out_bytes), expected);
#endif
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, LaunchesTest,
    ::testing::Values(LaunchCase{"identity", DType::kFloat32},
                      LaunchCase{"identity", DType::kFloat16}, LaunchCase{"quant2", DType::kFloat32},
                      LaunchCase{"quant4", DType::kFloat16}, LaunchCase{"quant8", DType::kBFloat16},
                      LaunchCase{"cast:bf16", DType::kFloat32}, LaunchCase{"pool4", DType::kFloat32},
                      LaunchCase{"mask", DType::kBool}, LaunchCase{"division", DType::kFloat32},
                      LaunchCase{"division", DType::kFloat32, {2, 3, 8, 16}},
                      LaunchCase{"division", DType::kBFloat16, {2, 3, 8, 16}}),
    [](const ::testing::TestParamInfo<LaunchCase>& info) {
      std::string name = std::string(info.param.spec) + "_" +
                         std::string(DTypeName(info.param.dtype)) + "_" +
                         std::to_string(info.param.shape.size()) + "d";
      std::replace_if(name.begin(), name.end(), [](char ch) { return !std::isalnum(ch); }, '_');
      return name;
    });

// A buffer decoded twice with the encode's status, as a tensor unpacked again is: each decode
// sums the payload afresh (the launch's closing resets the sum), so neither finds the checksum
// wrong, and both write the CPU's output.
class RedecodeTest : public OnDevice, public ::testing::WithParamInterface<Case> {};

TEST_P(RedecodeTest, ASecondDecodeWithTheSameStatusPassesToo) {
  const CodecParams params = *ParseCodecSpec(GetParam().spec);
  const DType dtype = GetParam().dtype;
  const std::vector<int64_t> shape = {520};
  const std::vector<uint8_t> input = Data(dtype, 520, 3);
  const size_t capacity = *MaxEncodedSize({dtype, shape}, params);
  uint8_t* buffer = memory_.Alloc(capacity);
  absl::StatusOr<DeferredEncoding> encoding = EncodeDeferred(
      TensorView{memory_.Upload(input), dtype, shape, Device::kCuda}, params, buffer, capacity,
      context_, status_);
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  const DeferredEncoding resolved = Resolve(*encoding, ReadStatus());
  const std::vector<uint8_t> bytes = DeviceMemory::Download(buffer, resolved.bytes);
  std::vector<uint8_t> expected(520 * ElementSize(dtype));
  ASSERT_TRUE(Decode(bytes.data(), bytes.size(), {expected.data(), dtype, shape, Device::kCpu}, {})
                  .ok());
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(::testing::Message() << "decode " << round + 1);
    uint8_t* out = memory_.Alloc(expected.size());
    ASSERT_TRUE(DecodeDeferred(resolved, buffer, MutableTensorView{out, dtype, shape, Device::kCuda},
                               context_, status_)
                    .ok());
    EXPECT_EQ(ReadStatus().failures, 0u) << DescribeFailures(ReadStatus().failures);
    EXPECT_EQ(DeviceMemory::Download(out, expected.size()), expected);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, RedecodeTest,
    ::testing::Values(Case{"identity", DType::kFloat32}, Case{"quant2", DType::kFloat32},
                      Case{"cast", DType::kFloat32}, Case{"pool", DType::kFloat32},
                      Case{"division", DType::kFloat32}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.spec); });

// Inputs and outputs at every alignment a tensor view can have (offsets of 2, 4, 8 and 16
// bytes) and lengths that leave words and bytes past the last 16-byte vector: the kernels'
// vector paths where both sides are 16-byte aligned, their word and byte paths elsewhere, and
// the CPU's bytes and output every time (the emulator stops a misaligned vector access).
class AlignmentTest : public OnDevice, public ::testing::WithParamInterface<Case> {};

TEST_P(AlignmentTest, EveryOffsetAndTailGivesTheCpusBytesAndOutput) {
  const CodecParams params = *ParseCodecSpec(GetParam().spec);
  const DType dtype = GetParam().dtype;
  const size_t width = ElementSize(dtype);
  for (size_t numel : {size_t{1}, size_t{37}, size_t{515}, size_t{520}}) {
    const std::vector<int64_t> shape = {static_cast<int64_t>(numel)};
    std::vector<uint8_t> input = Data(dtype, numel, static_cast<uint32_t>(numel));
    if (params.codec == CodecId::kMask && dtype != DType::kBool) {  // zeros and one value
      std::vector<float> relu(numel, 0.0f);
      for (size_t i = 0; i < numel; ++i) relu[i] = (i * 7 + numel) % 3 == 0 ? 0.75f : 0.0f;
      input = testing::ToBytes(relu, dtype);
    }
    absl::StatusOr<std::vector<uint8_t>> on_cpu =
        testing::EncodeToVector(input.data(), dtype, shape, params);
    ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
    const size_t capacity = *MaxEncodedSize({dtype, shape}, params);
    for (size_t offset : {size_t{0}, size_t{2}, size_t{4}, size_t{8}, size_t{16}}) {
      if (offset % width != 0) continue;
      SCOPED_TRACE(::testing::Message() << numel << " elements at offset " << offset);
      std::vector<uint8_t> shifted(offset, 0xEE);
      shifted.insert(shifted.end(), input.begin(), input.end());
      const uint8_t* in = memory_.Upload(shifted) + offset;
      uint8_t* buffer = memory_.Alloc(capacity);
      absl::StatusOr<DeferredEncoding> encoding = EncodeDeferred(
          TensorView{in, dtype, shape, Device::kCuda}, params, buffer, capacity, context_, status_);
      ASSERT_TRUE(encoding.ok()) << encoding.status();
      const DeferredEncoding resolved = Resolve(*encoding, ReadStatus());
      ASSERT_EQ(DeviceMemory::Download(buffer, resolved.bytes), *on_cpu);
      uint8_t* out = memory_.Alloc(numel * width + offset) + offset;
      const absl::Status decoded = DecodeDeferred(
          resolved, buffer, MutableTensorView{out, dtype, shape, Device::kCuda}, context_, status_);
      ASSERT_TRUE(decoded.ok()) << decoded;
      ASSERT_EQ(ReadStatus().failures, 0u) << DescribeFailures(ReadStatus().failures);
      std::vector<uint8_t> expected(numel * width);
      ASSERT_TRUE(Decode(on_cpu->data(), on_cpu->size(), {expected.data(), dtype, shape, Device::kCpu},
                         {})
                      .ok());
      ASSERT_EQ(DeviceMemory::Download(out, numel * width), expected);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, AlignmentTest,
    ::testing::Values(Case{"identity", DType::kFloat32}, Case{"identity", DType::kFloat16},
                      Case{"identity", DType::kBool}, Case{"quant2", DType::kFloat32},
                      Case{"quant1:group=32", DType::kFloat32}, Case{"quant8", DType::kFloat16},
                      Case{"quant4:group=512", DType::kBFloat16},
                      Case{"quant2:group=512", DType::kFloat32}, Case{"cast:fp16", DType::kFloat32},
                      Case{"cast:bf16", DType::kFloat32}, Case{"pool", DType::kFloat32},
                      Case{"pool", DType::kBFloat16}, Case{"pool8", DType::kFloat16},
                      Case{"pool3", DType::kFloat32}, Case{"mask", DType::kFloat32},
                      Case{"mask", DType::kBool}, Case{"mask", DType::kBFloat16},
                      Case{"division", DType::kFloat32}, Case{"division:block=2,bits=1", DType::kFloat16}),
    [](const ::testing::TestParamInfo<Case>& info) {
      std::string name = std::string(info.param.spec) + "_" + std::string(DTypeName(info.param.dtype));
      std::replace_if(name.begin(), name.end(), [](char ch) { return !std::isalnum(ch); }, '_');
      return name;
    });

// Buffers that pass every check of a decode but one, the checksum resealed over what the check
// reads: only that check can catch them (its mutant in tools/mutate_kernels.py must fail here).
class ResealedTest : public OnDevice, public ::testing::WithParamInterface<Case> {
 protected:
  // The tensor encoded on the device, resolved; `bytes` the buffer's bytes read back.
  uint8_t* Encode(DeferredEncoding* resolved, std::vector<uint8_t>* bytes) {
    const CodecParams params = *ParseCodecSpec(GetParam().spec);
    const size_t capacity = *MaxEncodedSize({GetParam().dtype, shape_}, params);
    uint8_t* buffer = memory_.Alloc(capacity);
    absl::StatusOr<DeferredEncoding> encoding = EncodeDeferred(
        TensorView{memory_.Upload(Data(GetParam().dtype, 256, 8)), GetParam().dtype, shape_,
                   Device::kCuda},
        params, buffer, capacity, context_, status_);
    EXPECT_TRUE(encoding.ok()) << encoding.status();
    *resolved = Resolve(*encoding, ReadStatus());
    *bytes = DeviceMemory::Download(buffer, resolved->bytes);
    return buffer;
  }

  // Writes `header` over the buffer with the checksum of it and the payload's first
  // `payload_bytes` bytes.
  static void Reseal(Header header, const std::vector<uint8_t>& bytes, size_t payload_bytes,
                     uint8_t* buffer) {
    header.checksum = CombineChecksum(HeaderChecksum(header),
                                      PayloadChecksum(bytes.data() + kHeaderSize, payload_bytes));
    uint8_t written[kHeaderSize];
    WriteHeader(header, written);
    ASSERT_EQ(cudaMemcpy(buffer, written, kHeaderSize, cudaMemcpyHostToDevice), cudaSuccess);
  }

  // Decodes `encoding` and expects `failure` among the failures and the output poisoned.
  void ExpectRefused(const DeferredEncoding& encoding, const uint8_t* buffer, uint64_t failure) {
    const size_t width = ElementSize(GetParam().dtype);
    uint8_t* output = memory_.Alloc(256 * width);
    ASSERT_TRUE(DecodeDeferred(encoding, buffer,
                               MutableTensorView{output, GetParam().dtype, shape_, Device::kCuda},
                               context_, status_)
                    .ok());
    const uint64_t failures = ReadStatus().failures;
    EXPECT_NE(failures & failure, 0u) << DescribeFailures(failures);
    const std::vector<uint8_t> decoded = DeviceMemory::Download(output, 256 * width);
    const uint32_t nan = 0x7fc00000u;  // float32
    for (size_t i = 0; i < 256; ++i) {
      ASSERT_EQ(std::memcmp(decoded.data() + i * width, &nan, width), 0) << "element " << i;
    }
  }

  const std::vector<int64_t> shape_ = {256};
};

TEST_P(ResealedTest, AnUnknownHeaderFlagIsRefused) {
  DeferredEncoding resolved;
  std::vector<uint8_t> bytes;
  uint8_t* buffer = Encode(&resolved, &bytes);
  Header flagged = resolved.header;
  flagged.flags |= 2;  // no such flag
  Reseal(flagged, bytes, resolved.header.payload_size, buffer);
  ExpectRefused(resolved, buffer, kFailHeader);
}

// The encoding's room ends 4 bytes before its payload does (its header's size, which the host
// knows, is the payload's): the payload's size against the buffer's capacity catches it.
TEST_P(ResealedTest, APayloadPastTheBuffersEndIsRefused) {
  DeferredEncoding resolved;
  std::vector<uint8_t> bytes;
  uint8_t* buffer = Encode(&resolved, &bytes);
  Reseal(resolved.header, bytes, resolved.header.payload_size - 4, buffer);
  DeferredEncoding truncated = resolved;
  truncated.bytes -= 4;
  ExpectRefused(truncated, buffer, kFailHeader);
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, ResealedTest,
    ::testing::Values(Case{"identity", DType::kFloat32}, Case{"quant2", DType::kFloat32},
                      Case{"cast", DType::kFloat32}, Case{"pool", DType::kFloat32},
                      Case{"division", DType::kFloat32}),
    [](const ::testing::TestParamInfo<Case>& info) { return std::string(info.param.spec); });

// Values a codec cannot hold, met without the host looking: the header's flag is set, the
// decode writes NaN over the whole tensor, and CheckEncode gives the CPU encoder's refusal.
struct Unrepresentable {
  const char* spec;
  DType dtype;
  std::vector<uint8_t> (*make)();
};

std::vector<uint8_t> FloatsWithInfinity() {
  std::vector<float> v = testing::Gaussian(512, 9);
  v[100] = std::numeric_limits<float>::infinity();
  return testing::ToBytes(v, DType::kFloat32);
}
std::vector<uint8_t> FloatsWithNaN() {
  std::vector<float> v = testing::Gaussian(512, 9);
  v[7] = std::numeric_limits<float>::quiet_NaN();
  return testing::ToBytes(v, DType::kFloat32);
}
std::vector<uint8_t> FloatsPastHalf() {
  std::vector<float> v = testing::Gaussian(512, 9);
  v[300] = 1e6f;  // float16 holds at most 65504
  return testing::ToBytes(v, DType::kFloat32);
}
std::vector<uint8_t> TwoValues() {
  std::vector<float> v(512, 0.0f);
  v[3] = 1.0f;
  v[9] = 2.0f;
  return testing::ToBytes(v, DType::kFloat32);
}

class UnrepresentableTest : public OnDevice,
                            public ::testing::WithParamInterface<Unrepresentable> {};

TEST_P(UnrepresentableTest, TheFlagIsSetAndTheDecodeIsNaN) {
  DeviceMemory& memory = memory_;
  const ExecContext& context = context_;
  DeviceStatus* status = status_;
  const Unrepresentable& c = GetParam();
  const std::vector<int64_t> shape = {2, 256};
  const std::vector<uint8_t> input = c.make();
  const CodecParams params = *ParseCodecSpec(c.spec);
  // The CPU refuses it.
  std::vector<uint8_t> cpu_buffer(*MaxEncodedSize({c.dtype, shape}, params));
  const absl::StatusOr<size_t> refused = Encode({input.data(), c.dtype, shape, Device::kCpu},
                                                params, cpu_buffer.data(), cpu_buffer.size(), {});
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);

  const size_t capacity = cpu_buffer.size();
  uint8_t* buffer = memory.Alloc(capacity);
  absl::StatusOr<DeferredEncoding> encoding = EncodeDeferred(
      {memory.Upload(input), c.dtype, shape, Device::kCuda}, params, buffer, capacity, context,
      status);
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  DeviceStatus read;
  std::memcpy(&read, DeviceMemory::Download(status, sizeof(read)).data(), sizeof(read));
  const DeferredEncoding resolved = Resolve(*encoding, read);
  EXPECT_NE(resolved.header.flags & kFlagUnrepresentable, 0);
  const absl::Status checked = CheckEncode(resolved.header, read);
  EXPECT_EQ(checked, refused.status());

  uint8_t* output = memory.Alloc(512 * 4);
  ASSERT_TRUE(DecodeDeferred(*encoding, buffer, {output, c.dtype, shape, Device::kCuda}, context,
                             status)
                  .ok());
  const std::vector<uint8_t> decoded = DeviceMemory::Download(output, 512 * 4);
  for (size_t i = 0; i < 512; ++i) {
    float v;
    std::memcpy(&v, decoded.data() + 4 * i, 4);
    ASSERT_TRUE(std::isnan(v)) << "element " << i << " is " << v;
  }
  std::memcpy(&read, DeviceMemory::Download(status, sizeof(read)).data(), sizeof(read));
  EXPECT_EQ(read.failures, kFailUnrepresentable) << DescribeFailures(read.failures);
  // The buffer says so itself: the CPU decodes it as NaN too, and the synchronous decode on
  // the device.
  const std::vector<uint8_t> bytes = DeviceMemory::Download(buffer, resolved.bytes);
  std::vector<float> on_cpu(512, 0.0f);
  ASSERT_TRUE(Decode(bytes.data(), bytes.size(), {on_cpu.data(), c.dtype, shape, Device::kCpu}, {})
                  .ok());
  for (float v : on_cpu) ASSERT_TRUE(std::isnan(v));
  // ... and so does the synchronous decode on the device.
  ExecContext sync = context;
  class Scratch final : public ScratchAllocator {
   public:
    absl::StatusOr<void*> Allocate(size_t bytes, void*) override {
      void* p = nullptr;
      if (cudaMalloc(&p, bytes) != cudaSuccess) return absl::ResourceExhaustedError("scratch");
      return p;
    }
    void Deallocate(void* p, size_t, void*) override { cudaFree(p); }
  } scratch;
  sync.scratch = &scratch;
  uint8_t* copy = memory.Upload(bytes);
  uint8_t* sync_output = memory.Alloc(512 * 4);
  ASSERT_TRUE(Decode(copy, bytes.size(), {sync_output, c.dtype, shape, Device::kCuda}, sync).ok());
  const std::vector<uint8_t> sync_decoded = DeviceMemory::Download(sync_output, 512 * 4);
  for (size_t i = 0; i < 512; ++i) {
    float v;
    std::memcpy(&v, sync_decoded.data() + 4 * i, 4);
    ASSERT_TRUE(std::isnan(v)) << "element " << i;
  }
}

// Bitpack buffers whose parameters no decoder may use, with a checksum that matches (forged,
// or written by a broken encoder): more bits than an int64 has, a base the bits would carry past
// the largest int64, an unused parameter byte set, a payload a word short of what the bits
// take. The host's header of a deferred decode knows none of them, so the device's own check
// of the parameters refuses each before the decode reads past its payload, and the output is
// zeros.
using DeferredParamsTest = OnDevice;

TEST_F(DeferredParamsTest, BitpackParametersTheDtypeCannotHoldAreRefusedOnTheDevice) {
  DeviceMemory& memory = memory_;
  DeviceStatus* status = status_;
  const std::vector<int64_t> shape = {4, 64};
  const std::vector<uint8_t> input = Data(DType::kInt64, 256, 2);
  const CodecParams params = *ParseCodecSpec("bitpack");
  absl::StatusOr<std::vector<uint8_t>> buffer =
      testing::EncodeToVector(input.data(), DType::kInt64, shape, params);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  absl::StatusOr<Header> header = ParseHeader(buffer->data(), buffer->size());
  ASSERT_TRUE(header.ok());
  struct Forgery {
    const char* name;
    void (*forge)(Header* header);
  };
  const Forgery forgeries[] = {
      {"65 bits", [](Header* h) { h->params[8] = 65; }},
      {"a base the bits carry past int64",
       [](Header* h) {
         const int64_t base = std::numeric_limits<int64_t>::max() - 2;
         std::memcpy(h->params.data(), &base, 8);
       }},
      {"an unused parameter byte", [](Header* h) { h->params[12] = 1; }},
      {"a payload a word short", [](Header* h) { h->payload_size -= 4; }},
  };
  for (const Forgery& f : forgeries) {
    Header forged = *header;
    f.forge(&forged);
    forged.checksum = CombineChecksum(
        HeaderChecksum(forged), PayloadChecksum(buffer->data() + kHeaderSize, forged.payload_size));
    std::vector<uint8_t> bytes = *buffer;
    WriteHeader(forged, bytes.data());
    ASSERT_TRUE(Verify(bytes.data(), bytes.size(), {}).ok()) << f.name;  // the CPU accepts it
    uint8_t* device = memory.Upload(bytes);
    // The host's header as a deferred encode leaves it: parameters and size to come.
    DeferredEncoding encoding;
    encoding.header = *header;
    encoding.header.params.fill(0);
    encoding.header.payload_size = 0;
    encoding.header.checksum = 0;
    encoding.device_decided = true;
    encoding.bytes = bytes.size();
    uint8_t* output = memory.Alloc(256 * 8);
    ASSERT_EQ(cudaMemset(status, 0, sizeof(DeviceStatus)), cudaSuccess);
    ASSERT_TRUE(DecodeDeferred(encoding, device, {output, DType::kInt64, shape, Device::kCuda},
                               context_, status)
                    .ok())
        << f.name;
    DeviceStatus read;
    std::memcpy(&read, DeviceMemory::Download(status, sizeof(read)).data(), sizeof(read));
    EXPECT_EQ(read.failures, kFailParams) << f.name << ": " << DescribeFailures(read.failures);
    const std::vector<uint8_t> decoded = DeviceMemory::Download(output, 256 * 8);
    EXPECT_EQ(decoded, std::vector<uint8_t>(256 * 8, 0)) << f.name;
  }
}

// Mask buffers with a parameter no mask encode writes (a NaN value; a second parameter word
// that is not zero), resealed: the device's check of the parameters refuses each, and the
// output is NaN.
TEST_F(DeferredParamsTest, MaskParametersNoEncodeWritesAreRefusedOnTheDevice) {
  const std::vector<int64_t> shape = {256};
  std::vector<float> values(256, 0.0f);
  for (size_t i = 0; i < 256; i += 3) values[i] = 1.5f;
  const std::vector<uint8_t> input = testing::ToBytes(values, DType::kFloat32);
  absl::StatusOr<std::vector<uint8_t>> buffer =
      testing::EncodeToVector(input.data(), DType::kFloat32, shape, *ParseCodecSpec("mask"));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  absl::StatusOr<Header> header = ParseHeader(buffer->data(), buffer->size());
  ASSERT_TRUE(header.ok());
  for (int forgery = 0; forgery < 2; ++forgery) {
    SCOPED_TRACE(forgery == 0 ? "a NaN value" : "a second parameter word");
    Header forged = *header;
    const uint32_t nan = 0x7fc00000u;
    if (forgery == 0) {
      std::memcpy(forged.params.data(), &nan, 4);
    } else {
      forged.params[4] = 1;
    }
    forged.checksum = CombineChecksum(
        HeaderChecksum(forged), PayloadChecksum(buffer->data() + kHeaderSize, forged.payload_size));
    std::vector<uint8_t> bytes = *buffer;
    WriteHeader(forged, bytes.data());
    uint8_t* device = memory_.Upload(bytes);
    DeferredEncoding encoding;  // as a deferred encode leaves it: the value to come
    encoding.header = *header;
    encoding.header.params.fill(0);
    encoding.header.checksum = 0;
    encoding.device_decided = true;
    encoding.bytes = bytes.size();
    uint8_t* output = memory_.Alloc(256 * 4);
    ASSERT_TRUE(DecodeDeferred(encoding, device, {output, DType::kFloat32, shape, Device::kCuda},
                               context_, status_)
                    .ok());
    EXPECT_EQ(ReadStatus().failures, kFailParams) << DescribeFailures(ReadStatus().failures);
    const std::vector<uint8_t> decoded = DeviceMemory::Download(output, 256 * 4);
    for (size_t i = 0; i < 256; ++i) {
      float v;
      std::memcpy(&v, decoded.data() + 4 * i, 4);
      ASSERT_TRUE(std::isnan(v)) << "element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, UnrepresentableTest,
    ::testing::Values(Unrepresentable{"quant2", DType::kFloat32, &FloatsWithInfinity},
                      Unrepresentable{"quant8", DType::kFloat32, &FloatsWithNaN},
                      Unrepresentable{"division", DType::kFloat32, &FloatsWithInfinity},
                      Unrepresentable{"pool", DType::kFloat32, &FloatsWithNaN},
                      Unrepresentable{"cast", DType::kFloat32, &FloatsPastHalf},
                      Unrepresentable{"mask", DType::kFloat32, &TwoValues}),
    [](const ::testing::TestParamInfo<Unrepresentable>& info) {
      return std::string(info.param.spec) + "_" + std::to_string(info.index);
    });

// ---- encodings moved into the room the host predicted for them (PlaceDeferred) ----

template <typename T>
T ReadBack(const T* device) {
  T host;
  std::memcpy(&host, DeviceMemory::Download(device, sizeof(T)).data(), sizeof(T));
  return host;
}

// Whether every element is what a failed decode writes: NaN, or 0 for integer dtypes.
bool AllPoison(const std::vector<uint8_t>& decoded, DType dtype) {
  const size_t width = ElementSize(dtype);
  for (size_t i = 0; i < decoded.size(); i += width) {
    if (dtype == DType::kFloat32) {
      float v;
      std::memcpy(&v, decoded.data() + i, 4);
      if (!std::isnan(v)) return false;
    } else if (dtype == DType::kInt64) {
      int64_t v;
      std::memcpy(&v, decoded.data() + i, 8);
      if (v != 0) return false;
    } else {
      ADD_FAILURE() << "no poison check for " << DTypeName(dtype);
      return false;
    }
  }
  return true;
}

struct Tensor {
  const char* spec;
  DType dtype;
  std::vector<int64_t> shape;
  uint32_t seed;
};

// Data with a non-finite value every 97 (eb keeps those exactly, as outliers).
std::vector<uint8_t> Spiky(const Tensor& t, size_t numel) {
  if (t.dtype != DType::kFloat32) return Data(t.dtype, numel, t.seed);
  std::vector<float> v = testing::Gaussian(numel, t.seed);
  for (size_t i = 5; i < numel; i += 97) {
    v[i] = i % 2 ? std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  }
  return testing::ToBytes(v, DType::kFloat32);
}

// An encoding of a tensor on the device, not resolved, and what the CPU makes of the tensor.
struct Encoded {
  Tensor tensor;
  std::vector<uint8_t> cpu;       // the CPU's buffer: the bytes the encoding has
  std::vector<uint8_t> expected;  // the CPU's decode
  DeferredEncoding encoding;
  uint8_t* staging = nullptr;     // DeferredEncoding::bytes
  DeviceStatus* status = nullptr;
};

class PlacementTest : public OnDevice {
 protected:
  Encoded Encode(const Tensor& t, cudaStream_t stream = nullptr) {
    Encoded e;
    e.tensor = t;
    const size_t numel = TensorSpec{t.dtype, t.shape}.numel();
    const std::vector<uint8_t> input = Spiky(t, numel);
    const CodecParams params = *ParseCodecSpec(t.spec);
    e.cpu = *testing::EncodeToVector(input.data(), t.dtype, t.shape, params);
    e.expected.resize(numel * ElementSize(t.dtype));
    EXPECT_TRUE(Decode(e.cpu.data(), e.cpu.size(), {e.expected.data(), t.dtype, t.shape,
                                                    Device::kCpu}, {})
                    .ok());
    const size_t bound = *MaxEncodedSize({t.dtype, t.shape}, params);
    e.staging = memory_.Alloc(bound);
    e.status = reinterpret_cast<DeviceStatus*>(memory_.Alloc(sizeof(DeviceStatus)));
    ExecContext context = context_;
    context.stream = stream;
    absl::StatusOr<DeferredEncoding> encoding = EncodeDeferred(
        {memory_.Upload(input), t.dtype, t.shape, Device::kCuda}, params, e.staging, bound,
        context, e.status);
    EXPECT_TRUE(encoding.ok()) << encoding.status();
    if (encoding.ok()) e.encoding = *encoding;
    EXPECT_TRUE(e.encoding.device_decided);
    EXPECT_LE(e.encoding.bytes, bound);
    EXPECT_GT(e.encoding.bytes, e.cpu.size() + 256) << "too little room to spill past a target";
    return e;
  }

  SpillArena Arena(size_t capacity) {
    SpillArena arena;
    arena.data = memory_.Alloc(capacity);
    arena.capacity = capacity;
    arena.used = reinterpret_cast<unsigned long long*>(memory_.Alloc(8));
    EXPECT_EQ(cudaMemset(arena.used, 0, 8), cudaSuccess);
    return arena;
  }

  // Gathers the encoding into fresh room for its bound and decodes it there unresolved, with a
  // copy of its status (as the runtime does); the output and the decode's status.
  std::vector<uint8_t> GatherAndDecode(const Encoded& e, const uint8_t* target,
                                       size_t target_capacity, const SpillArena& arena,
                                       DeviceStatus* read, cudaStream_t stream = nullptr) {
    ExecContext context = context_;
    context.stream = stream;
    uint8_t* dest = memory_.Alloc(e.encoding.bytes);
    EXPECT_TRUE(GatherDeferred(target, target_capacity, arena, e.status, dest, e.encoding.bytes,
                               context)
                    .ok());
    auto* decode_status = reinterpret_cast<DeviceStatus*>(memory_.Alloc(sizeof(DeviceStatus)));
    EXPECT_EQ(cudaMemcpyAsync(decode_status, e.status, sizeof(DeviceStatus),
                              cudaMemcpyDeviceToDevice, stream),
              cudaSuccess);
    uint8_t* output = memory_.Alloc(e.expected.size());
    const absl::Status decoded = DecodeDeferred(
        e.encoding, dest, {output, e.tensor.dtype, e.tensor.shape, Device::kCuda}, context,
        decode_status);
    EXPECT_TRUE(decoded.ok()) << decoded;
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    *read = ReadBack(decode_status);
    return DeviceMemory::Download(output, e.expected.size());
  }

  // The bytes the placement holds.
  static std::vector<uint8_t> Placed(const Encoded& e, const uint8_t* target,
                                     const SpillArena& arena) {
    const Placement placement = PlacementOf(ReadBack(e.status));
    return DeviceMemory::Download(PlacedBytes(placement, target, arena), e.cpu.size());
  }
};

const Tensor kEb = {"eb:rel=1e-3", DType::kFloat32, {8, 300}, 1};
const Tensor kEb2D = {"eb:abs=1e-2", DType::kFloat32, {2, 24, 40}, 2};
const Tensor kBitpack = {"bitpack", DType::kInt64, {6, 100}, 3};

// A target the encoding fits exactly, at a 16-byte boundary and 8 bytes past one (the move
// copies 16-byte words where every pointer allows, 8-byte words otherwise).
TEST_F(PlacementTest, AnEncodingThatFitsItsTargetGoesThere) {
  for (const Tensor& t : {kEb, kEb2D, kBitpack}) {
    for (size_t misalign : {0, 8}) {
      SCOPED_TRACE(std::string(t.spec) + " target at +" + std::to_string(misalign));
      const Encoded e = Encode(t);
      const size_t size = e.cpu.size();
      uint8_t* target = memory_.Alloc(size + misalign) + misalign;
      const SpillArena arena = Arena(4096);
      ASSERT_TRUE(PlaceDeferred(e.staging, e.encoding.bytes, target, size, arena, e.status,
                                context_)
                      .ok());
      const Placement placement = PlacementOf(ReadBack(e.status));
      EXPECT_EQ(placement.kind, PlacementKind::kTarget);
      EXPECT_EQ(ReadBack(arena.used), 0u);
      EXPECT_EQ(DeviceMemory::Download(target, size), e.cpu);
      // The staging buffer may be reused at once: the gather reads the target.
      ASSERT_EQ(cudaMemset(e.staging, 0x5A, e.encoding.bytes), cudaSuccess);
      DeviceStatus read;
      EXPECT_EQ(GatherAndDecode(e, target, size, arena, &read), e.expected);
      EXPECT_EQ(read.failures, 0u) << DescribeFailures(read.failures);
    }
  }
}

// One word too large for its target: into the arena, at the next multiple of 256 bytes; the
// decode gathers it from there before the host knows, and after, the host finds it through
// the placement (a copy out, or a decode of the resolved encoding where it lies).
TEST_F(PlacementTest, AnEncodingLargerThanItsTargetSpillsIntoTheArena) {
  const Encoded a = Encode(kEb), b = Encode(kBitpack);
  const size_t room_a = (a.cpu.size() + 255) / 256 * 256;
  const size_t room_b = (b.cpu.size() + 255) / 256 * 256;
  const SpillArena arena = Arena(room_a + room_b);
  uint8_t* target_a = memory_.Alloc(a.cpu.size() - 4);
  uint8_t* target_b = memory_.Alloc(b.cpu.size() - 1);
  ASSERT_TRUE(PlaceDeferred(a.staging, a.encoding.bytes, target_a, a.cpu.size() - 4, arena,
                            a.status, context_)
                  .ok());
  ASSERT_TRUE(PlaceDeferred(b.staging, b.encoding.bytes, target_b, b.cpu.size() - 1, arena,
                            b.status, context_)
                  .ok());
  const Placement pa = PlacementOf(ReadBack(a.status)), pb = PlacementOf(ReadBack(b.status));
  EXPECT_EQ(pa.kind, PlacementKind::kArena);
  EXPECT_EQ(pb.kind, PlacementKind::kArena);
  EXPECT_EQ(pa.arena_offset, 0u);
  EXPECT_EQ(pb.arena_offset, room_a);
  EXPECT_EQ(ReadBack(arena.used), room_a + room_b);
  EXPECT_EQ(Placed(a, target_a, arena), a.cpu);
  EXPECT_EQ(Placed(b, target_b, arena), b.cpu);
  for (const Encoded* e : {&a, &b}) {
    SCOPED_TRACE(e->tensor.spec);
    ASSERT_EQ(cudaMemset(e->staging, 0x5A, e->encoding.bytes), cudaSuccess);
    uint8_t* target = e == &a ? target_a : target_b;
    const size_t target_capacity = e == &a ? a.cpu.size() - 4 : b.cpu.size() - 1;
    DeviceStatus read;
    EXPECT_EQ(GatherAndDecode(*e, target, target_capacity, arena, &read), e->expected);
    EXPECT_EQ(read.failures, 0u) << DescribeFailures(read.failures);
    // The step's status read: the host resolves the encoding and finds it in the arena.
    const DeviceStatus encoded = ReadBack(e->status);
    const DeferredEncoding resolved = Resolve(e->encoding, encoded);
    ASSERT_EQ(resolved.bytes, e->cpu.size());
    const Placement placement = PlacementOf(encoded);
    uint8_t* copy = memory_.Alloc(resolved.bytes);
    ASSERT_TRUE(CopyPlaced(placement, resolved.bytes, target, target_capacity, arena, copy,
                           resolved.bytes, context_)
                    .ok());
    EXPECT_EQ(DeviceMemory::Download(copy, resolved.bytes), e->cpu);
    EXPECT_FALSE(CopyPlaced(placement, arena.capacity, target, target_capacity, arena, copy,
                            arena.capacity, context_)
                     .ok());
    uint8_t* output = memory_.Alloc(e->expected.size());
    ASSERT_TRUE(DecodeDeferred(resolved, PlacedBytes(placement, target, arena),
                               {output, e->tensor.dtype, e->tensor.shape, Device::kCuda},
                               context_, status_)
                    .ok());
    EXPECT_EQ(DeviceMemory::Download(output, e->expected.size()), e->expected);
    EXPECT_EQ(ReadBack(status_).failures, 0u);
  }
}

// No room left in the arena (or no arena): the encoding is placed nowhere, its gather copies
// nothing, and its decode writes NaN (zeros for integers) and says why.
TEST_F(PlacementTest, AnEncodingThatFitsNowhereIsLostAndDecodesAsNaN) {
  for (const Tensor& t : {kEb, kBitpack}) {
    for (bool no_arena : {false, true}) {
      SCOPED_TRACE(std::string(t.spec) + (no_arena ? " without an arena" : " arena full"));
      const Encoded e = Encode(t);
      const size_t room = (e.cpu.size() + 255) / 256 * 256;
      uint8_t* target = memory_.Alloc(64);
      // An arena with room for one: a first placement of the encoding takes it (from a copy of
      // its status), the second finds none.
      const SpillArena arena = no_arena ? SpillArena{} : Arena(room);
      auto* first = reinterpret_cast<DeviceStatus*>(memory_.Alloc(sizeof(DeviceStatus)));
      ASSERT_EQ(cudaMemcpy(first, e.status, sizeof(DeviceStatus), cudaMemcpyDeviceToDevice),
                cudaSuccess);
      if (!no_arena) {
        ASSERT_TRUE(
            PlaceDeferred(e.staging, e.encoding.bytes, target, 64, arena, first, context_).ok());
        EXPECT_EQ(PlacementOf(ReadBack(first)).kind, PlacementKind::kArena);
      }
      ASSERT_TRUE(
          PlaceDeferred(e.staging, e.encoding.bytes, target, 64, arena, e.status, context_).ok());
      EXPECT_EQ(PlacementOf(ReadBack(e.status)).kind, PlacementKind::kLost);
      EXPECT_EQ(PlacedBytes(PlacementOf(ReadBack(e.status)), target, arena), nullptr);
      // The room every spill asked for: what the arena would have needed.
      if (!no_arena) {
        EXPECT_EQ(ReadBack(arena.used), 2 * room);
      }
      DeviceStatus read;
      EXPECT_TRUE(AllPoison(GatherAndDecode(e, target, 64, arena, &read), t.dtype));
      EXPECT_EQ(read.failures, kFailLost) << DescribeFailures(read.failures);
      EXPECT_NE(DescribeFailures(read.failures).find("did not fit"), std::string::npos);
    }
  }
}

// Placements queued on four streams at once share one arena through its counter: every spill
// gets room of its own, 256-byte aligned, and each decodes as the CPU.
TEST_F(PlacementTest, PlacementsFromSeveralStreamsShareTheArena) {
  constexpr int kStreams = 4, kTensors = 8;
  cudaStream_t streams[kStreams];
  for (cudaStream_t& s : streams) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  }
  std::vector<Encoded> encoded;
  std::vector<uint8_t*> targets;
  size_t rooms = 0;
  for (int i = 0; i < kTensors; ++i) {
    Tensor t = i % 3 == 2 ? kBitpack : i % 3 == 1 ? kEb2D : kEb;
    t.seed = 10 + i;
    encoded.push_back(Encode(t, streams[i % kStreams]));
    rooms += (encoded.back().cpu.size() + 255) / 256 * 256;
    targets.push_back(memory_.Alloc(128));
  }
  const SpillArena arena = Arena(rooms);
  for (int i = 0; i < kTensors; ++i) {
    ExecContext context = context_;
    context.stream = streams[i % kStreams];
    ASSERT_TRUE(PlaceDeferred(encoded[i].staging, encoded[i].encoding.bytes, targets[i], 128,
                              arena, encoded[i].status, context)
                    .ok());
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(ReadBack(arena.used), rooms);
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (int i = 0; i < kTensors; ++i) {
    const Placement p = PlacementOf(ReadBack(encoded[i].status));
    ASSERT_EQ(p.kind, PlacementKind::kArena);
    EXPECT_EQ(p.arena_offset % 256, 0u);
    spans.push_back({p.arena_offset, p.arena_offset + encoded[i].cpu.size()});
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first);
  for (int i = 0; i < kTensors; ++i) {
    SCOPED_TRACE(i);
    DeviceStatus read;
    EXPECT_EQ(GatherAndDecode(encoded[i], targets[i], 128, arena, &read, streams[i % kStreams]),
              encoded[i].expected);
    EXPECT_EQ(read.failures, 0u) << DescribeFailures(read.failures);
  }
  for (cudaStream_t s : streams) cudaStreamDestroy(s);
}

TEST_F(PlacementTest, CallsThatCannotBeQueuedAreRefused) {
  const Encoded e = Encode(kBitpack);
  uint8_t* target = memory_.Alloc(256);
  const SpillArena arena = Arena(256);
  EXPECT_EQ(PlaceDeferred(e.staging + 4, e.encoding.bytes - 4, target, 256, arena, e.status,
                          context_)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceDeferred(e.staging, e.encoding.bytes, nullptr, 256, arena, e.status, context_)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceDeferred(e.staging, 64, target, 256, arena, e.status, context_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PlaceDeferred(e.staging, e.encoding.bytes, target, 256, arena, nullptr, context_)
                .code(),
            absl::StatusCode::kInvalidArgument);
  SpillArena no_memory = arena;
  no_memory.data = nullptr;
  EXPECT_EQ(PlaceDeferred(e.staging, e.encoding.bytes, target, 256, no_memory, e.status, context_)
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(GatherDeferred(target, 256, arena, e.status, target + 4, 252, context_).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CopyPlaced(Placement{}, 128, target, 256, arena, target, 256, context_).code(),
            absl::StatusCode::kInvalidArgument);
}

// What an unresolved eb decode reads from the status, corrupted there (the buffer is intact):
// the decode checks it on the device, writes NaN and says what was wrong, and reads and writes
// nothing out of bounds whatever the values (every device buffer is exactly its size, which
// AddressSanitizer sees under --config=cudaemu_asan).
struct Corruption {
  const char* name;
  void (*corrupt)(DeviceStatus* status, const Encoded& e);
  uint64_t failure;  // a bit the decode must set
  bool alone;        // ... and the only one
};

const Corruption kCorruptions[] = {
    {"outliers_past_the_shape",
     [](DeviceStatus* s, const Encoded& e) {
       const uint64_t n = TensorSpec{e.tensor.dtype, e.tensor.shape}.numel() + 1;
       s->params[4] = static_cast<uint32_t>(n);
       s->params[5] = static_cast<uint32_t>(n >> 32);
     },
     kFailEbOutlier, true},
    {"outliers_huge",
     [](DeviceStatus* s, const Encoded&) { s->params[5] = 0x80000000u; }, kFailEbOutlier, true},
    {"payload_past_the_bound",
     [](DeviceStatus* s, const Encoded& e) { s->payload_bytes = e.encoding.bytes; }, kFailParams,
     true},
    {"payload_huge", [](DeviceStatus* s, const Encoded&) { s->payload_bytes = ~0ull << 2; },
     kFailParams, true},
    {"payload_not_whole_words", [](DeviceStatus* s, const Encoded&) { s->payload_bytes += 2; },
     kFailParams, true},
    {"payload_shorter_than_its_outliers",
     [](DeviceStatus* s, const Encoded&) { s->payload_bytes = 8; }, kFailParams, true},
    {"payload_a_word_short", [](DeviceStatus* s, const Encoded&) { s->payload_bytes -= 4; },
     kFailHeader, false},
    {"one_outlier_fewer", [](DeviceStatus* s, const Encoded&) { s->params[4] -= 1; },
     kFailHeader, false},
    {"half_bin_zero", [](DeviceStatus* s, const Encoded&) { s->params[1] = 0; }, kFailParams,
     true},
    {"half_bin_doubled", [](DeviceStatus* s, const Encoded&) { s->params[1] += 1u << 23; },
     kFailHeader, true},
    {"bound_infinite", [](DeviceStatus* s, const Encoded&) { s->params[2] = 0x7f800000u; },
     kFailParams, true},
    {"unused_word_set", [](DeviceStatus* s, const Encoded&) { s->params[3] = 1; }, kFailParams,
     true},
    {"zeroed", [](DeviceStatus* s, const Encoded&) { std::memset(s, 0, sizeof(*s)); },
     kFailParams, true},
};

void PrintTo(const Corruption& c, std::ostream* os) { *os << c.name; }

class CorruptStatusTest : public PlacementTest,
                          public ::testing::WithParamInterface<Corruption> {};

TEST_P(CorruptStatusTest, AnUnresolvedEbDecodeChecksWhatTheStatusSays) {
  const Encoded e = Encode(kEb);
  DeviceStatus status = ReadBack(e.status);
  ASSERT_GT(status.params[4], 0u) << "the data has no outliers";
  GetParam().corrupt(&status, e);
  auto* decode_status = reinterpret_cast<DeviceStatus*>(memory_.Alloc(sizeof(DeviceStatus)));
  ASSERT_EQ(cudaMemcpy(decode_status, &status, sizeof(status), cudaMemcpyHostToDevice),
            cudaSuccess);
  uint8_t* output = memory_.Alloc(e.expected.size());
  ASSERT_TRUE(DecodeDeferred(e.encoding, e.staging,
                             {output, e.tensor.dtype, e.tensor.shape, Device::kCuda}, context_,
                             decode_status)
                  .ok());
  const uint64_t failures = ReadBack(decode_status).failures;
  EXPECT_NE(failures & GetParam().failure, 0u) << DescribeFailures(failures);
  if (GetParam().alone) {
    EXPECT_EQ(failures, GetParam().failure) << DescribeFailures(failures);
  }
  EXPECT_TRUE(AllPoison(DeviceMemory::Download(output, e.expected.size()), e.tensor.dtype));
}

INSTANTIATE_TEST_SUITE_P(Statuses, CorruptStatusTest, ::testing::ValuesIn(kCorruptions),
                         [](const ::testing::TestParamInfo<Corruption>& info) {
                           return std::string(info.param.name);
                         });

#endif  // ACTPACK_WITH_CUDA

}  // namespace
}  // namespace actpack::codecs

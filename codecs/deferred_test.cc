// The deferred calls (deferred.h) on CUDA: the buffer EncodeDeferred writes is the CPU's,
// byte for byte, once the host has read its status; DecodeDeferred gives the CPU's output; data
// a codec cannot hold, and a buffer corrupted after its encode, decode as NaN (zeros for
// integer and bool tensors) with the reason in the status. Runs on a GPU, or on the CUDA
// emulator under --config=cudaemu.
#include "codecs/deferred.h"

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

TEST_P(DeferredTest, UnresolvedEncodingsDecodeWhereTheCodecReadsItsParametersOnTheDevice) {
  const std::vector<int64_t> shape = {5, 300};
  const std::vector<uint8_t> input = Data(GetParam().dtype, 1500, 3);
  const CodecParams params = *ParseCodecSpec(GetParam().spec);
  const size_t capacity = *MaxEncodedSize({GetParam().dtype, shape}, params);
  uint8_t* buffer = memory_.Alloc(capacity);
  absl::StatusOr<DeferredEncoding> encoding =
      EncodeDeferred(TensorView{memory_.Upload(input), GetParam().dtype, shape, Device::kCuda},
                     params, buffer, capacity, context_, status_);
  ASSERT_TRUE(encoding.ok()) << encoding.status();
  const size_t out_bytes = 1500 * ElementSize(GetParam().dtype);
  uint8_t* output = memory_.Alloc(out_bytes);
  const absl::Status decoded = DecodeDeferred(
      *encoding, buffer, MutableTensorView{output, GetParam().dtype, shape, Device::kCuda},
      context_, status_);
  if (encoding->device_decided && !FindCodec(params.codec)->ReadsDeviceParams()) {
    // eb: the host must see the status first.
    EXPECT_EQ(decoded.code(), absl::StatusCode::kFailedPrecondition) << decoded;
    return;
  }
  ASSERT_TRUE(decoded.ok()) << decoded;
  std::vector<uint8_t> expected(out_bytes);
  const std::vector<uint8_t> on_device = DeviceMemory::Download(buffer, capacity);
  ASSERT_TRUE(Decode(on_device.data(), capacity,
                     {expected.data(), GetParam().dtype, shape, Device::kCpu}, {})
                  .ok());
  EXPECT_EQ(DeviceMemory::Download(output, out_bytes), expected);
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

// A bitpack buffer whose bits no int64 holds, with a checksum that matches (forged, or written
// by a broken encoder): the device's own check of the parameters refuses it before the decode
// reads past its payload, and the output is zeros.
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
  Header forged = *header;
  forged.params[8] = 65;  // bits
  forged.checksum = CombineChecksum(
      HeaderChecksum(forged), PayloadChecksum(buffer->data() + kHeaderSize, forged.payload_size));
  std::vector<uint8_t> bytes = *buffer;
  WriteHeader(forged, bytes.data());
  ASSERT_TRUE(Verify(bytes.data(), bytes.size(), {}).ok());  // the CPU accepts it
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
  ASSERT_TRUE(DecodeDeferred(encoding, device, {output, DType::kInt64, shape, Device::kCuda},
                             context_, status)
                  .ok());
  DeviceStatus read;
  std::memcpy(&read, DeviceMemory::Download(status, sizeof(read)).data(), sizeof(read));
  EXPECT_EQ(read.failures, kFailParams) << DescribeFailures(read.failures);
  const std::vector<uint8_t> decoded = DeviceMemory::Download(output, 256 * 8);
  EXPECT_EQ(decoded, std::vector<uint8_t>(256 * 8, 0));
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

#endif  // ACTPACK_WITH_CUDA

}  // namespace
}  // namespace actpack::codecs

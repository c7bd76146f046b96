// CPU and CUDA write the same bytes: every codec spec x dtype x shape x kind of data, encoded
// and decoded on both devices and compared byte for byte, and corrupt or truncated buffers
// refused on the device exactly as on the CPU.
//
// Without a GPU this runs on the CUDA emulator (bazel test --config=cudaemu), which executes
// the unchanged kernel source; on a GPU build it runs on the GPU. Without CUDA compiled in,
// every case skips and says why.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/codec.h"
#include "codecs/deferred.h"
#include "codecs/dtype.h"
#include "codecs/format.h"
#include "codecs/internal/eb_math.h"
#include "codecs/registry.h"
#include "codecs/testing/device_runner.h"
#include "codecs/testing/test_util.h"
#include "gtest/gtest.h"

#if ACTPACK_WITH_CUDA
#include <cuda_runtime_api.h>
#if defined(CUDAEMU)
#include "cudaemu/control.h"
#endif
#endif

namespace actpack::codecs {
namespace {

using testing::DeviceRunner;

// Every codec, each with the options that select different kernel paths.
const char* const kSpecs[] = {
    "identity",
    "quant1",
    "quant2",
    "quant4",
    "quant8",
    "quant:bits=2,group=64",
    "quant:bits=4,group=32",
    "cast:fp16",
    "cast:bf16",
    "mask",
    "pool4",
    "pool:k=3",
    "pool:k=64",
    "eb:rel=1e-2",
    "eb:rel=1e-4",
    "eb:abs=1e-3",
    "eb:abs=0.5",
    "division",
    "division:block=4,bits=4",
    "division:block=2,bits=1",
    "division:block=16,bits=8",
    "division_dct",
    "division_dct:keep=4,bits=4",
    "division_dct:keep=32,bits=8",
    "bitpack",
};

const DType kDTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

const std::vector<std::vector<int64_t>> kShapes = {
    {},              // 0-d
    {0},             // empty
    {4, 0, 3},       // empty with other dims
    {1},
    {31},            // less than a warp
    {257},           // one past a 256-value group
    {1000},
    {33, 129},       // past 32-value groups and 128-value blocks and 8 x 16 tiles
    {17, 16},        // tile rows exactly, columns one tile
    {2, 3, 17, 19},  // NCHW, H and W not multiples of 8
    {2, 16, 24, 24}, // NCHW, whole pooling windows
    {3, 130, 40},    // [batch, tokens, hidden]
};

enum class Data { kGaussian, kSmooth, kReluSparse, kOutliers, kConstant, kNonFinite, kZeroOrValue };

const char* DataName(Data d) {
  switch (d) {
    case Data::kGaussian: return "gaussian";
    case Data::kSmooth: return "smooth";
    case Data::kReluSparse: return "relu";
    case Data::kOutliers: return "outliers";
    case Data::kConstant: return "constant";
    case Data::kNonFinite: return "nonfinite";
    case Data::kZeroOrValue: return "zero_or_value";
  }
  return "?";
}

std::vector<float> MakeValues(Data kind, const std::vector<int64_t>& shape, uint32_t seed) {
  const uint64_t n = TensorSpec{DType::kFloat32, shape}.numel();
  std::vector<float> v = testing::Gaussian(n, seed);
  const uint64_t cols = shape.empty() ? 1 : std::max<int64_t>(1, shape.back());
  for (uint64_t i = 0; i < n; ++i) {
    const float r = static_cast<float>(i / cols), c = static_cast<float>(i % cols);
    switch (kind) {
      case Data::kGaussian: break;
      case Data::kSmooth: v[i] = std::sin(0.11f * r) * std::cos(0.07f * c) * 3.0f + 0.01f * v[i]; break;
      case Data::kReluSparse: v[i] = v[i] > 0.3f ? v[i] : 0.0f; break;
      case Data::kOutliers: v[i] = (i % 97 == 5) ? 1e4f * (1 + v[i]) : 0.05f * v[i] + 0.001f * c; break;
      case Data::kConstant: v[i] = -2.5f; break;
      case Data::kNonFinite: break;
      case Data::kZeroOrValue: v[i] = v[i] > 0 ? 1.5f : 0.0f; break;
    }
  }
  if (kind == Data::kNonFinite && n >= 3) {
    v[0] = std::numeric_limits<float>::quiet_NaN();
    v[n / 2] = std::numeric_limits<float>::infinity();
    v[n - 1] = -std::numeric_limits<float>::infinity();
  }
  return v;
}

struct Case {
  std::string spec;
  DType dtype;
  std::vector<int64_t> shape;
  Data data;
};

const DType kIntegerDTypes[] = {DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32,
                                DType::kInt64};

// Integers for `bitpack`, from the same draws: Gaussian values scaled by 2^(w - 5) for a w-bit
// dtype (about 5 to 62 bits wide: past 32 for int64), max_pool-like indices (smooth:
// 0 .. 999 where the dtype holds them), the dtype's extremes among small values (outliers: the
// full width, 64 bits for int64) and one value (constant: no payload).
std::vector<uint8_t> MakeIntegers(const Case& c, const std::vector<float>& values) {
  const size_t width = ElementSize(c.dtype);
  const bool is_signed = c.dtype != DType::kUInt8;
  const int64_t highest = static_cast<int64_t>((uint64_t{1} << (8 * width - is_signed)) - 1);
  const int64_t lowest = is_signed ? -highest - 1 : 0;
  const double scale = std::ldexp(1.0, 8 * static_cast<int>(width) - 5);
  std::vector<uint8_t> bytes(values.size() * width);
  for (size_t i = 0; i < values.size(); ++i) {
    int64_t v = 0;
    switch (c.data) {
      case Data::kGaussian: {
        const double x = std::abs(static_cast<double>(values[i])) * scale;
        v = static_cast<int64_t>(std::min(x, std::ldexp(1.0, 8 * static_cast<int>(width) - 2)));
        if (is_signed && values[i] < 0) v = -v;
        break;
      }
      case Data::kSmooth: {
        const uint64_t values = std::min<uint64_t>(1000, static_cast<uint64_t>(highest) + 1);
        v = static_cast<int64_t>((i * 37 + i / 7) % values);
        break;
      }
      case Data::kOutliers:
        v = i % 97 == 5 ? highest : i % 89 == 3 ? lowest : static_cast<int64_t>(i % 13);
        break;
      default:  // kConstant
        v = highest - 3;
    }
    std::memcpy(bytes.data() + i * width, &v, width);  // little-endian: the low bytes
  }
  return bytes;
}

// The bytes of a case's tensor: floats rounded to the dtype; integers for bitpack; or for the
// integer and bool dtypes `mask` takes, zeros and one other value.
std::vector<uint8_t> MakeInput(const Case& c, uint32_t seed) {
  const std::vector<float> values = MakeValues(c.data, c.shape, seed);
  if (IsLossyFloat(c.dtype)) return testing::ToBytes(values, c.dtype);
  if (c.spec == "bitpack") return MakeIntegers(c, values);
  const size_t width = ElementSize(c.dtype);
  std::vector<uint8_t> bytes(values.size() * width, 0);
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i] != 0) bytes[i * width] = c.dtype == DType::kBool ? 1 : 7;
    if (values[i] != 0 && width > 1) bytes[i * width + width - 1] = 0x40;
  }
  return bytes;
}

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string name = absl::StrCat(
      info.param.spec, "_", DTypeName(info.param.dtype), "_",
      info.param.shape.empty() ? std::string("scalar") : absl::StrJoin(info.param.shape, "x"),
      "_", DataName(info.param.data));
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (const char* spec : kSpecs) {
    const bool mask = std::string(spec) == "mask";
    if (std::string(spec) == "bitpack") {  // integers only (floats: refused, as conformance shows)
      for (DType dtype : kIntegerDTypes) {
        for (const auto& shape : kShapes) {
          for (Data data : {Data::kGaussian, Data::kSmooth, Data::kOutliers, Data::kConstant}) {
            cases.push_back({spec, dtype, shape, data});
          }
        }
      }
      continue;
    }
    std::vector<DType> dtypes(std::begin(kDTypes), std::end(kDTypes));
    if (mask) {
      for (DType d : {DType::kBool, DType::kUInt8, DType::kInt8, DType::kInt16, DType::kInt32}) {
        dtypes.push_back(d);
      }
    }
    for (DType dtype : dtypes) {
      for (const auto& shape : kShapes) {
        if (mask) {
          cases.push_back({spec, dtype, shape, Data::kZeroOrValue});
          cases.push_back({spec, dtype, shape, Data::kConstant});
          continue;
        }
        for (Data data : {Data::kGaussian, Data::kSmooth, Data::kReluSparse, Data::kOutliers,
                          Data::kConstant, Data::kNonFinite}) {
          cases.push_back({spec, dtype, shape, data});
        }
      }
    }
  }
  return cases;
}

class CudaIdentityTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    cpu_ = new DeviceRunner(Device::kCpu);
    cuda_ = new DeviceRunner(Device::kCuda);
  }
  static void TearDownTestSuite() {
    delete cpu_;
    delete cuda_;
  }

  void SetUp() override {
    if (!cuda_->available()) GTEST_SKIP() << cuda_->why_unavailable();
    absl::StatusOr<CodecParams> params = ParseCodecSpec(GetParam().spec);
    ASSERT_TRUE(params.ok()) << params.status();
    params_ = *params;
    params_.seed = 11;
    input_ = MakeInput(GetParam(), 5);
  }

  static DeviceRunner* cpu_;
  static DeviceRunner* cuda_;
  CodecParams params_;
  std::vector<uint8_t> input_;
};

DeviceRunner* CudaIdentityTest::cpu_ = nullptr;
DeviceRunner* CudaIdentityTest::cuda_ = nullptr;

// The codecs whose encode decides its size on the device (eb, bitpack) encode on CUDA as the
// runtime does: placed in a target sized before the host knows their size (here the CPU's
// size, exactly), and decoded before the host has read the encode's status (the decoder reads
// what the data decided on the device), which gives the CPU's output too.
TEST_P(CudaIdentityTest, EncodeAndDecodeAreByteIdentical) {
  const Case& c = GetParam();
  absl::StatusOr<std::vector<uint8_t>> on_cpu = cpu_->Encode(input_, c.dtype, c.shape, params_);
  const bool sized_on_device = params_.codec == CodecId::kEb || params_.codec == CodecId::kBitpack;
  std::vector<uint8_t> unresolved;
  uint64_t failures = ~uint64_t{0};
  absl::StatusOr<std::vector<uint8_t>> on_cuda =
      sized_on_device && on_cpu.ok()
          ? cuda_->EncodePlaced(input_, c.dtype, c.shape, params_, on_cpu->size(), &unresolved,
                                &failures)
          : cuda_->Encode(input_, c.dtype, c.shape, params_);
  ASSERT_EQ(on_cpu.status(), on_cuda.status());
  if (!on_cpu.ok()) return;  // refused alike (an unsupported dtype, non-finite data)
  ASSERT_EQ(on_cpu->size(), on_cuda->size());
  for (size_t i = 0; i < on_cpu->size(); ++i) {
    ASSERT_EQ((*on_cpu)[i], (*on_cuda)[i]) << "first differing byte " << i << " of "
                                           << on_cpu->size();
  }
  std::vector<uint8_t> decoded_cpu, decoded_cuda;
  const absl::Status cpu_status =
      cpu_->Decode(*on_cpu, on_cpu->size(), c.dtype, c.shape, &decoded_cpu);
  const absl::Status cuda_status =
      cuda_->Decode(*on_cuda, on_cuda->size(), c.dtype, c.shape, &decoded_cuda);
  ASSERT_TRUE(cpu_status.ok()) << cpu_status;
  ASSERT_TRUE(cuda_status.ok()) << cuda_status;
  for (size_t i = 0; i < decoded_cpu.size(); ++i) {
    ASSERT_EQ(decoded_cpu[i], decoded_cuda[i]) << "first differing output byte " << i;
  }
  if (!sized_on_device) return;
  EXPECT_EQ(failures, 0u) << DescribeFailures(failures);
  for (size_t i = 0; i < decoded_cpu.size(); ++i) {
    ASSERT_EQ(decoded_cpu[i], unresolved[i]) << "first differing byte " << i
                                             << " of the unresolved decode";
  }
}

TEST_P(CudaIdentityTest, CorruptAndTruncatedBuffersAreRefusedAlike) {
  const Case& c = GetParam();
  if (c.data != Data::kGaussian && c.data != Data::kZeroOrValue) {
    GTEST_SKIP() << "one kind of data per shape is enough for corruptions";
  }
  absl::StatusOr<std::vector<uint8_t>> buffer = cpu_->Encode(input_, c.dtype, c.shape, params_);
  if (!buffer.ok()) GTEST_SKIP() << buffer.status();
  std::vector<uint8_t> out_cpu, out_cuda;
  // Truncations: every short prefix, then a spread.
  const size_t step = std::max<size_t>(1, buffer->size() / 23);
  for (size_t size = 0; size < buffer->size(); size += size < 80 ? 1 : step) {
    const absl::Status on_cpu = cpu_->Decode(*buffer, size, c.dtype, c.shape, &out_cpu);
    const absl::Status on_cuda = cuda_->Decode(*buffer, size, c.dtype, c.shape, &out_cuda);
    ASSERT_EQ(on_cpu.code(), absl::StatusCode::kDataLoss) << size << ": " << on_cpu;
    ASSERT_EQ(on_cpu, on_cuda) << "prefix of " << size << " bytes";
  }
  // Flipped bytes in the header and across the payload.
  for (size_t at : {size_t{0}, size_t{5}, size_t{9}, size_t{20}, kHeaderSize - 1, kHeaderSize,
                    kHeaderSize + 3, buffer->size() / 2, buffer->size() - 1}) {
    if (at >= buffer->size()) continue;
    std::vector<uint8_t> corrupt = *buffer;
    corrupt[at] ^= 0x5A;
    const absl::Status on_cpu = cpu_->Decode(corrupt, corrupt.size(), c.dtype, c.shape, &out_cpu);
    const absl::Status on_cuda =
        cuda_->Decode(corrupt, corrupt.size(), c.dtype, c.shape, &out_cuda);
    ASSERT_FALSE(on_cpu.ok()) << "byte " << at;
    ASSERT_EQ(on_cpu, on_cuda) << "byte " << at;
    const absl::StatusOr<Header> verified_cpu = cpu_->Verify(corrupt, corrupt.size());
    const absl::StatusOr<Header> verified_cuda = cuda_->Verify(corrupt, corrupt.size());
    ASSERT_EQ(verified_cpu.status(), verified_cuda.status()) << "byte " << at;
  }
}

INSTANTIATE_TEST_SUITE_P(AllSpecs, CudaIdentityTest, ::testing::ValuesIn(AllCases()), CaseName);

// Every codec of the registry is compared here: a codec registered without cases fails.
TEST(CudaIdentityOtherTest, EveryRegisteredCodecHasCases) {
  std::set<CodecId> covered;
  for (const char* spec : kSpecs) covered.insert(ParseCodecSpec(spec)->codec);
  for (const Codec* codec : AllCodecs()) {
    EXPECT_EQ(covered.count(codec->id()), 1u) << codec->name() << " has no identity cases";
  }
}

// Float32 `values` of `shape` under `spec`: the same encoding from both devices, which both
// decode to the same bytes.
void ExpectSameBytes(DeviceRunner& cpu, DeviceRunner& cuda, const std::vector<float>& values,
                     const std::vector<int64_t>& shape, const char* spec) {
  const std::string what = absl::StrCat(spec, " [", absl::StrJoin(shape, ","), "]");
  absl::StatusOr<CodecParams> params = ParseCodecSpec(spec);
  ASSERT_TRUE(params.ok()) << what << ": " << params.status();
  const std::vector<uint8_t> input = testing::ToBytes(values, DType::kFloat32);
  absl::StatusOr<std::vector<uint8_t>> a = cpu.Encode(input, DType::kFloat32, shape, *params);
  absl::StatusOr<std::vector<uint8_t>> b = cuda.Encode(input, DType::kFloat32, shape, *params);
  ASSERT_TRUE(a.ok()) << what << ": " << a.status();
  ASSERT_TRUE(b.ok()) << what << ": " << b.status();
  ASSERT_TRUE(*a == *b) << what;
  std::vector<uint8_t> out_a, out_b;
  ASSERT_TRUE(cpu.Decode(*a, a->size(), DType::kFloat32, shape, &out_a).ok()) << what;
  ASSERT_TRUE(cuda.Decode(*b, b->size(), DType::kFloat32, shape, &out_b).ok()) << what;
  ASSERT_TRUE(out_a == out_b) << what;
}

// division_dct's forward kernel cuts a plane into chunks of channels and tiles of columns, and
// its kernels keep an axis' cosines in shared memory only where they fit: shapes past each of
// these limits encode and decode to the CPU's bytes. [2, 9, 300] has two chunks of channels at
// keep 1 (256 a block) and five at keep 32 (64); [1, 1, 5, 1100] four tiles of 256 columns and,
// at keep 32, 31 x 1100 column cosines (past a table's 2048); [3, 600, 2] the same along the
// tokens (rows), with 150 frequencies a quarter of the axis but keep's 32 kept.
TEST(CudaIdentityDivisionDctTest, ChunksTilesAndLongAxes) {
  DeviceRunner cpu(Device::kCpu), cuda(Device::kCuda);
  if (!cuda.available()) GTEST_SKIP() << cuda.why_unavailable();
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{2, 9, 300}, {1, 1, 5, 1100}, {3, 600, 2}}) {
    for (const char* spec : {"division_dct", "division_dct:keep=32,bits=2"}) {
      ExpectSameBytes(cpu, cuda, MakeValues(Data::kSmooth, shape, 5), shape, spec);
    }
  }
}

// One tensor of 16 MiB (float32, [64, 256, 256]) through the codecs the runtime uses most:
// grids of thousands of blocks, chunk indexes past one block of the scan.
TEST(CudaIdentityLargeTest, SixteenMebibytes) {
  DeviceRunner cpu(Device::kCpu), cuda(Device::kCuda);
  if (!cuda.available()) GTEST_SKIP() << cuda.why_unavailable();
  const std::vector<int64_t> shape = {64, 256, 256};
  const std::vector<float> values = MakeValues(Data::kSmooth, shape, 9);
  ASSERT_GE(values.size() * 4, size_t{16} << 20);
  for (const char* spec : {"quant2", "eb:rel=1e-3", "division", "division_dct"}) {
    ExpectSameBytes(cpu, cuda, values, shape, spec);
  }
}

// division's vector residual kernel takes two groups a warp, a half-warp each: an odd number of
// groups leaves the last pair's second half without one, and a group whose residual range
// overflows is counted alone, not with the other group of its pair (the refusal names the
// count). Three planes of one group ([1, 3, 8, 16]: 128 values a plane); the overflow in plane
// 0's first window (3.4e38 after a window sum that stays finite: its mean is -5e36). A window
// mean out of bfloat16's reach is counted once, apart.
TEST(CudaIdentityDivisionTest, PairsOfGroupsInHalfWarps) {
  DeviceRunner cpu(Device::kCpu), cuda(Device::kCuda);
  if (!cuda.available()) GTEST_SKIP() << cuda.why_unavailable();
  const std::vector<int64_t> shape = {1, 3, 8, 16};
  for (const char* spec : {"division", "division:block=4,bits=4", "division:block=16,bits=8"}) {
    const CodecParams params = *ParseCodecSpec(spec);
    // Refused by both devices alike, the refusal saying `what`.
    auto refused_alike = [&](const std::vector<float>& values, const char* what) {
      const std::vector<uint8_t> bytes = testing::ToBytes(values, DType::kFloat32);
      const absl::StatusOr<std::vector<uint8_t>> a = cpu.Encode(bytes, DType::kFloat32, shape, params);
      const absl::StatusOr<std::vector<uint8_t>> b = cuda.Encode(bytes, DType::kFloat32, shape, params);
      ASSERT_FALSE(a.ok()) << spec;
      EXPECT_NE(std::string(a.status().message()).find(what), std::string::npos)
          << spec << ": " << a.status();
      EXPECT_EQ(a.status(), b.status()) << spec;
    };
    for (const DType dtype : {DType::kFloat32, DType::kBFloat16}) {
      std::vector<float> values = MakeValues(Data::kGaussian, shape, 3);
      const std::vector<uint8_t> input = testing::ToBytes(values, dtype);
      absl::StatusOr<std::vector<uint8_t>> a = cpu.Encode(input, dtype, shape, params);
      absl::StatusOr<std::vector<uint8_t>> b = cuda.Encode(input, dtype, shape, params);
      ASSERT_TRUE(a.ok()) << spec << ": " << a.status();
      ASSERT_TRUE(b.ok()) << spec << ": " << b.status();
      ASSERT_TRUE(*a == *b) << spec;
      if (dtype != DType::kFloat32) continue;  // bfloat16 rounds 3.4e38 to infinity
      values[0] = 3.4e38f;
      values[1] = -3.4e38f;
      values[2] = -3.2e38f;
      for (int i = 3; i < 16; ++i) values[i] = 0.0f;  // the window's first row
      refused_alike(values, " in 1 groups");
      // A window whose sum overflows (plane 1's first, 3e38 in its first row): its mean is out
      // of bfloat16's reach, counted apart from the groups (the refusal says which).
      values = MakeValues(Data::kGaussian, shape, 3);
      for (int i = 128; i < 136; ++i) values[i] = 3e38f;
      refused_alike(values, "window means overflow");
    }
  }
}

#if defined(CUDAEMU)
// eb's encode finds where each chunk's data starts by looking back at the chunks before it.
// Whatever order the blocks run in (forward: every chunk before done; reverse: none, so each
// looks back through chunks with no state yet and quantizes them itself; random: a mix;
// concurrent: blocks at once on host threads, publishing while others look back, as on a GPU,
// where a warp whose lanes each waited on a chunk's state parted ways on an H200), the
// bytes are the CPU's. 48 chunks, so look-backs span more than one window of 32 chunks; values
// past the code range and NaNs make outliers in most chunks, listed after the data of all. The
// buffers decode to the CPU's values.
TEST(CudaIdentityEbTest, EveryBlockOrderWritesTheCpuBytes) {
  DeviceRunner cpu(Device::kCpu), cuda(Device::kCuda);
  if (!cuda.available()) GTEST_SKIP() << cuda.why_unavailable();
  const std::string saved = cudaemu::ScheduleName();
  const CodecParams params = *ParseCodecSpec("eb:abs=1e-4");
  const std::pair<std::vector<int64_t>, DType> cases[] = {
      {{48, 64, 64}, DType::kFloat32},        // 8 x 16 tiles, 32 a plane
      {{48 * 4096 + 77}, DType::kBFloat16}};  // 1-D blocks of 128, a partial last chunk
  for (const auto& [shape, dtype] : cases) {
    std::vector<float> values = MakeValues(Data::kOutliers, shape, 4);
    if (shape.size() == 1) {  // a ramp: runs the row predictor chooses, residuals not 0
      for (size_t i = 0; i < values.size(); ++i) {
        if (i % 97 != 5) values[i] = 0.01f * static_cast<float>(i % 1000);
      }
    }
    for (size_t i = 3; i < values.size(); i += 4099) {
      values[i] = std::numeric_limits<float>::quiet_NaN();
    }
    const std::vector<uint8_t> input = testing::ToBytes(values, dtype);
    absl::StatusOr<std::vector<uint8_t>> expected = cpu.Encode(input, dtype, shape, params);
    ASSERT_TRUE(expected.ok()) << expected.status();
    std::vector<std::string> schedules = {"forward", "reverse", "random:1", "random:2"};
    if (cudaemu::ConcurrentScheduleAvailable()) {
      for (int run = 0; run < 4; ++run) schedules.push_back("concurrent:8");
      schedules.push_back("concurrent:3");
    }
    for (const std::string& schedule : schedules) {
      cudaemu::SetSchedule(schedule);
      absl::StatusOr<std::vector<uint8_t>> encoded = cuda.Encode(input, dtype, shape, params);
      cudaemu::SetSchedule(saved);
      ASSERT_TRUE(encoded.ok()) << schedule << ": " << encoded.status();
      ASSERT_EQ(encoded->size(), expected->size()) << schedule;
      for (size_t i = 0; i < expected->size(); ++i) {
        ASSERT_EQ((*encoded)[i], (*expected)[i])
            << schedule << ": first differing byte " << i << " of " << expected->size();
      }
    }
    // The decode too.
    std::vector<uint8_t> on_cpu, on_cuda;
    ASSERT_TRUE(cpu.Decode(*expected, expected->size(), dtype, shape, &on_cpu).ok());
    ASSERT_TRUE(cuda.Decode(*expected, expected->size(), dtype, shape, &on_cuda).ok());
    ASSERT_TRUE(on_cpu == on_cuda) << DTypeName(dtype) << ": the decodes differ";
  }
}
#endif  // CUDAEMU

// eb buffers forged past the checksum (recomputed over the forgery): a block header no encoder
// writes, chunk index entries a word off, outliers out of order or past the blocks, an
// outlier's raw bits wider than its half. The CPU refuses each, and so must the device: its own
// checks of the buffer (EbValidateKernel, EbValidateOutliersKernel) are what read the blocks
// and outliers of a decode into device memory, and a decode that skipped one succeeds.
TEST(CudaIdentityEbTest, ForgedBuffersAreRefusedOnTheDevice) {
  DeviceRunner cpu(Device::kCpu), cuda(Device::kCuda);
  if (!cuda.available()) GTEST_SKIP() << cuda.why_unavailable();
  const std::vector<int64_t> shape = {2, 16, 24, 24};  // 8 x 16 tiles: 192 blocks, 6 chunks
  const CodecParams params = *ParseCodecSpec("eb:abs=1e-4");
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    const std::vector<uint8_t> input =
        testing::ToBytes(MakeValues(Data::kOutliers, shape, 4), dtype);
    absl::StatusOr<std::vector<uint8_t>> buffer = cpu.Encode(input, dtype, shape, params);
    ASSERT_TRUE(buffer.ok()) << buffer.status();
    const absl::StatusOr<Header> header = ParseHeader(buffer->data(), buffer->size());
    ASSERT_TRUE(header.ok()) << header.status();
    uint64_t outliers;
    std::memcpy(&outliers, header->params.data() + 16, 8);
    ASSERT_GE(outliers, 2u) << DTypeName(dtype);
    const eb_math::Layout l = eb_math::MakeLayout(2, 32, 24, 24);
    const uint64_t fixed = eb_math::SectionsOf(l, 0, outliers).fixed_words;
    const eb_math::Sections s =
        eb_math::SectionsOf(l, header->payload_size / 4 - fixed, outliers);
    const uint64_t far_past = uint64_t{1} << 40;  // a block whose header would be far away
    struct Forgery {
      const char* name;
      std::function<void(uint32_t*)> forge;
    };
    std::vector<Forgery> forgeries = {
        {"a block header 31 bits wide",
         [](uint32_t* w) { w[0] = eb_math::HeaderWord(eb_math::kOffset, 31, 0); }},
        {"a block header's anchor past the codes (its size unchanged)",
         [](uint32_t* w) { w[0] = (w[0] & 0x7fu) | (eb_math::kMaxAnchor + 1) << 7; }},
        {"the first chunk's index entry not 0", [&](uint32_t* w) { w[s.index] += 1; }},
        {"the second chunk's index entry a word on", [&](uint32_t* w) { w[s.index + 2] += 1; }},
        {"the first two outliers swapped",
         [&](uint32_t* w) {
           std::swap(w[s.slots], w[s.slots + 2]);
           std::swap(w[s.slots + 1], w[s.slots + 3]);
         }},
        {"the last outlier far past the blocks",
         [&](uint32_t* w) {
           w[s.slots + 2 * (outliers - 1)] = static_cast<uint32_t>(far_past);
           w[s.slots + 2 * (outliers - 1) + 1] = static_cast<uint32_t>(far_past >> 32);
         }},
    };
    if (dtype == DType::kFloat16) {
      forgeries.push_back({"an outlier's raw bits past 16", [&](uint32_t* w) { w[s.raw] |= 1u << 16; }});
    }
    for (const Forgery& f : forgeries) {
      std::vector<uint8_t> bytes = *buffer;
      f.forge(reinterpret_cast<uint32_t*>(bytes.data() + kHeaderSize));
      Header forged = *header;
      forged.checksum = CombineChecksum(
          HeaderChecksum(forged), PayloadChecksum(bytes.data() + kHeaderSize, forged.payload_size));
      WriteHeader(forged, bytes.data());
      std::vector<uint8_t> out_cpu, out_cuda;
      const absl::Status on_cpu = cpu.Decode(bytes, bytes.size(), dtype, shape, &out_cpu);
      const absl::Status on_cuda = cuda.Decode(bytes, bytes.size(), dtype, shape, &out_cuda);
      EXPECT_EQ(on_cpu.code(), absl::StatusCode::kDataLoss) << f.name << ": " << on_cpu;
      EXPECT_EQ(on_cuda.code(), absl::StatusCode::kDataLoss) << f.name << ": " << on_cuda;
    }
  }
}

#if ACTPACK_WITH_CUDA
// Every byte a codec uses on the device comes from the caller: its output buffer and the
// ExecContext's scratch allocator (the runtime's is the budgeted pool). Nothing is cudaMalloc'ed
// behind the budget's back, not even once per thread (it was: 2 MiB per thread and device).
TEST(CudaScratchTest, EncodeAndDecodeTakeNoDeviceMemoryOfTheirOwn) {
  DeviceRunner cuda(Device::kCuda);
  if (!cuda.available()) GTEST_SKIP() << cuda.why_unavailable();
  const std::vector<int64_t> shape = {8, 300};
  const std::vector<uint8_t> gaussian =
      testing::ToBytes(MakeValues(Data::kGaussian, shape, 1), DType::kFloat32);
  const std::vector<uint8_t> zero_or_value =
      testing::ToBytes(MakeValues(Data::kZeroOrValue, shape, 1), DType::kFloat32);
  const std::vector<uint8_t> integers =
      MakeInput({"bitpack", DType::kInt32, shape, Data::kGaussian}, 1);
  for (const char* spec : kSpecs) {
    absl::StatusOr<CodecParams> params = ParseCodecSpec(spec);
    ASSERT_TRUE(params.ok());
    const std::vector<uint8_t>& input = std::string(spec) == "mask"      ? zero_or_value
                                        : std::string(spec) == "bitpack" ? integers
                                                                         : gaussian;
    // A dtype the codec takes, 4 bytes per element: int32 for bitpack.
    const DType dtype = std::string(spec) == "bitpack" ? DType::kInt32 : DType::kFloat32;
    const int64_t scratch_before = cuda.scratch_allocations();
    std::thread fresh([&] {  // per-thread state would show on a thread's first call
      void *in = nullptr, *buffer = nullptr, *out = nullptr;
      const size_t capacity = *MaxEncodedSize({dtype, shape}, *params);
      ASSERT_EQ(cudaMalloc(&in, input.size()), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&buffer, capacity), cudaSuccess);
      ASSERT_EQ(cudaMalloc(&out, input.size()), cudaSuccess);
      ASSERT_EQ(cudaMemcpy(in, input.data(), input.size(), cudaMemcpyHostToDevice), cudaSuccess);
      size_t free_before = 0, free_after = 0, total = 0;
      ASSERT_EQ(cudaMemGetInfo(&free_before, &total), cudaSuccess);
      const ExecContext& context = cuda.context();
      absl::StatusOr<size_t> used =
          Encode({in, dtype, shape, Device::kCuda}, *params,
                 static_cast<uint8_t*>(buffer), capacity, context);
      ASSERT_TRUE(used.ok()) << spec << ": " << used.status();
      ASSERT_TRUE(Decode(static_cast<uint8_t*>(buffer), *used,
                         {out, dtype, shape, Device::kCuda}, context)
                      .ok())
          << spec;
      ASSERT_EQ(cudaMemGetInfo(&free_after, &total), cudaSuccess);
      EXPECT_EQ(free_after, free_before) << spec;
      cudaFree(in);
      cudaFree(buffer);
      cudaFree(out);
    });
    fresh.join();
    EXPECT_GT(cuda.scratch_allocations(), scratch_before) << spec << " took no counters?";
  }
}

// Out of memory is kResourceExhausted all the way up (the plugin turns it into
// torch.OutOfMemoryError), whether the budget or the device ran out.
TEST(CudaScratchTest, ScratchOutOfMemoryIsResourceExhausted) {
  DeviceRunner cuda(Device::kCuda);
  if (!cuda.available()) GTEST_SKIP() << cuda.why_unavailable();
  class Full final : public ScratchAllocator {
   public:
    absl::StatusOr<void*> Allocate(size_t, void*) override {
      return absl::ResourceExhaustedError("test: the budget is full");
    }
    void Deallocate(void*, size_t, void*) override {}
  } full;
  ExecContext context = cuda.context();
  context.scratch = &full;
  const std::vector<int64_t> shape = {4, 256};
  const std::vector<uint8_t> input =
      testing::ToBytes(MakeValues(Data::kGaussian, shape, 3), DType::kFloat32);
  void *in = nullptr, *buffer = nullptr;
  const std::vector<const char*> specs = {"quant2", "eb:rel=1e-2", "identity"};
  size_t capacity = 0;  // room for any of them: too little would fail before the scratch is asked
  for (const char* spec : specs) {
    capacity = std::max(capacity, *MaxEncodedSize({DType::kFloat32, shape}, *ParseCodecSpec(spec)));
  }
  ASSERT_EQ(cudaMalloc(&in, input.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&buffer, capacity), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(in, input.data(), input.size(), cudaMemcpyHostToDevice), cudaSuccess);
  for (const char* spec : specs) {
    absl::StatusOr<size_t> used = Encode({in, DType::kFloat32, shape, Device::kCuda},
                                         *ParseCodecSpec(spec), static_cast<uint8_t*>(buffer),
                                         capacity, context);
    ASSERT_FALSE(used.ok()) << spec;
    EXPECT_EQ(used.status().code(), absl::StatusCode::kResourceExhausted) << used.status();
    EXPECT_NE(used.status().message().find("the budget is full"), absl::string_view::npos);
  }
  // Without any scratch allocator the CUDA path says what it needs.
  context.scratch = nullptr;
  absl::StatusOr<size_t> used = Encode({in, DType::kFloat32, shape, Device::kCuda},
                                       *ParseCodecSpec("quant2"), static_cast<uint8_t*>(buffer),
                                       capacity, context);
  ASSERT_FALSE(used.ok());
  EXPECT_EQ(used.status().code(), absl::StatusCode::kInvalidArgument) << used.status();
  cudaFree(in);
  cudaFree(buffer);
}
#endif

}  // namespace
}  // namespace actpack::codecs

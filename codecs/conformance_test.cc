// One conformance suite over every codec spec the registry parses: codec x dtype x shape x
// device (the CPU, and CUDA: a GPU, or the CUDA emulator under --config=cudaemu).
//
// Every case encodes a tensor through the public Encode/Decode and checks what every codec
// promises: the decoded shape and dtype, finite values where the input was finite, an error
// within the codec's own bound (exact for the lossless ones, the stated bound for eb, a loose
// relative bound for the lossy ones), non-finite inputs either refused (kFailedPrecondition, the
// runtime keeps the tensor exact) or decoded exactly, all-equal and denormal data, and every
// truncation of the buffer refused with kDataLoss. Shapes include empty and 0-d tensors and sizes
// that are not multiples of any group, block or window. Codec-specific properties (unbiasedness,
// byte formats, CPU/CUDA identity) live in each codec's own test. Inputs here are contiguous:
// non-contiguous saved tensors are laid out by the plugin (tests/test_integrations.py).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/codec.h"
#include "codecs/dtype.h"
#include "codecs/internal/portable.h"
#include "codecs/registry.h"
#include "codecs/testing/device_runner.h"
#include "codecs/testing/test_util.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

using testing::ToBytes;
using testing::ToFloats;

// How a codec's decoded values relate to its input.
enum class Fidelity {
  kExact,        // bit for bit
  kCast,         // the input rounded to the cast type
  kErrorBound,   // eb: within the bound (absolute, or relative to the finite range)
  kLossy,        // a relative RMS error below `loose`
};

struct SpecCase {
  std::string spec;
  Fidelity fidelity;
  double loose = 0;            // kLossy: largest relative RMS error accepted
  bool zero_or_value = false;  // mask: the data must be {0, v}
};

const std::vector<SpecCase>& Specs() {
  static const auto* specs = new std::vector<SpecCase>{
      {"identity", Fidelity::kExact},
      {"quant8", Fidelity::kLossy, 0.02},
      {"quant4", Fidelity::kLossy, 0.2},
      {"quant2", Fidelity::kLossy, 1.0},
      {"quant1", Fidelity::kLossy, 1.5},
      {"quant:bits=2,group=64", Fidelity::kLossy, 1.0},
      {"cast:fp16", Fidelity::kCast},
      {"cast:bf16", Fidelity::kCast},
      {"mask", Fidelity::kExact, 0, true},
      {"pool4", Fidelity::kLossy, 1.5},
      {"eb:rel=1e-2", Fidelity::kErrorBound},
      {"eb:abs=0.01", Fidelity::kErrorBound},
      {"division", Fidelity::kLossy, 1.0},
      {"division:block=4,bits=4", Fidelity::kLossy, 0.3},
      {"division_fft", Fidelity::kLossy, 1.0},
  };
  return *specs;
}

const std::vector<DType> kDTypes = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

const std::vector<std::vector<int64_t>> kShapes = {
    {},               // 0-d: one value
    {0},              // empty
    {3, 0, 5},        // empty with other dims
    {1},
    {7},
    {257},            // one past a 256-value group
    {3, 5},
    {33, 129},        // past 32- and 128-value blocks
    {2, 3, 17, 19},   // NCHW, H and W not multiples of 8
    {4, 1, 9, 9},
    {2, 130, 6},      // [batch, tokens, hidden]
};

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Smooth-ish activation-like data with ReLU zeros: what saved tensors look like.
std::vector<float> Activations(uint64_t n, uint32_t seed, bool zero_or_value) {
  std::vector<float> values(n);
  uint32_t state = seed * 2654435761u + 1;
  for (uint64_t i = 0; i < n; ++i) {
    state = state * 1664525u + 1013904223u;
    const float noise = static_cast<float>(state >> 8) / static_cast<float>(1 << 24) - 0.5f;
    const float v = std::sin(0.05f * static_cast<float>(i)) + 0.5f * noise;
    values[i] = zero_or_value ? (v > 0 ? 1.5f : 0.0f) : (v < -0.6f ? 0.0f : v);
  }
  return values;
}

struct Case {
  SpecCase spec;
  DType dtype;
  std::vector<int64_t> shape;
  Device device;
};

std::string CaseName(const ::testing::TestParamInfo<Case>& info) {
  std::string name = absl::StrCat(
      info.param.device == Device::kCuda ? "cuda_" : "", info.param.spec.spec, "_",
      DTypeName(info.param.dtype), "_",
      info.param.shape.empty() ? std::string("scalar") : absl::StrJoin(info.param.shape, "x"));
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  }
  return name;
}

std::vector<Case> AllCases() {
  std::vector<Case> cases;
  for (Device device : {Device::kCpu, Device::kCuda}) {
    for (const SpecCase& spec : Specs()) {
      // division_fft has no CUDA kernel (cuda_identity_test checks that it says so).
      if (device == Device::kCuda && spec.spec == "division_fft") continue;
      for (DType dtype : kDTypes) {
        for (const auto& shape : kShapes) cases.push_back({spec, dtype, shape, device});
      }
    }
  }
  return cases;
}

class CodecConformanceTest : public ::testing::TestWithParam<Case> {
 protected:
  static void SetUpTestSuite() {
    cpu_ = new testing::DeviceRunner(Device::kCpu);
    cuda_ = new testing::DeviceRunner(Device::kCuda);
  }
  static void TearDownTestSuite() {
    delete cpu_;
    delete cuda_;
  }

  void SetUp() override {
    runner_ = GetParam().device == Device::kCuda ? cuda_ : cpu_;
    if (!runner_->available()) GTEST_SKIP() << runner_->why_unavailable();
    absl::StatusOr<CodecParams> params = ParseCodecSpec(GetParam().spec.spec);
    ASSERT_TRUE(params.ok()) << params.status();
    params_ = *params;
    params_.seed = 7;
    // A codec may not take every dtype (cast converts float32 only): then it says so, naming
    // the dtype, and there is nothing more to check.
    const absl::Status encodable =
        FindCodec(params_.codec)->CheckEncodable({GetParam().dtype, GetParam().shape}, params_);
    if (!encodable.ok()) {
      ASSERT_EQ(encodable.code(), absl::StatusCode::kInvalidArgument) << encodable;
      ASSERT_NE(encodable.message().find(DTypeName(GetParam().dtype)), absl::string_view::npos)
          << encodable;
      GTEST_SKIP() << encodable.message();
    }
  }

  // Encodes `input` on the case's device.
  absl::StatusOr<std::vector<uint8_t>> Encode(const std::vector<uint8_t>& input) {
    const Case& c = GetParam();
    return runner_->Encode(input, c.dtype, c.shape, params_);
  }

  // Decodes the first `size` bytes of `buffer` on the case's device; unwritten output shows.
  absl::Status Decode(const std::vector<uint8_t>& buffer, size_t size,
                      std::vector<uint8_t>& output) {
    const Case& c = GetParam();
    return runner_->Decode(buffer, size, c.dtype, c.shape, &output);
  }

  void ExpectFaithful(const std::vector<float>& in, const std::vector<float>& out) {
    const Case& c = GetParam();
    ASSERT_EQ(in.size(), out.size());
    double squared_error = 0, squared_norm = 0;
    float lo = std::numeric_limits<float>::infinity(), hi = -lo;
    for (float v : in) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_TRUE(std::isfinite(out[i])) << "element " << i << " decoded to " << out[i];
      const double error = static_cast<double>(out[i]) - in[i];
      squared_error += error * error;
      squared_norm += static_cast<double>(in[i]) * in[i];
      switch (c.spec.fidelity) {
        case Fidelity::kExact:
          ASSERT_EQ(out[i], in[i]) << "element " << i;
          break;
        case Fidelity::kCast: {
          const float rounded = params_.cast_to == DType::kFloat16
                                    ? portable::HalfToFloat(portable::FloatToHalf(in[i]))
                                    : portable::Bf16ToFloat(portable::FloatToBf16(in[i]));
          ASSERT_EQ(out[i], rounded) << "element " << i;
          break;
        }
        case Fidelity::kErrorBound: {
          const double bound = params_.eb_mode == EbMode::kAbsolute
                                   ? params_.error_bound
                                   : params_.error_bound * (static_cast<double>(hi) - lo);
          ASSERT_LE(std::abs(error), bound) << "element " << i << ": " << in[i] << " -> "
                                            << out[i];
          if (in[i] == 0) ASSERT_EQ(out[i], 0.0f) << "element " << i;
          if (in[i] != 0) ASSERT_EQ(std::signbit(out[i]), std::signbit(in[i])) << i;
          break;
        }
        case Fidelity::kLossy:
          break;
      }
    }
    if (c.spec.fidelity == Fidelity::kLossy && squared_norm > 0) {
      EXPECT_LE(std::sqrt(squared_error / squared_norm), c.spec.loose);
    }
  }

  static testing::DeviceRunner* cpu_;
  static testing::DeviceRunner* cuda_;
  testing::DeviceRunner* runner_ = nullptr;
  CodecParams params_;
};

testing::DeviceRunner* CodecConformanceTest::cpu_ = nullptr;
testing::DeviceRunner* CodecConformanceTest::cuda_ = nullptr;

TEST_P(CodecConformanceTest, RoundTripKeepsShapeAndTheCodecsBound) {
  const Case& c = GetParam();
  const std::vector<uint8_t> input =
      ToBytes(Activations(Numel(c.shape), 1, c.spec.zero_or_value), c.dtype);
  absl::StatusOr<std::vector<uint8_t>> buffer = Encode(input);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  absl::StatusOr<Header> header = runner_->Verify(*buffer, buffer->size());
  ASSERT_TRUE(header.ok()) << header.status();
  EXPECT_EQ(header->dtype, c.dtype);
  EXPECT_EQ(header->Shape(), c.shape);
  std::vector<uint8_t> output;
  ASSERT_TRUE(Decode(*buffer, buffer->size(), output).ok());
  ExpectFaithful(ToFloats(input, c.dtype), ToFloats(output, c.dtype));
}

TEST_P(CodecConformanceTest, AllEqualAndDenormalValues) {
  const Case& c = GetParam();
  const uint64_t n = Numel(c.shape);
  for (float value : {1.25f, 0.0f, -3.0f}) {
    if (c.spec.zero_or_value && value < 0) continue;
    const std::vector<uint8_t> input = ToBytes(std::vector<float>(n, value), c.dtype);
    absl::StatusOr<std::vector<uint8_t>> buffer = Encode(input);
    ASSERT_TRUE(buffer.ok()) << value << ": " << buffer.status();
    std::vector<uint8_t> output;
    ASSERT_TRUE(Decode(*buffer, buffer->size(), output).ok());
    ExpectFaithful(ToFloats(input, c.dtype), ToFloats(output, c.dtype));
  }
  // Denormals (float32): the lossy codecs' scales live in bfloat16/float16, where these flush,
  // so only absolute closeness is promised; no NaN, no Inf, no blow-up.
  if (c.dtype != DType::kFloat32 || c.spec.zero_or_value) return;
  std::vector<float> denormals(n);
  for (uint64_t i = 0; i < n; ++i) denormals[i] = (i % 3 == 0 ? -1e-40f : 3e-39f);
  const std::vector<uint8_t> input = ToBytes(denormals, c.dtype);
  absl::StatusOr<std::vector<uint8_t>> buffer = Encode(input);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<uint8_t> output;
  ASSERT_TRUE(Decode(*buffer, buffer->size(), output).ok());
  const std::vector<float> out = ToFloats(output, c.dtype);
  if (c.spec.fidelity != Fidelity::kLossy) {
    ExpectFaithful(denormals, out);
    return;
  }
  for (uint64_t i = 0; i < n; ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << i;
    ASSERT_LE(std::abs(out[i] - denormals[i]), 1e-37f) << i << ": " << out[i];
  }
}

TEST_P(CodecConformanceTest, NonFiniteValuesAreRefusedOrKeptExactly) {
  const Case& c = GetParam();
  const uint64_t n = Numel(c.shape);
  if (n < 3) GTEST_SKIP() << "needs room for NaN, +Inf and -Inf";
  std::vector<float> values = Activations(n, 2, false);
  values[0] = std::numeric_limits<float>::quiet_NaN();
  values[n / 2] = std::numeric_limits<float>::infinity();
  values[n - 1] = -std::numeric_limits<float>::infinity();
  const std::vector<uint8_t> input = ToBytes(values, c.dtype);
  absl::StatusOr<std::vector<uint8_t>> buffer = Encode(input);
  if (!buffer.ok()) {
    EXPECT_EQ(buffer.status().code(), absl::StatusCode::kFailedPrecondition) << buffer.status();
    return;
  }
  std::vector<uint8_t> output;
  ASSERT_TRUE(Decode(*buffer, buffer->size(), output).ok());
  const std::vector<float> out = ToFloats(output, c.dtype);
  EXPECT_TRUE(std::isnan(out[0]));
  EXPECT_EQ(out[n / 2], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[n - 1], -std::numeric_limits<float>::infinity());
}

TEST_P(CodecConformanceTest, EveryTruncationIsDataLoss) {
  const Case& c = GetParam();
  const std::vector<uint8_t> input =
      ToBytes(Activations(Numel(c.shape), 3, c.spec.zero_or_value), c.dtype);
  absl::StatusOr<std::vector<uint8_t>> buffer = Encode(input);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  std::vector<uint8_t> output;
  // Every prefix of small buffers; a spread of prefixes of larger ones.
  const size_t step = std::max<size_t>(1, buffer->size() / 97);
  for (size_t size = 0; size < buffer->size(); size += step) {
    const absl::Status status = Decode(*buffer, size, output);
    ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss) << "prefix of " << size << ": "
                                                          << status;
  }
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecConformanceTest, ::testing::ValuesIn(AllCases()),
                         CaseName);

// A 256 MiB float32 tensor through the codecs the runtime uses most (not under sanitizers,
// which make it minutes long).
#if !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
TEST(CodecConformanceLargeTest, TwoHundredFiftySixMebibytes) {
  const uint64_t n = (uint64_t{256} << 20) / 4;
  std::vector<float> values(n);
  for (uint64_t i = 0; i < n; ++i) values[i] = std::sin(1e-3f * static_cast<float>(i % 100003));
  for (const char* spec : {"quant2", "eb:rel=1e-2"}) {
    absl::StatusOr<CodecParams> params = ParseCodecSpec(spec);
    ASSERT_TRUE(params.ok());
    TensorView view{values.data(), DType::kFloat32, {int64_t{1} << 16, int64_t(n >> 16)},
                    Device::kCpu};
    absl::StatusOr<size_t> capacity = MaxEncodedSize(view.Spec(), *params);
    ASSERT_TRUE(capacity.ok());
    std::vector<uint8_t> buffer(*capacity);
    absl::StatusOr<size_t> used = codecs::Encode(view, *params, buffer.data(), buffer.size(), {});
    ASSERT_TRUE(used.ok()) << spec << ": " << used.status();
    EXPECT_LT(*used * 4, n * 4) << spec;  // compresses at least 4x
    std::vector<float> out(n);
    MutableTensorView output{out.data(), DType::kFloat32, view.shape, Device::kCpu};
    ASSERT_TRUE(codecs::Decode(buffer.data(), *used, output, {}).ok()) << spec;
    double squared_error = 0, squared_norm = 0;
    for (uint64_t i = 0; i < n; i += 4099) {
      squared_error += (static_cast<double>(out[i]) - values[i]) * (out[i] - values[i]);
      squared_norm += static_cast<double>(values[i]) * values[i];
    }
    EXPECT_LT(std::sqrt(squared_error / squared_norm), 0.5) << spec;
  }
}
#endif

}  // namespace
}  // namespace actpack::codecs

// One conformance suite over every codec spec the registry parses: codec x dtype x shape x
// device (the CPU, and CUDA: a GPU, or the CUDA emulator under --config=cudaemu).
//
// Every case encodes a tensor through the public Encode/Decode and checks what every codec
// promises: the decoded shape and dtype, finite values where the input was finite, every
// element within the codec's own per-element bound (exact for the lossless ones, the rounded
// value for cast, the stated bound for eb, a level of its group's grid within one step for quant
// and division, the window mean for pool), non-finite inputs either refused (kFailedPrecondition,
// the runtime keeps the tensor exact) or decoded exactly, all-equal and denormal data, and every
// truncation of the buffer refused with kDataLoss. Shapes include empty and 0-d tensors and sizes
// that are not multiples of any group, block or window. The checks are shown to reject wrong
// decodes (all zeros, one element off) for every case. Codec-specific properties (unbiasedness,
// byte formats, CPU/CUDA identity) live in each codec's own test. Inputs here are contiguous:
// non-contiguous saved tensors are laid out by the plugin (tests/test_integrations.py).
// Integer tensors (what `bitpack`, `identity` and `mask` take) have a suite of their own
// (IntegerConformanceTest): exact round trips over each dtype's range, truncation and byte
// flips refused.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/codec.h"
#include "codecs/dtype.h"
#include "codecs/format.h"
#include "codecs/internal/dct_math.h"
#include "codecs/internal/division_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"
#include "codecs/registry.h"
#include "codecs/testing/device_runner.h"
#include "codecs/testing/test_util.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

using testing::ToBytes;
using testing::ToFloats;

// How a codec's decoded values relate to its input: each has a per-element bound.
enum class Fidelity {
  kExact,        // bit for bit
  kCast,         // the input rounded to the cast type
  kErrorBound,   // eb: within the bound (absolute, or relative to the finite range)
  kQuant,        // a level of its group's grid, within one step of the input
  kPoolMeans,    // the mean of its window, rounded to the dtype
  kDivision,     // the pooled LFC plus a level of its residual group's grid, within one step
  kDivisionDct,  // within one stored step of its residual group (the LFC is an inverse DCT)
};

struct SpecCase {
  std::string spec;
  Fidelity fidelity;
  bool zero_or_value = false;  // mask: the data must be {0, v}
};

const std::vector<SpecCase>& Specs() {
  static const auto* specs = new std::vector<SpecCase>{
      {"identity", Fidelity::kExact},
      {"quant8", Fidelity::kQuant},
      {"quant4", Fidelity::kQuant},
      {"quant2", Fidelity::kQuant},
      {"quant1", Fidelity::kQuant},
      {"quant:bits=2,group=64", Fidelity::kQuant},
      {"cast:fp16", Fidelity::kCast},
      {"cast:bf16", Fidelity::kCast},
      {"mask", Fidelity::kExact, true},
      {"pool4", Fidelity::kPoolMeans},
      {"pool:k=3", Fidelity::kPoolMeans},
      {"eb:rel=1e-2", Fidelity::kErrorBound},
      {"eb:abs=0.01", Fidelity::kErrorBound},
      {"division", Fidelity::kDivision},
      {"division:block=4,bits=4", Fidelity::kDivision},
      {"division:block=3,bits=1,group=32", Fidelity::kDivision},
      {"division_dct", Fidelity::kDivisionDct},
      {"division_dct:keep=16,bits=8", Fidelity::kDivisionDct},
      {"division_dct:keep=1,bits=4,group=32", Fidelity::kDivisionDct},
      {"bitpack", Fidelity::kExact},  // integer dtypes only: IntegerConformanceTest below
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

// `v` rounded to nearest even in `dtype`, as a decoder stores a float result.
float RoundedTo(DType dtype, float v) {
  switch (dtype) {
    case DType::kFloat16: return portable::HalfToFloat(portable::FloatToHalf(v));
    case DType::kBFloat16: return portable::Bf16ToFloat(portable::FloatToBf16(v));
    default: return v;
  }
}

// One unit in the last place of `v` in `dtype`: the gap from |v| to the next larger value.
double Ulp(DType dtype, float v) {
  const float a = std::abs(RoundedTo(dtype, v));
  switch (dtype) {
    case DType::kFloat16:
      return portable::HalfToFloat(static_cast<uint16_t>(portable::FloatToHalf(a) + 1)) - a;
    case DType::kBFloat16:
      return portable::Bf16ToFloat(static_cast<uint16_t>(portable::FloatToBf16(a) + 1)) - a;
    default:
      return static_cast<double>(std::nextafter(a, std::numeric_limits<float>::infinity())) - a;
  }
}

// What the residual quantizer (quant, and division on top of its LFC) did to one element: the
// approximation it quantized the residual against (0 for quant) and its group's parameters.
struct GridCell {
  float approximation = 0.0f;
  quant_math::GroupParams group{};
};

// A group's parameters as the encoders derive them: from the range of its finite values.
quant_math::GroupParams RangeParams(const float* values, uint64_t n, int bits) {
  float lo = std::numeric_limits<float>::infinity(), hi = -lo;
  for (uint64_t i = 0; i < n; ++i) {
    if (!std::isfinite(values[i])) continue;
    lo = std::min(lo, values[i]);
    hi = std::max(hi, values[i]);
  }
  return quant_math::MakeGroupParams(lo, hi, bits);
}

// quant (quant.h): groups of `group_size` consecutive values, quantized as they are.
std::vector<GridCell> QuantGrid(const std::vector<float>& in, const CodecParams& params) {
  std::vector<GridCell> cells(in.size());
  const uint64_t group = static_cast<uint64_t>(params.group_size);
  for (uint64_t first = 0; first < in.size(); first += group) {
    const uint64_t n = std::min<uint64_t>(group, in.size() - first);
    const quant_math::GroupParams g = RangeParams(in.data() + first, n, params.bits);
    for (uint64_t i = first; i < first + n; ++i) cells[i].group = g;
  }
  return cells;
}

// division (division.h): the pooled reference, each value's B x B window mean stored as
// bfloat16, and the residuals against it quantized per group of a plane.
template <int K>
std::vector<GridCell> DivisionGrid(const std::vector<uint8_t>& input,
                                   const std::vector<int64_t>& shape, const CodecParams& params) {
  const division_math::Layout l = division_math::MakePoolLayout(
      division_math::MakeResidualLayout(shape.data(), static_cast<int>(shape.size()),
                                        params.bits, params.group_size, params.seed),
      params.block);
  std::vector<GridCell> cells(l.planes * l.plane);
  std::vector<float> residuals(l.plane);
  for (uint64_t p = 0; p < l.planes; ++p) {
    GridCell* plane = &cells[p * l.plane];
    for (uint64_t j = 0; j < l.plane; ++j) {
      const float mean =
          division_math::WindowMean<K>(input.data(), l, division_math::MeanOf(l, p, j));
      plane[j].approximation = portable::Bf16ToFloat(portable::FloatToBf16(mean));
      residuals[j] = portable::Sub(elements::Load<K>(input.data(), p * l.plane + j),
                                   plane[j].approximation);
    }
    for (uint64_t first = 0; first < l.plane; first += l.group_length) {
      const uint64_t n = division_math::GroupSize(l, first / l.group_length);
      const quant_math::GroupParams g = RangeParams(residuals.data() + first, n, params.bits);
      for (uint64_t j = first; j < first + n; ++j) plane[j].group = g;
    }
  }
  return cells;
}

std::vector<GridCell> DivisionGridOf(DType dtype, const std::vector<uint8_t>& input,
                                     const std::vector<int64_t>& shape,
                                     const CodecParams& params) {
  switch (dtype) {
    case DType::kFloat16: return DivisionGrid<elements::kF16>(input, shape, params);
    case DType::kBFloat16: return DivisionGrid<elements::kBF16>(input, shape, params);
    default: return DivisionGrid<elements::kF32>(input, shape, params);
  }
}

// division_dct (division.h): the residual groups' parameters as stored in `buffer`, one per
// element. Its LFC is an inverse DCT of stored coefficients, which this test does not redo.
std::vector<quant_math::GroupParams> StoredDctGroups(const std::vector<uint8_t>& buffer,
                                                     const std::vector<int64_t>& shape,
                                                     const CodecParams& params) {
  division_math::Layout l =
      division_math::MakeResidualLayout(shape.data(), static_cast<int>(shape.size()),
                                        params.bits, params.group_size, params.seed);
  const uint64_t coefficients = l.planes * dct_math::KeptAlong(l.height, params.keep) *
                                dct_math::KeptAlong(l.width, params.keep) * l.inner;
  l.lfc_words = (coefficients + 1) / 2;
  std::vector<quant_math::GroupParams> groups(l.planes * l.plane);
  for (uint64_t i = 0; i < groups.size(); ++i) {
    const uint64_t g = i / l.plane * l.groups_per_plane + i % l.plane / l.group_length;
    uint32_t packed;
    std::memcpy(&packed, buffer.data() + kHeaderSize + 4 * division_math::ParamWord(l, g), 4);
    groups[i] = quant_math::UnpackGroupParams(packed);
  }
  return groups;
}

// pool (pool.h): every value replaced by the mean of its window of k along the last dimension,
// a left-to-right float sum divided by the count, rounded to the dtype.
std::vector<float> PoolMeans(const std::vector<float>& in, const std::vector<int64_t>& shape,
                             int k, DType dtype) {
  std::vector<float> means(in.size());
  const uint64_t row = shape.empty() ? 1 : static_cast<uint64_t>(shape.back());
  for (uint64_t start = 0; start < in.size(); start += row) {
    for (uint64_t w = 0; w < row; w += k) {
      const uint64_t end = std::min<uint64_t>(row, w + k);
      float sum = 0.0f;
      for (uint64_t i = w; i < end; ++i) sum = portable::Add(sum, in[start + i]);
      const float mean = RoundedTo(dtype, portable::Div(sum, static_cast<float>(end - w)));
      for (uint64_t i = w; i < end; ++i) means[start + i] = mean;
    }
  }
  return means;
}

// The encoder draws code floor(t + u), u uniform in [0, 1), t = (residual - min) / step: the
// exact level min + code * step lies within one step of the residual. t is computed in float
// from at most 255 levels, which moves it by less than 2^-13: the reach spares 2^-12 of a step.
double Reach(const quant_math::GroupParams& g) { return g.step * (1.0 + std::ldexp(1.0, -12)); }

// Whether `out` is what the residual quantizer may decode for input `x`: the approximation
// plus a level of the group's grid within reach of the residual, rounded to the dtype. The
// arithmetic is written out as FORMAT.md defines it (float operations in this order), not
// taken from the codecs' headers, so that a fault there does not move the reference too.
bool OnGrid(const GridCell& cell, float x, float out, int bits, DType dtype) {
  const quant_math::GroupParams& g = cell.group;
  const float residual = portable::Sub(x, cell.approximation);
  const double t = g.step > 0 ? (residual - g.min) / g.step : 0.0;
  const int64_t levels = (int64_t{1} << bits) - 1;
  const int64_t first = std::max<int64_t>(0, static_cast<int64_t>(std::floor(t)) - 1);
  const int64_t last = std::min<int64_t>(levels, static_cast<int64_t>(std::floor(t)) + 2);
  for (int64_t k = first; k <= last; ++k) {
    if (std::abs(g.min + static_cast<double>(k) * g.step - residual) > Reach(g)) continue;
    const float level = portable::Add(static_cast<float>(k) * g.step, g.min);  // exact product
    if (out == RoundedTo(dtype, portable::Add(cell.approximation, level))) return true;
  }
  return false;
}

// A case's input and buffer with everything its decode is checked against: Accepts() holds
// for the decoded bytes when every element is within the codec's per-element bound.
class Reference {
 public:
  Reference(Fidelity fidelity, const CodecParams& params, DType dtype,
            std::vector<int64_t> shape, const std::vector<uint8_t>& input,
            const std::vector<uint8_t>& buffer)
      : fidelity_(fidelity), params_(params), dtype_(dtype), shape_(std::move(shape)),
        in_(ToFloats(input, dtype)) {
    switch (fidelity) {
      case Fidelity::kErrorBound: {
        float lo = std::numeric_limits<float>::infinity(), hi = -lo;
        for (float v : in_) {
          lo = std::min(lo, v);
          hi = std::max(hi, v);
        }
        eb_bound_ = params.eb_mode == EbMode::kAbsolute
                        ? params.error_bound
                        : params.error_bound * (static_cast<double>(hi) - lo);
        break;
      }
      case Fidelity::kQuant: grid_ = QuantGrid(in_, params); break;
      case Fidelity::kPoolMeans: means_ = PoolMeans(in_, shape_, params.pool_window, dtype); break;
      case Fidelity::kDivision: grid_ = DivisionGridOf(dtype, input, shape_, params); break;
      case Fidelity::kDivisionDct: dct_groups_ = StoredDctGroups(buffer, shape_, params); break;
      default: break;
    }
  }

  ::testing::AssertionResult Accepts(const std::vector<uint8_t>& output) const {
    const std::vector<float> out = ToFloats(output, dtype_);
    if (out.size() != in_.size()) {
      return ::testing::AssertionFailure() << out.size() << " values decoded for " << in_.size();
    }
    for (size_t i = 0; i < in_.size(); ++i) {
      const std::string why = Check(i, in_[i], out[i]);
      if (!why.empty()) {
        return ::testing::AssertionFailure()
               << "element " << i << ": " << in_[i] << " decoded to " << out[i] << ", " << why;
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  // Empty when `out` is within the bound of element i (input `x`), else what it misses.
  std::string Check(size_t i, float x, float out) const {
    if (!std::isfinite(out)) return "not finite";
    switch (fidelity_) {
      case Fidelity::kExact:
        return out == x ? "" : "not exact";
      case Fidelity::kCast:
        return out == RoundedTo(params_.cast_to, x) ? "" : "not the input rounded";
      case Fidelity::kErrorBound:
        if (std::abs(static_cast<double>(out) - x) > eb_bound_) {
          return absl::StrCat("past the bound ", eb_bound_);
        }
        if (x == 0 && out != 0) return "zero not kept";
        if (x != 0 && std::signbit(out) != std::signbit(x)) return "sign not kept";
        return "";
      case Fidelity::kQuant:
      case Fidelity::kDivision: {
        const GridCell& cell = grid_[i];
        if (OnGrid(cell, x, out, params_.bits, dtype_)) return "";
        return absl::StrCat("not a level within one step: approximation ", cell.approximation,
                            ", group min ", cell.group.min, ", step ", cell.group.step);
      }
      case Fidelity::kPoolMeans:
        return out == means_[i] ? "" : absl::StrCat("not its window mean ", means_[i]);
      case Fidelity::kDivisionDct: {
        // One step of the residual, plus what float arithmetic adds: the residual, the level
        // and their sum each round by 2^-24 of a value below the group's largest level, the
        // step and the output; then the output rounds to the dtype.
        const quant_math::GroupParams& g = dct_groups_[i];
        const double levels = static_cast<double>((1 << params_.bits) - 1);
        const double min = g.min;
        const double largest = std::max(std::abs(min), std::abs(min + levels * g.step));
        const double slack =
            std::ldexp(largest + g.step + std::abs(out), -23) + Ulp(dtype_, out);
        const double error = std::abs(static_cast<double>(out) - x);
        if (error <= Reach(g) + slack) return "";
        return absl::StrCat("past one step ", g.step, " (+", slack, ")");
      }
    }
    return "unknown fidelity";
  }

  const Fidelity fidelity_;
  const CodecParams params_;
  const DType dtype_;
  const std::vector<int64_t> shape_;
  const std::vector<float> in_;
  double eb_bound_ = 0;
  std::vector<GridCell> grid_;
  std::vector<float> means_;
  std::vector<quant_math::GroupParams> dct_groups_;
};

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

// Every spec x `dtypes` x shape, on the CPU and the (emulated) GPU.
std::vector<Case> CasesOver(const std::vector<DType>& dtypes) {
  std::vector<Case> cases;
  for (Device device : {Device::kCpu, Device::kCuda}) {
    for (const SpecCase& spec : Specs()) {
      // division_dct has no CUDA kernel (cuda_identity_test checks that it says so).
      if (device == Device::kCuda && ParseCodecSpec(spec.spec)->codec == CodecId::kDivisionDct) {
        continue;
      }
      for (DType dtype : dtypes) {
        for (const auto& shape : kShapes) cases.push_back({spec, dtype, shape, device});
      }
    }
  }
  return cases;
}

std::vector<Case> AllCases() { return CasesOver(kDTypes); }

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

  // The case's activations, encoded: the buffer the corruption tests damage.
  absl::StatusOr<std::vector<uint8_t>> EncodeActivations() {
    const Case& c = GetParam();
    return Encode(ToBytes(Activations(Numel(c.shape), 3, c.spec.zero_or_value), c.dtype));
  }

  // Decodes the first `size` bytes of `buffer` on the case's device; unwritten output shows.
  absl::Status Decode(const std::vector<uint8_t>& buffer, size_t size,
                      std::vector<uint8_t>& output) {
    const Case& c = GetParam();
    return runner_->Decode(buffer, size, c.dtype, c.shape, &output);
  }

  // `buffer` verifies, and its header names the case's dtype and shape.
  void ExpectHeaderNamesTheCase(const std::vector<uint8_t>& buffer) {
    absl::StatusOr<Header> header = runner_->Verify(buffer, buffer.size());
    ASSERT_TRUE(header.ok()) << header.status();
    EXPECT_EQ(header->dtype, GetParam().dtype);
    EXPECT_EQ(header->Shape(), GetParam().shape);
  }

  // Every prefix of `buffer` shorter than it decodes to kDataLoss (every prefix of small
  // buffers; a spread of prefixes of larger ones).
  void ExpectEveryTruncationIsDataLoss(const std::vector<uint8_t>& buffer) {
    std::vector<uint8_t> output;
    const size_t step = std::max<size_t>(1, buffer.size() / 97);
    for (size_t size = 0; size < buffer.size(); size += step) {
      const absl::Status status = Decode(buffer, size, output);
      ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss) << "prefix of " << size << ": "
                                                            << status;
    }
  }

  // Every header byte of `buffer` with three flips (a field's low bit, its high bit, all of
  // it) and a spread of the payload's bytes with one flip each, in turn (the checksum sees any
  // change alike), are refused; the buffer, restored, still decodes.
  void ExpectByteFlipsRefused(std::vector<uint8_t>& buffer) {
    std::vector<uint8_t> output;
    const std::vector<uint8_t> flips = {0x01, 0x80, 0xff};
    const size_t step = std::max<size_t>(1, (buffer.size() - kHeaderSize) / 97);
    for (size_t i = 0, turn = 0; i < buffer.size(); i += i < kHeaderSize ? 1 : step) {
      const std::vector<uint8_t> these =
          i < kHeaderSize ? flips : std::vector<uint8_t>{flips[turn++ % flips.size()]};
      for (uint8_t flip : these) {
        buffer[i] ^= flip;
        const absl::Status status = Decode(buffer, buffer.size(), output);
        ASSERT_FALSE(status.ok()) << "byte " << i << " flip " << int{flip};
        buffer[i] ^= flip;
      }
    }
    ASSERT_TRUE(Decode(buffer, buffer.size(), output).ok());
  }

  // Encodes `input` and decodes the buffer on the case's device.
  void RoundTrip(const std::vector<uint8_t>& input, std::vector<uint8_t>* buffer,
                 std::vector<uint8_t>* output) {
    absl::StatusOr<std::vector<uint8_t>> encoded = Encode(input);
    ASSERT_TRUE(encoded.ok()) << encoded.status();
    *buffer = *std::move(encoded);
    const absl::Status decoded = Decode(*buffer, buffer->size(), *output);
    ASSERT_TRUE(decoded.ok()) << decoded;
  }

  Reference ReferenceFor(const std::vector<uint8_t>& input,
                         const std::vector<uint8_t>& buffer) const {
    const Case& c = GetParam();
    return Reference(c.spec.fidelity, params_, c.dtype, c.shape, input, buffer);
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
  std::vector<uint8_t> buffer, output;
  ASSERT_NO_FATAL_FAILURE(RoundTrip(input, &buffer, &output));
  ASSERT_NO_FATAL_FAILURE(ExpectHeaderNamesTheCase(buffer));
  EXPECT_TRUE(ReferenceFor(input, buffer).Accepts(output));
}

// The checks can fail: what a decoder that writes zeros leaves, and the right decode with one
// element off by 4, more than any bound allows on this data (it lies in [-0.6, 1.5], so no
// step, window mean or eb bound reaches 4), are rejected for every case.
TEST_P(CodecConformanceTest, ChecksRejectAZerosDecoderAndAWrongElement) {
  const Case& c = GetParam();
  const std::vector<float> values = Activations(Numel(c.shape), 1, c.spec.zero_or_value);
  if (std::all_of(values.begin(), values.end(), [](float v) { return v == 0; })) {
    GTEST_SKIP() << "no nonzero input: zeros would be the right decode";
  }
  const std::vector<uint8_t> input = ToBytes(values, c.dtype);
  std::vector<uint8_t> buffer, output;
  ASSERT_NO_FATAL_FAILURE(RoundTrip(input, &buffer, &output));
  const Reference reference = ReferenceFor(input, buffer);
  ASSERT_TRUE(reference.Accepts(output));
  EXPECT_FALSE(reference.Accepts(std::vector<uint8_t>(output.size(), 0))) << "all zeros";
  std::vector<float> one_off = ToFloats(output, c.dtype);
  one_off[one_off.size() / 2] += 4.0f;
  EXPECT_FALSE(reference.Accepts(ToBytes(one_off, c.dtype))) << "one element off by 4";
}

TEST_P(CodecConformanceTest, AllEqualAndDenormalValues) {
  const Case& c = GetParam();
  const uint64_t n = Numel(c.shape);
  for (float value : {1.25f, 0.0f, -3.0f}) {
    if (c.spec.zero_or_value && value < 0) continue;
    const std::vector<uint8_t> input = ToBytes(std::vector<float>(n, value), c.dtype);
    std::vector<uint8_t> buffer, output;
    ASSERT_NO_FATAL_FAILURE(RoundTrip(input, &buffer, &output)) << value;
    EXPECT_TRUE(ReferenceFor(input, buffer).Accepts(output)) << value;
  }
  // Denormals (float32), which float16 and bfloat16 scales and means meet at their limits.
  if (c.dtype != DType::kFloat32 || c.spec.zero_or_value) return;
  std::vector<float> denormals(n);
  for (uint64_t i = 0; i < n; ++i) denormals[i] = (i % 3 == 0 ? -1e-40f : 3e-39f);
  const std::vector<uint8_t> input = ToBytes(denormals, c.dtype);
  std::vector<uint8_t> buffer, output;
  ASSERT_NO_FATAL_FAILURE(RoundTrip(input, &buffer, &output));
  EXPECT_TRUE(ReferenceFor(input, buffer).Accepts(output));
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
  absl::StatusOr<std::vector<uint8_t>> buffer = EncodeActivations();
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ExpectEveryTruncationIsDataLoss(*buffer);
}

TEST_P(CodecConformanceTest, ByteFlipsAreRefused) {
  absl::StatusOr<std::vector<uint8_t>> buffer = EncodeActivations();
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ExpectByteFlipsRefused(*buffer);
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecConformanceTest, ::testing::ValuesIn(AllCases()),
                         CaseName);

// Every codec of the registry has cases here: a codec registered without them fails.
TEST(CodecConformanceCoverageTest, EveryRegisteredCodecHasCases) {
  std::set<CodecId> covered;
  for (const SpecCase& spec : Specs()) covered.insert(ParseCodecSpec(spec.spec)->codec);
  for (const Codec* codec : AllCodecs()) {
    EXPECT_EQ(covered.count(codec->id()), 1u) << codec->name() << " has no conformance cases";
  }
}

// A spec checked bit for bit here is one whose codec says it is lossless, and only those.
TEST(CodecConformanceCoverageTest, ExactCasesAreTheLosslessCodecs) {
  for (const SpecCase& spec : Specs()) {
    const Codec* codec = FindCodec(ParseCodecSpec(spec.spec)->codec);
    ASSERT_NE(codec, nullptr) << spec.spec;
    EXPECT_EQ(spec.fidelity == Fidelity::kExact, codec->lossless()) << spec.spec;
  }
}

// A CUDA tensor in a build without CUDA (encode and decode) is a clear kUnimplemented error that
// says why, for every codec of the registry (each has a CUDA path in a CUDA build).
TEST(CodecConformanceCoverageTest, CudaTensorsWithoutCudaAreAClearError) {
  std::vector<float> x(64, 1.0f);
  const std::vector<int64_t> shape = {1, 1, 8, 8};
  ExecContext cuda;
  cuda.device = Device::kCuda;
  for (const SpecCase& spec : Specs()) {
    SCOPED_TRACE(spec.spec);
    const CodecParams params = *ParseCodecSpec(spec.spec);
    // A dtype the codec takes, 4 bytes per element as `x`: int32 for bitpack.
    const DType dtype = params.codec == CodecId::kBitpack ? DType::kInt32 : DType::kFloat32;
#ifdef ACTPACK_WITH_CUDA
    continue;
#endif
    const char* why = "not compiled";
    std::vector<uint8_t> buffer(*MaxEncodedSize({dtype, shape}, params));
    const absl::StatusOr<size_t> encoded =
        Encode(TensorView{x.data(), dtype, shape, Device::kCuda}, params,
               buffer.data(), buffer.size(), cuda);
    EXPECT_EQ(encoded.status().code(), absl::StatusCode::kUnimplemented) << encoded.status();
    EXPECT_NE(encoded.status().message().find(why), absl::string_view::npos) << encoded.status();

#ifndef ACTPACK_WITH_CUDA
    // Decoding reads the header from the device first: without CUDA that step says why.
    const absl::StatusOr<size_t> on_host = Encode(
        TensorView{x.data(), dtype, shape, Device::kCpu}, params, buffer.data(),
        buffer.size(), {});
    ASSERT_TRUE(on_host.ok()) << on_host.status();
    std::vector<float> out(x.size());
    const absl::Status decoded =
        Decode(buffer.data(), *on_host,
               MutableTensorView{out.data(), dtype, shape, Device::kCuda}, cuda);
    EXPECT_EQ(decoded.code(), absl::StatusCode::kUnimplemented) << decoded;
    EXPECT_NE(decoded.message().find("not compiled"), absl::string_view::npos) << decoded;
#endif
  }
}

// Integer tensors: every spec of the registry over each integer dtype (codecs that refuse one
// say so, naming it, as above), on the CPU and on CUDA. The lossless codecs that take them must
// give back every byte.
const std::vector<DType> kIntegerDTypes = {DType::kUInt8, DType::kInt8, DType::kInt16,
                                           DType::kInt32, DType::kInt64};

// The bytes of a `dtype` tensor of `n` pseudo-random integers. Seeds cycle through a narrow
// range of small nonnegative values (max_pool indices), a range across zero, the top of the
// dtype and its whole range with both extremes; `zero_or_value` (mask): zeros and 7.
std::vector<uint8_t> IntegerBytes(DType dtype, uint64_t n, uint32_t seed, bool zero_or_value) {
  const size_t width = ElementSize(dtype);
  const bool is_signed = dtype != DType::kUInt8;
  const int64_t highest = static_cast<int64_t>((uint64_t{1} << (8 * width - is_signed)) - 1);
  const int64_t lowest = is_signed ? -highest - 1 : 0;
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(n * width);
  for (uint64_t i = 0; i < n; ++i) {
    const uint64_t r = rng();
    int64_t v;
    if (zero_or_value) {
      v = r % 3 == 0 ? 0 : 7;
    } else {
      switch (seed % 4) {
        case 0: {
          const uint64_t values = std::min<uint64_t>(1024, static_cast<uint64_t>(highest) + 1);
          v = static_cast<int64_t>(r % values);
          break;
        }
        case 1: v = static_cast<int64_t>(r % 200) - (is_signed ? 100 : 0); break;
        case 2: v = highest - static_cast<int64_t>(r % 50); break;
        default:
          v = static_cast<int64_t>(r);
          if (width < 8) {
            v = lowest + static_cast<int64_t>(r % (static_cast<uint64_t>(highest - lowest) + 1));
          }
          if (i == 0) v = lowest;
          if (i == n - 1) v = highest;
      }
    }
    std::memcpy(bytes.data() + i * width, &v, width);  // little-endian: the low bytes
  }
  return bytes;
}

std::vector<Case> AllIntegerCases() { return CasesOver(kIntegerDTypes); }

class IntegerConformanceTest : public CodecConformanceTest {
 protected:
  void SetUp() override {
    CodecConformanceTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    ASSERT_EQ(GetParam().spec.fidelity, Fidelity::kExact)
        << "only lossless codecs take integer tensors";
  }

  std::vector<uint8_t> Input(uint32_t seed) const {
    const Case& c = GetParam();
    return IntegerBytes(c.dtype, Numel(c.shape), seed, c.spec.zero_or_value);
  }
};

TEST_P(IntegerConformanceTest, RoundTripIsExact) {
  for (uint32_t seed : {0u, 1u, 2u, 3u}) {
    SCOPED_TRACE(seed);
    const std::vector<uint8_t> input = Input(seed);
    std::vector<uint8_t> buffer, output;
    ASSERT_NO_FATAL_FAILURE(RoundTrip(input, &buffer, &output));
    ASSERT_NO_FATAL_FAILURE(ExpectHeaderNamesTheCase(buffer));
    ASSERT_EQ(output.size(), input.size());
    EXPECT_TRUE(output == input);
    // The check can fail: a decoder that wrote zeros would not pass it.
    if (std::any_of(input.begin(), input.end(), [](uint8_t b) { return b != 0; })) {
      EXPECT_FALSE(std::vector<uint8_t>(input.size(), 0) == input);
    }
  }
}

TEST_P(IntegerConformanceTest, AllEqualValues) {
  const Case& c = GetParam();
  const size_t width = ElementSize(c.dtype);
  for (uint8_t fill : {uint8_t{0}, uint8_t{0x7f}, uint8_t{0xff}}) {  // 0, near the top, -1
    if (c.spec.zero_or_value && fill != 0) continue;
    std::vector<uint8_t> input(Numel(c.shape) * width, fill);
    std::vector<uint8_t> buffer, output;
    ASSERT_NO_FATAL_FAILURE(RoundTrip(input, &buffer, &output)) << int{fill};
    EXPECT_TRUE(output == input) << int{fill};
  }
}

TEST_P(IntegerConformanceTest, EveryTruncationIsDataLoss) {
  absl::StatusOr<std::vector<uint8_t>> buffer = Encode(Input(3));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ExpectEveryTruncationIsDataLoss(*buffer);
}

TEST_P(IntegerConformanceTest, ByteFlipsAreRefused) {
  absl::StatusOr<std::vector<uint8_t>> buffer = Encode(Input(1));
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  ExpectByteFlipsRefused(*buffer);
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, IntegerConformanceTest,
                         ::testing::ValuesIn(AllIntegerCases()), CaseName);

// bitpack and identity, the lossless codecs for any integer tensor, have integer cases that
// run (not only refusals).
TEST(CodecConformanceCoverageTest, IntegerCasesRunForTheLosslessIntegerCodecs) {
  for (const char* name : {"identity", "bitpack"}) {
    const CodecParams params = *ParseCodecSpec(name);
    for (DType dtype : kIntegerDTypes) {
      EXPECT_TRUE(FindCodec(params.codec)->CheckEncodable({dtype, {4}}, params).ok())
          << name << " " << DTypeName(dtype);
    }
  }
}

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

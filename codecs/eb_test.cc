#include "codecs/eb.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codecs/codec.h"
#include "codecs/internal/eb_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"
#include "codecs/registry.h"
#include "codecs/testing/test_util.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

using testing::Gaussian;

constexpr float kInf = std::numeric_limits<float>::infinity();

// A tensor in one of the three float types: its raw bytes and its values as float.
struct Typed {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

uint32_t BitsOf(const Typed& t, size_t i) {
  if (t.dtype == DType::kFloat32) {
    uint32_t bits;
    std::memcpy(&bits, t.bytes.data() + 4 * i, 4);
    return bits;
  }
  uint16_t bits;
  std::memcpy(&bits, t.bytes.data() + 2 * i, 2);
  return bits;
}

float ValueOf(DType dtype, const uint8_t* bytes, size_t i) {
  if (dtype == DType::kFloat32) {
    float v;
    std::memcpy(&v, bytes + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, bytes + 2 * i, 2);
  return dtype == DType::kFloat16 ? portable::HalfToFloat(h) : portable::Bf16ToFloat(h);
}

Typed MakeTyped(const std::vector<float>& x, DType dtype, std::vector<int64_t> shape) {
  Typed t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  t.bytes.resize(x.size() * ElementSize(dtype));
  for (size_t i = 0; i < x.size(); ++i) {
    if (dtype == DType::kFloat32) {
      std::memcpy(t.bytes.data() + 4 * i, &x[i], 4);
    } else {
      const uint16_t h =
          dtype == DType::kFloat16 ? portable::FloatToHalf(x[i]) : portable::FloatToBf16(x[i]);
      std::memcpy(t.bytes.data() + 2 * i, &h, 2);
    }
    t.values.push_back(ValueOf(dtype, t.bytes.data(), i));
  }
  return t;
}

absl::StatusOr<std::vector<uint8_t>> Encode(const Typed& t, const std::string& spec) {
  absl::StatusOr<CodecParams> params = ParseCodecSpec(spec);
  if (!params.ok()) return params.status();
  return testing::EncodeToVector(t.bytes.data(), t.dtype, t.shape, *params);
}

// Decodes into memory poisoned with all-ones bits (a NaN in every float type).
Typed DecodeTyped(const std::vector<uint8_t>& buffer, DType dtype, std::vector<int64_t> shape) {
  Typed t;
  t.dtype = dtype;
  t.shape = shape;
  const uint64_t n = TensorSpec{dtype, shape}.numel();
  t.bytes.assign(n * ElementSize(dtype), 0xff);
  const MutableTensorView output{t.bytes.data(), dtype, std::move(shape), Device::kCpu};
  const absl::Status status = Decode(buffer.data(), buffer.size(), output, {});
  EXPECT_TRUE(status.ok()) << status;
  for (uint64_t i = 0; i < n; ++i) t.values.push_back(ValueOf(dtype, t.bytes.data(), i));
  return t;
}

Header HeaderOf(const std::vector<uint8_t>& buffer) { return *ParseHeader(buffer.data(), buffer.size()); }

float ParamFloat(const Header& h, size_t offset) {
  float v;
  std::memcpy(&v, h.params.data() + offset, 4);
  return v;
}

uint64_t OutlierCount(const Header& h) {
  uint64_t n;
  std::memcpy(&n, h.params.data() + 16, 8);
  return n;
}

// The bound a spec promises for these values: abs, or rel times the finite values' range.
double PromisedBound(const std::string& spec, const std::vector<float>& values) {
  const CodecParams p = *ParseCodecSpec(spec);
  if (p.eb_mode == EbMode::kAbsolute) return p.error_bound;
  double lo = INFINITY, hi = -INFINITY;
  for (float v : values) {
    if (!std::isfinite(v)) continue;
    lo = std::min<double>(lo, v);
    hi = std::max<double>(hi, v);
  }
  return lo > hi ? 0.0 : p.error_bound * (hi - lo);
}

// The guarantees: finite values within the bound (in double), signs kept, zeros exactly zero,
// non-finite values bit for bit. Returns the largest error.
double ExpectGuarantees(const Typed& in, const Typed& out, double bound, const std::string& what) {
  double worst = 0;
  for (size_t i = 0; i < in.values.size(); ++i) {
    const float x = in.values[i], y = out.values[i];
    if (!std::isfinite(x)) {
      EXPECT_EQ(BitsOf(in, i), BitsOf(out, i)) << what << " i " << i;
      continue;
    }
    const double error = std::fabs(static_cast<double>(y) - static_cast<double>(x));
    worst = std::max(worst, error);
    if (!(error <= bound) || (x > 0 && !(y > 0)) || (x < 0 && !(y < 0)) || (x == 0 && y != 0)) {
      ADD_FAILURE() << what << " i " << i << ": " << x << " decoded to " << y << ", bound "
                    << bound;
      return worst;
    }
  }
  return worst;
}

// Encodes, decodes, checks the guarantees against the promised bound and against the bound
// the header reports; returns the buffer.
std::vector<uint8_t> RoundTrip(const Typed& in, const std::string& spec, const std::string& what) {
  absl::StatusOr<std::vector<uint8_t>> buffer = Encode(in, spec);
  EXPECT_TRUE(buffer.ok()) << what << ": " << buffer.status();
  if (!buffer.ok()) return {};
  const Header h = HeaderOf(*buffer);
  const double promised = PromisedBound(spec, in.values);
  const float reported = ParamFloat(h, 8);
  EXPECT_LE(reported, promised) << what;
  const Typed out = DecodeTyped(*buffer, in.dtype, in.shape);
  ExpectGuarantees(in, out, reported, what + " " + spec);
  return *buffer;
}

std::vector<float> SineField(int64_t rows, int64_t cols, float scale = 1.0f) {
  std::vector<float> x(rows * cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      x[r * cols + c] = scale * std::sin(c / 37.0f) * std::cos(r / 23.0f);
    }
  }
  return x;
}

// Values that stress the quantizer for half-bin q: bin edges m·2q and their float neighbours,
// centres, values below q, alternating signs, denormals, the ends of the code range, and
// values far outside it. The range stays [-range, range] so a relative q is unchanged.
std::vector<float> Adversarial(float q, float range, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<float> x = {-range, range, 0.0f, -0.0f};
  const float bin = 2 * q;
  for (int i = 0; i < 3000; ++i) {
    const int64_t top = std::min<double>(range / bin, 1 << 23);
    const float m = static_cast<float>(rng() % std::max<int64_t>(top, 1) + 1);
    const float edge = m * bin;
    const float sign = i % 2 == 0 ? 1.0f : -1.0f;  // alternating signs
    for (float v : {edge, std::nextafter(edge, 0.0f), std::nextafter(edge, kInf), (m - 0.5f) * bin,
                    std::nextafter((m - 0.5f) * bin, kInf)}) {
      if (std::fabs(v) <= range) x.push_back(sign * v);
    }
  }
  for (float v : {q, std::nextafter(q, 0.0f), std::nextafter(q, kInf), q / 3, q * 1e-3f, 1e-40f,
                   1e-45f, -1e-42f, std::numeric_limits<float>::min(),
                   (1 << 23) * bin, std::nextafter((1 << 23) * bin, kInf), (1 << 24) * bin}) {
    if (std::fabs(v) <= range) {
      x.push_back(v);
      x.push_back(-v);
    }
  }
  return x;
}

const DType kTypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
const char* const kSpecs[] = {"eb", "eb:rel=1e-3", "eb:rel=1e-5", "eb:abs=0.01", "eb:abs=1e-4",
                              "eb:abs=3"};

TEST(EbTest, BoundHoldsOnRandomAndSmoothDataInEveryDtype) {
  const std::vector<std::pair<std::vector<int64_t>, std::vector<float>>> cases = {
      {{10007}, Gaussian(10007, 1)},
      {{100, 77}, Gaussian(7700, 2, 0.5f, 4.0f)},
      {{3, 37, 45}, SineField(111, 45, 3.0f)},
      {{200, 300}, SineField(200, 300)},
      {{64, 3}, SineField(64, 3, 100.0f)},
  };
  for (DType dtype : kTypes) {
    for (const auto& [shape, x] : cases) {
      const Typed in = MakeTyped(x, dtype, shape);
      for (const char* spec : kSpecs) {
        RoundTrip(in, spec, std::string(DTypeName(dtype)) + " numel " + std::to_string(x.size()));
      }
    }
  }
}

TEST(EbTest, BoundHoldsOnAdversarialData) {
  for (DType dtype : kTypes) {
    for (const char* spec : {"eb:abs=0.01", "eb:abs=1e-6", "eb:abs=0.3", "eb", "eb:rel=1e-4"}) {
      // The half-bin the encoder picks for data spanning [-1000, 1000].
      const Typed probe = MakeTyped({-1000.0f, 1000.0f}, dtype, {2});
      const float q = ParamFloat(HeaderOf(*Encode(probe, spec)), 4);
      std::vector<float> x = Adversarial(q, 1000.0f, 3);
      const Typed in = MakeTyped(x, dtype, {static_cast<int64_t>(x.size())});
      RoundTrip(in, spec, std::string("adversarial ") + std::string(DTypeName(dtype)));
      // The same values as a 2-D tensor (tiles) and reversed.
      x.resize(x.size() / 64 * 64);
      std::reverse(x.begin(), x.end());
      RoundTrip(MakeTyped(x, dtype, {static_cast<int64_t>(x.size() / 64), 64}), spec,
                std::string("adversarial 2-D ") + std::string(DTypeName(dtype)));
    }
  }
}

TEST(EbTest, HugeRangesAndTinyBounds) {
  std::vector<float> x = {3e38f, -3e38f, 1e-30f, -1e-38f, 1.0f, 65504.0f, -70000.0f, 1e-45f};
  for (int i = 0; i < 500; ++i) x.push_back(std::ldexp(1.0f + i / 512.0f, i % 250 - 125) * (i % 3 ? 1 : -1));
  for (DType dtype : kTypes) {
    for (const char* spec : {"eb", "eb:rel=1e-10", "eb:abs=1e-30", "eb:abs=1e30", "eb:rel=1"}) {
      RoundTrip(MakeTyped(x, dtype, {static_cast<int64_t>(x.size())}), spec,
                std::string("huge ") + std::string(DTypeName(dtype)));
    }
  }
}

TEST(EbTest, ZerosStayZeroAndSignsNeverFlip) {
  // Many values far below the bound: each decodes to ±q, never 0; zeros (both) decode to +0.
  std::vector<float> x;
  for (int i = 0; i < 4000; ++i) {
    const float tiny = 1e-5f * static_cast<float>(i % 97 + 1);
    x.push_back(i % 5 == 0 ? 0.0f : i % 5 == 1 ? -0.0f : i % 2 ? tiny : -tiny);
  }
  x[101] = 1.0f;  // a range, so rel has a bound
  for (DType dtype : kTypes) {
    for (const char* spec : {"eb", "eb:abs=0.01", "eb:abs=1e-7"}) {
      const Typed in = MakeTyped(x, dtype, {40, 100});
      const Typed out = DecodeTyped(*Encode(in, spec), dtype, in.shape);
      ExpectGuarantees(in, out, PromisedBound(spec, in.values), spec);
      for (size_t i = 0; i < x.size(); i += 5) EXPECT_EQ(BitsOf(out, i), 0u) << spec << " " << i;
    }
  }
}

TEST(EbTest, NonFiniteValuesDecodeExactlyAndDoNotWidenTheRange) {
  std::vector<float> x = SineField(64, 64);
  uint32_t nan_bits = 0x7fc12345;  // a NaN payload must survive
  std::memcpy(&x[5], &nan_bits, 4);
  x[700] = kInf;
  x[701] = -kInf;
  x[4095] = std::nanf("");
  for (DType dtype : kTypes) {
    const Typed in = MakeTyped(x, dtype, {64, 64});
    const std::vector<uint8_t> buffer = RoundTrip(in, "eb:rel=1e-3", "non-finite");
    // float16 adds outliers of its own: a bin centre rounded to float16 can miss a bound
    // that is only a few float16 steps wide.
    if (dtype == DType::kFloat32) {
      EXPECT_EQ(OutlierCount(HeaderOf(buffer)), 4u);
    }
    EXPECT_GE(OutlierCount(HeaderOf(buffer)), 4u) << DTypeName(dtype);
    // The bound comes from the finite values' range, not from the infinities.
    const double bound = PromisedBound("eb:rel=1e-3", in.values);
    EXPECT_LT(bound, 2e-3);
    EXPECT_GT(ParamFloat(HeaderOf(buffer), 8), bound * (1 - 1e-6));
  }
  // Only non-finite values: every value exact.
  const std::vector<float> all_bad = {kInf, -kInf, std::nanf(""), kInf};
  for (DType dtype : kTypes) RoundTrip(MakeTyped(all_bad, dtype, {4}), "eb", "all non-finite");
}

TEST(EbTest, EmptyAndScalarTensors) {
  for (DType dtype : kTypes) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{0}, {0, 5}, {8, 0, 16}, {3, 8, 0}, {0, 8, 16},
                                         {0, int64_t{1} << 40, int64_t{1} << 40}}) {
      const Typed in = MakeTyped({}, dtype, shape);
      const std::vector<uint8_t> buffer = *Encode(in, "eb");
      EXPECT_EQ(buffer.size(), kHeaderSize);
      DecodeTyped(buffer, dtype, shape);
    }
    for (float v : {2.5f, -1e-20f, 0.0f, kInf}) {
      const Typed in = MakeTyped({v}, dtype, {});
      RoundTrip(in, "eb", "scalar");
      RoundTrip(in, "eb:abs=0.1", "scalar");
    }
  }
}

TEST(EbTest, ShapesThatAreNotMultiplesOfTheBlock) {
  for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
           {1}, {127}, {129}, {7, 15}, {8, 16}, {9, 17}, {15, 31}, {2, 3, 8, 16}, {5, 1000},
           {1000, 5}, {3, 1, 200}, {2, 7, 130}}) {
    const uint64_t n = TensorSpec{DType::kFloat32, shape}.numel();
    std::vector<float> x = Gaussian(n, static_cast<uint32_t>(n));
    for (size_t i = 0; i < n; i += 3) x[i] = std::sin(i * 0.01f);
    for (DType dtype : kTypes) {
      for (const char* spec : {"eb", "eb:abs=1e-3"}) {
        RoundTrip(MakeTyped(x, dtype, shape), spec, "shape numel " + std::to_string(n));
      }
    }
  }
}

TEST(EbTest, TilesOverTheLastTwoDimsOnlyWhenTheyAreWideEnough) {
  const auto dims = [](std::vector<int64_t> shape) {
    const uint64_t n = TensorSpec{DType::kFloat32, shape}.numel();
    return HeaderOf(*Encode(MakeTyped(std::vector<float>(n, 1.0f), DType::kFloat32, shape), "eb"))
        .params[1];
  };
  EXPECT_EQ(dims({1000}), 1);
  EXPECT_EQ(dims({100, 3}), 1);
  EXPECT_EQ(dims({7, 64}), 1);
  EXPECT_EQ(dims({8, 15}), 1);
  EXPECT_EQ(dims({8, 16}), 2);
  EXPECT_EQ(dims({4, 3, 28, 28}), 2);
}

TEST(EbTest, AllEqualData) {
  for (DType dtype : kTypes) {
    for (float v : {0.0f, 1.0f, -3.75f, 1e-3f, 1e30f}) {
      const Typed in = MakeTyped(std::vector<float>(5000, v), dtype, {50, 100});
      // Relative: the range is 0, so the bound is 0 and every value decodes exactly.
      const std::vector<uint8_t> buffer = RoundTrip(in, "eb", "constant");
      RoundTrip(in, "eb:abs=0.5", "constant abs");
      if (std::isfinite(in.values[0])) {
        EXPECT_EQ(DecodeTyped(buffer, dtype, in.shape).bytes, in.bytes) << v;
        // 7 x 7 tiles of 8 x 16: their header words, a 2-chunk index, and no data at all.
        EXPECT_EQ(buffer.size(), kHeaderSize + 4 * 49 + 8 * 2) << v;
      }
    }
  }
}

TEST(EbTest, IncompressibleDataStaysNearItsRawSize) {
  // A bound far below float resolution: every block is stored verbatim, exactly.
  for (DType dtype : kTypes) {
    const Typed in = MakeTyped(Gaussian(100000, 4, 1000.0f, 1.0f), dtype, {100000});
    const std::vector<uint8_t> buffer = *Encode(in, "eb:rel=1e-10");
    EXPECT_EQ(DecodeTyped(buffer, dtype, in.shape).bytes, in.bytes);
    EXPECT_LE(buffer.size(), in.bytes.size() * 1.04 + kHeaderSize) << DTypeName(dtype);
    const absl::StatusOr<size_t> bound = MaxEncodedSize({dtype, in.shape}, *ParseCodecSpec("eb"));
    EXPECT_LE(buffer.size(), *bound);
  }
}

double Ratio(const Typed& in, const std::string& spec) {
  return static_cast<double>(in.bytes.size()) / Encode(in, spec)->size();
}

// Measured (float32, these inputs): sine field 512 x 512 at rel=1e-2 14.70x, rel=1e-3 7.33x;
// N(0, 1) 1-D at rel=1e-2 5.67x, rel=1e-3 3.51x (the seed is fixed: the floors cannot drift).
TEST(EbTest, CompressionRatios) {
  const Typed sine = MakeTyped(SineField(512, 512), DType::kFloat32, {512, 512});
  EXPECT_GE(Ratio(sine, "eb:rel=1e-2"), 14.0);
  EXPECT_GE(Ratio(sine, "eb:rel=1e-3"), 7.0);
  const Typed normal = MakeTyped(Gaussian(1 << 18, 5), DType::kFloat32, {1 << 18});
  EXPECT_GE(Ratio(normal, "eb:rel=1e-2"), 5.5);
  EXPECT_GE(Ratio(normal, "eb:rel=1e-3"), 3.4);
  // Looser bounds compress more.
  EXPECT_GT(Ratio(normal, "eb:rel=1e-2"), Ratio(normal, "eb:rel=1e-3"));
  const Typed sine16 = MakeTyped(SineField(512, 512), DType::kBFloat16, {512, 512});
  EXPECT_GE(Ratio(sine16, "eb:rel=1e-2"), 6.5);
}

TEST(EbTest, SameInputSameBytes) {
  const Typed in = MakeTyped(Gaussian(300000, 6), DType::kFloat32, {300, 1000});
  EXPECT_EQ(*Encode(in, "eb:rel=1e-3"), *Encode(in, "eb:rel=1e-3"));
}

// ---- the packing forms the CPU and the GPU use must agree bit for bit ----

TEST(EbMathTest, WordAtATimeAndSequentialPackingAgree) {
  std::mt19937 rng(7);
  for (uint32_t width = 1; width <= 32; ++width) {
    for (uint32_t count : {1u, 7u, 31u, 64u, 100u, 128u}) {
      std::vector<uint32_t> v(count);
      for (uint32_t& x : v) x = width == 32 ? rng() : rng() & ((1u << width) - 1u);
      std::vector<uint32_t> packed(eb_math::PackedWords(count, width) + 1, 0xdeadbeef);
      eb_math::PackValues(v.data(), count, width, packed.data());
      EXPECT_EQ(packed.back(), 0xdeadbeef) << "wrote past its words";
      for (uint32_t t = 0; t < eb_math::PackedWords(count, width); ++t) {
        ASSERT_EQ(eb_math::PackWord(v.data(), count, width, t), packed[t]) << width << " " << t;
      }
      if (width > eb_math::kMaxWidth) continue;
      std::vector<uint32_t> back(count);
      eb_math::UnpackValues(packed.data(), count, width, back.data());
      EXPECT_EQ(back, v) << width;
      for (uint32_t i = 0; i < count; ++i) {
        ASSERT_EQ(eb_math::UnpackValue(packed.data(), i, width), v[i]) << width << " " << i;
      }
    }
  }
}

TEST(EbMathTest, ZigZagAndHeaders) {
  for (int32_t r : {0, 1, -1, 2, -2, 1 << 23, -(1 << 23), 1 << 26, -(1 << 26)}) {
    EXPECT_EQ(eb_math::UnZigZag(eb_math::ZigZag(r)), r);
  }
  EXPECT_EQ(eb_math::ZigZag(-1), 1u);
  EXPECT_EQ(eb_math::ZigZag(1), 2u);
  const uint32_t h = eb_math::HeaderWord(eb_math::kLorenzo, 27, eb_math::ZigZag(-(1 << 23)));
  EXPECT_TRUE(eb_math::ValidHeader(h));
  EXPECT_EQ(eb_math::HeaderAnchor(h), -(1 << 23));
  EXPECT_EQ(eb_math::HeaderWidth(h), 27u);
  EXPECT_FALSE(eb_math::ValidHeader(eb_math::HeaderWord(eb_math::kRow, 28, 0)));
  EXPECT_FALSE(eb_math::ValidHeader(eb_math::HeaderWord(eb_math::kVerbatim, 1, 0)));
  EXPECT_FALSE(eb_math::ValidHeader(eb_math::HeaderWord(eb_math::kOffset, 3, (1u << 24) + 1)));
}

TEST(EbMathTest, VerbatimWordsBeforeIsTheSumOfTheBlocksVerbatimSizes) {
  // (dims, planes, rows, cols): runs of 128 with a short last one, tiles with short last rows
  // and columns (odd counts for 16-bit elements), whole tiles.
  const uint64_t layouts[][4] = {{1, 1, 1, 1000}, {1, 1, 1, 256}, {2, 3, 13, 37}, {2, 2, 8, 16},
                                 {2, 1, 21, 19},  {2, 4, 9, 33},  {2, 1, 64, 64}};
  for (const auto& d : layouts) {
    const eb_math::Layout l = eb_math::MakeLayout(static_cast<int>(d[0]), d[1], d[2], d[3]);
    for (uint32_t bytes : {4u, 2u}) {
      uint64_t sum = 0;
      for (uint64_t b = 0; b <= l.blocks; ++b) {
        ASSERT_EQ(eb_math::VerbatimWordsBefore(l, b, bytes), sum)
            << d[0] << " " << d[1] << "x" << d[2] << "x" << d[3] << " bytes " << bytes << " block "
            << b;
        if (b < l.blocks) sum += eb_math::VerbatimWords(eb_math::TileOf(l, b).count, bytes);
      }
    }
  }
}

// ---- the order of work of the CUDA kernels, on the host ----
//
// cuda/eb_kernels.cu cannot run here, so these follow its algorithm step by step (codes in
// the padded tile layout, eb_math::Residual, PackWord one word at a time, outliers by slot,
// inverse prediction as prefix sums over padded rows and columns) and must reproduce the CPU
// encoder's bytes and decoder's values exactly.

eb_math::Layout LayoutFromHeader(const Header& h) {
  const std::vector<int64_t> shape = h.Shape();
  if (h.params[1] == 2) {
    const uint64_t rows = shape[shape.size() - 2], cols = shape.back();
    return eb_math::MakeLayout(2, h.numel / (rows * cols), rows, cols);
  }
  return eb_math::MakeLayout(1, 1, 1, h.numel);
}

template <int K>
std::vector<uint32_t> KernelOrderPayload(const Typed& in, const Header& h) {
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  const eb_math::Layout l = LayoutFromHeader(h);
  const eb_math::Quantizer qz = eb_math::MakeQuantizer(ParamFloat(h, 4), ParamFloat(h, 8));
  std::vector<uint32_t> headers(l.blocks), index(2 * l.chunks), data;
  std::vector<uint64_t> slots;
  std::vector<uint32_t> raw;
  for (uint64_t b = 0; b < l.blocks; ++b) {
    if (b % eb_math::kBlocksPerChunk == 0) {
      index[2 * (b / 32)] = static_cast<uint32_t>(data.size());
      index[2 * (b / 32) + 1] = static_cast<uint32_t>(static_cast<uint64_t>(data.size()) >> 32);
    }
    const eb_math::Tile t = eb_math::TileOf(l, b);
    int32_t k[eb_math::kBlockValues] = {};
    bool outlier[eb_math::kBlockValues] = {};
    int32_t lo = eb_math::kMaxCode, hi = -eb_math::kMaxCode;
    auto real = [&](uint32_t s) { return s / l.tile_cols < t.rows && s % l.tile_cols < t.cols; };
    auto element = [&](uint32_t s) { return t.origin + s / l.tile_cols * l.cols + s % l.tile_cols; };
    for (uint32_t s = 0; s < eb_math::kBlockValues; ++s) {
      if (!real(s)) continue;
      outlier[s] = !eb_math::Quantize<K>(in.values[element(s)], qz, &k[s]);
      lo = std::min(lo, k[s]);
      hi = std::max(hi, k[s]);
    }
    const int32_t mid = eb_math::MidCode(lo, hi);
    uint32_t ors[4] = {}, outliers = 0;
    for (uint32_t s = 0; s < eb_math::kBlockValues; ++s) {
      if (!real(s)) continue;
      outliers += outlier[s];
      for (uint32_t mode = eb_math::kOffset; mode <= eb_math::kLorenzo; ++mode) {
        ors[mode] |= eb_math::ZigZag(eb_math::Residual(mode, k, l.tile_cols, s / l.tile_cols,
                                                       s % l.tile_cols,
                                                       mode == eb_math::kOffset ? mid : k[0]));
      }
    }
    const eb_math::BlockChoice choice = eb_math::ChooseBlock(
        ors[1], ors[2], ors[3], mid, k[0], outliers, t.count, kBytes);
    headers[b] = choice.header;
    const uint32_t mode = eb_math::HeaderMode(choice.header);
    uint32_t v[eb_math::kBlockValues];
    for (uint32_t s = 0; s < eb_math::kBlockValues; ++s) {
      if (!real(s)) continue;
      const uint32_t i = s / l.tile_cols * t.cols + s % l.tile_cols;
      v[i] = mode == eb_math::kVerbatim
                 ? BitsOf(in, element(s))
                 : eb_math::ZigZag(eb_math::Residual(mode, k, l.tile_cols, s / l.tile_cols,
                                                     s % l.tile_cols,
                                                     eb_math::HeaderAnchor(choice.header)));
    }
    for (uint32_t w = 0; w < choice.data_words; ++w) {
      if (mode != eb_math::kVerbatim) {
        data.push_back(eb_math::PackWord(v, t.count, eb_math::HeaderWidth(choice.header), w));
      } else if (kBytes == 4) {
        data.push_back(v[w]);
      } else {
        data.push_back(v[2 * w] | (2 * w + 1 < t.count ? v[2 * w + 1] << 16 : 0u));
      }
    }
    for (uint32_t s = 0; s < eb_math::kBlockValues && mode != eb_math::kVerbatim; ++s) {
      if (!real(s) || !outlier[s]) continue;
      slots.push_back(b * eb_math::kBlockValues + s / l.tile_cols * t.cols + s % l.tile_cols);
      raw.push_back(BitsOf(in, element(s)));
    }
  }
  std::vector<uint32_t> payload = headers;
  payload.insert(payload.end(), index.begin(), index.end());
  payload.insert(payload.end(), data.begin(), data.end());
  for (uint64_t slot : slots) {
    payload.push_back(static_cast<uint32_t>(slot));
    payload.push_back(static_cast<uint32_t>(slot >> 32));
  }
  payload.insert(payload.end(), raw.begin(), raw.end());
  return payload;
}

// Decoded values (as float) of a valid payload, in the kernels' order of work.
template <int K>
std::vector<float> KernelOrderDecode(const std::vector<uint8_t>& buffer) {
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  const Header h = HeaderOf(buffer);
  const eb_math::Layout l = LayoutFromHeader(h);
  const float q = ParamFloat(h, 4);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(buffer.data() + kHeaderSize);
  const uint64_t data_words = h.payload_size / 4 - l.blocks - 2 * l.chunks - 3 * OutlierCount(h);
  const uint32_t* data = words + l.blocks + 2 * l.chunks;
  std::vector<uint32_t> out(h.numel);
  const uint32_t tc = l.tile_cols, tr = l.tile_rows;
  for (uint64_t b = 0; b < l.blocks; ++b) {
    const uint32_t header = words[b];
    const eb_math::Tile t = eb_math::TileOf(l, b);
    const uint32_t mode = eb_math::HeaderMode(header);
    if (mode == eb_math::kVerbatim) {
      for (uint32_t i = 0; i < t.count; ++i) {
        out[eb_math::ElementOf(l, t, i)] =
            kBytes == 4 ? data[i] : (data[i / 2] >> (16 * (i % 2))) & 0xffffu;
      }
      data += eb_math::DataWords(header, t.count, kBytes);
      continue;
    }
    uint32_t k[eb_math::kBlockValues] = {};
    for (uint32_t s = 0; s < eb_math::kBlockValues; ++s) {
      const uint32_t r = s / tc, c = s % tc;
      if (r < t.rows && c < t.cols) {
        k[s] = eb_math::UnZigZag(eb_math::UnpackValue(data, r * t.cols + c, eb_math::HeaderWidth(header)));
      }
    }
    if (mode == eb_math::kRow) {
      for (uint32_t r = 1; r < tr; ++r) k[r * tc] += k[(r - 1) * tc];
    }
    if (mode != eb_math::kOffset) {
      for (uint32_t r = 0; r < tr; ++r) {
        for (uint32_t c = 1; c < tc; ++c) k[r * tc + c] += k[r * tc + c - 1];
      }
    }
    if (mode == eb_math::kLorenzo) {
      for (uint32_t c = 0; c < tc; ++c) {
        for (uint32_t r = 1; r < tr; ++r) k[r * tc + c] += k[(r - 1) * tc + c];
      }
    }
    for (uint32_t s = 0; s < eb_math::kBlockValues; ++s) {
      const uint32_t r = s / tc, c = s % tc;
      if (r >= t.rows || c >= t.cols) continue;
      const float v = eb_math::RoundTo<K>(
          eb_math::Dequantize(static_cast<int32_t>(k[s] + eb_math::HeaderAnchor(header)), q));
      uint32_t bits = portable::FloatBits(v);
      if (K == elements::kF16) bits = portable::FloatToHalf(v);
      if (K == elements::kBF16) bits = portable::FloatToBf16(v);
      out[t.origin + r * l.cols + c] = bits;
    }
    data += eb_math::DataWords(header, t.count, kBytes);
  }
  const uint32_t* slots = words + l.blocks + 2 * l.chunks + data_words;
  const uint32_t* raw = slots + 2 * OutlierCount(h);
  for (uint64_t j = 0; j < OutlierCount(h); ++j) {
    const uint64_t slot = slots[2 * j] | static_cast<uint64_t>(slots[2 * j + 1]) << 32;
    const eb_math::Tile t = eb_math::TileOf(l, slot / eb_math::kBlockValues);
    out[eb_math::ElementOf(l, t, slot % eb_math::kBlockValues)] = raw[j];
  }
  std::vector<float> values(h.numel);
  for (uint64_t i = 0; i < h.numel; ++i) {
    values[i] = K == elements::kF32 ? portable::BitsToFloat(out[i])
                : K == elements::kF16 ? portable::HalfToFloat(static_cast<uint16_t>(out[i]))
                                      : portable::Bf16ToFloat(static_cast<uint16_t>(out[i]));
  }
  return values;
}

// Also counts the blocks of each mode into `modes`.
template <int K>
void ExpectKernelOrderAgrees(const Typed& in, const std::string& spec, uint64_t modes[4]) {
  const std::vector<uint8_t> buffer = *Encode(in, spec);
  const Header h = HeaderOf(buffer);
  const eb_math::Layout l = LayoutFromHeader(h);
  for (uint64_t b = 0; b < l.blocks; ++b) {
    uint32_t word;
    std::memcpy(&word, buffer.data() + kHeaderSize + 4 * b, 4);
    ++modes[eb_math::HeaderMode(word)];
  }
  const std::vector<uint32_t> expected = KernelOrderPayload<K>(in, h);
  ASSERT_EQ(expected.size() * 4, h.payload_size) << spec;
  EXPECT_EQ(std::memcmp(expected.data(), buffer.data() + kHeaderSize, h.payload_size), 0) << spec;
  const std::vector<float> decoded = KernelOrderDecode<K>(buffer);
  const Typed out = DecodeTyped(buffer, in.dtype, in.shape);
  for (size_t i = 0; i < decoded.size(); ++i) {
    ASSERT_EQ(portable::FloatBits(decoded[i]), portable::FloatBits(out.values[i]))
        << spec << " " << DTypeName(in.dtype) << " i " << i;
  }
}

TEST(EbTest, KernelOrderOfWorkGivesTheSameBytesAndValues) {
  std::vector<float> smooth = SineField(45, 150, 2.0f);
  std::vector<float> mixed = Gaussian(45 * 150, 12);
  for (size_t i = 0; i < mixed.size(); i += 7) mixed[i] = 0.0f;
  mixed[17] = std::nanf("");
  mixed[900] = -kInf;
  mixed[901] = 1e35f;  // an outlier by code range under abs bounds
  uint64_t modes[4] = {};
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{45, 150}, {3, 15, 150}, {6750}, {150, 45}, {2, 3375}}) {
    for (const auto* x : {&smooth, &mixed}) {
      for (const char* spec : {"eb", "eb:rel=1e-4", "eb:abs=0.05", "eb:abs=1e-7"}) {
        ExpectKernelOrderAgrees<elements::kF32>(MakeTyped(*x, DType::kFloat32, shape), spec, modes);
        ExpectKernelOrderAgrees<elements::kF16>(MakeTyped(*x, DType::kFloat16, shape), spec, modes);
        ExpectKernelOrderAgrees<elements::kBF16>(MakeTyped(*x, DType::kBFloat16, shape), spec,
                                                 modes);
      }
    }
  }
  // Every predictor and the verbatim form were exercised.
  for (int mode = 0; mode < 4; ++mode) EXPECT_GT(modes[mode], 10u) << "mode " << mode;
}

// ---- corrupt and truncated buffers ----

std::vector<uint8_t> SampleBuffer(std::vector<float>* values = nullptr) {
  std::vector<float> x = SineField(40, 70);
  x[3] = std::nanf("");
  x[1000] = 5e30f;  // beyond the code range: an outlier
  if (values != nullptr) *values = x;
  return *Encode(MakeTyped(x, DType::kFloat32, {40, 70}), "eb:abs=1e-3");
}

// Decodes into an output of the dtype and shape the buffer's header names.
absl::Status DecodeStatus(const std::vector<uint8_t>& buffer) {
  const absl::StatusOr<Header> header = ParseHeader(buffer.data(), buffer.size());
  if (!header.ok()) return header.status();
  if (header->numel > (1 << 20)) return absl::DataLossError("test: implausible shape");
  std::vector<uint8_t> out(header->numel * ElementSize(header->dtype));
  const MutableTensorView output{out.data(), header->dtype, header->Shape(), Device::kCpu};
  return Decode(buffer.data(), buffer.size(), output, {});
}

// Rewrites the checksum so that the codec's own validation is what rejects a change (when
// the change left a header that parses).
void Reseal(std::vector<uint8_t>* buffer) {
  absl::StatusOr<Header> parsed = ParseHeader(buffer->data(), buffer->size());
  if (!parsed.ok()) return;
  Header& h = *parsed;
  h.checksum = CombineChecksum(HeaderChecksum(h),
                               PayloadChecksum(buffer->data() + kHeaderSize, h.payload_size));
  WriteHeader(h, buffer->data());
}

TEST(EbTest, ResealedCorruptionIsDataLossOrDecodesWithoutCrashing) {
  const std::vector<uint8_t> buffer = SampleBuffer();
  std::mt19937 rng(11);
  for (size_t i = 0; i < buffer.size(); ++i) {
    std::vector<uint8_t> corrupt = buffer;
    corrupt[i] ^= static_cast<uint8_t>(1u << (rng() % 8));
    Reseal(&corrupt);
    const absl::Status status = DecodeStatus(corrupt);
    EXPECT_TRUE(status.ok() || status.code() == absl::StatusCode::kDataLoss) << i << status;
  }
}

// Each of the codec's own checks, with the checksum repaired.
TEST(EbTest, ResealedCorruptionOfEachFieldIsDataLoss) {
  const std::vector<uint8_t> buffer = SampleBuffer();
  const Header h = HeaderOf(buffer);
  ASSERT_EQ(OutlierCount(h), 2u);
  const size_t params = 80;
  const size_t payload = kHeaderSize;
  const uint64_t blocks = 5 * 5;  // 40 x 70 in 8 x 16 tiles
  const size_t index = payload + 4 * blocks;
  const size_t outliers = kHeaderSize + h.payload_size - 12 * 2;
  auto set32 = [](std::vector<uint8_t>* b, size_t at, uint32_t v) { std::memcpy(b->data() + at, &v, 4); };
  auto set64 = [](std::vector<uint8_t>* b, size_t at, uint64_t v) { std::memcpy(b->data() + at, &v, 8); };
  const float nan = std::nanf("");
  uint32_t nan_bits;
  std::memcpy(&nan_bits, &nan, 4);
  const std::vector<std::pair<std::string, std::function<void(std::vector<uint8_t>*)>>> edits = {
      {"bound mode", [&](auto* b) { (*b)[params] = 3; }},
      {"layout", [&](auto* b) { (*b)[params + 1] = 1; }},
      {"parameter byte 2", [&](auto* b) { (*b)[params + 2] = 1; }},
      {"parameter byte 13", [&](auto* b) { (*b)[params + 13] = 1; }},
      {"half-bin 0", [&](auto* b) { set32(b, params + 4, 0); }},
      {"half-bin NaN", [&](auto* b) { set32(b, params + 4, nan_bits); }},
      {"negative bound", [&](auto* b) { (*b)[params + 11] |= 0x80; }},
      {"outliers > numel", [&](auto* b) { set64(b, params + 16, 40 * 70 + 1); }},
      {"one more outlier", [&](auto* b) { set64(b, params + 16, 3); }},
      {"one fewer outlier", [&](auto* b) { set64(b, params + 16, 1); }},
      {"block width 31", [&](auto* b) { (*b)[payload] |= 31 << 2; }},
      {"verbatim with bits", [&](auto* b) { set32(b, payload + 4, 0x80); }},
      {"block anchor", [&](auto* b) { set32(b, payload + 8, eb_math::HeaderWord(3, 2, (1u << 24) + 2)); }},
      {"chunk index", [&](auto* b) { (*b)[index] = 1; }},
      {"outlier order", [&](auto* b) { set64(b, outliers, 5000); }},
      {"outlier slot past its tile", [&](auto* b) { set64(b, outliers, 4 * 128 + 100); }},
      {"payload not whole words", [&](auto* b) {
         Header hh = *ParseHeader(b->data(), b->size());
         hh.payload_size -= 1;
         WriteHeader(hh, b->data());
       }},
  };
  for (const auto& [what, edit] : edits) {
    std::vector<uint8_t> corrupt = buffer;
    edit(&corrupt);
    Reseal(&corrupt);
    const absl::Status status = DecodeStatus(corrupt);
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << what << ": " << status;
    EXPECT_NE(status.message().find("eb"), absl::string_view::npos) << what << ": " << status;
  }
}

TEST(EbTest, RejectsUnsupportedDtypesAndBounds) {
  const std::vector<int32_t> ints(8);
  EXPECT_EQ(testing::EncodeToVector(ints.data(), DType::kInt32, {8}, *ParseCodecSpec("eb"))
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  CodecParams p = *ParseCodecSpec("eb");
  p.error_bound = 0;
  const absl::StatusOr<size_t> size = MaxEncodedSize({DType::kFloat32, {8}}, p);
  EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(size.status().message().find("rel"), absl::string_view::npos);
  p.eb_mode = static_cast<EbMode>(7);
  p.error_bound = 0.1;
  EXPECT_EQ(MaxEncodedSize({DType::kFloat32, {8}}, p).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace actpack::codecs

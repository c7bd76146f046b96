#include "codecs/division.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/codec.h"
#include "codecs/internal/dct_math.h"
#include "codecs/internal/division_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"
#include "codecs/registry.h"
#include "codecs/testing/test_util.h"
#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

using division_math::Layout;
using testing::DecodeFloats;
using testing::EncodeFloats;
using testing::Gaussian;

CodecParams Spec(const char* spec, uint64_t seed = 1) {
  absl::StatusOr<CodecParams> p = ParseCodecSpec(spec);
  EXPECT_TRUE(p.ok()) << spec << ": " << p.status();
  p->seed = seed;
  return *p;
}

uint64_t Numel(const std::vector<int64_t>& shape) { return TensorSpec{DType::kFloat32, shape}.numel(); }

// The payload's 32-bit words.
std::vector<uint32_t> Words(const std::vector<uint8_t>& buffer) {
  std::vector<uint32_t> words((buffer.size() - kHeaderSize) / 4);
  std::memcpy(words.data(), buffer.data() + kHeaderSize, words.size() * 4);
  return words;
}

Layout LayoutFor(const std::vector<int64_t>& shape, const CodecParams& p) {
  const Layout l = division_math::MakeResidualLayout(shape.data(), static_cast<int>(shape.size()),
                                                     p.bits, p.group_size, p.seed);
  return division_math::MakePoolLayout(l, p.block);
}

// A batch of smooth maps [n, c, h, w] (waves with periods of 100 to 250 pixels, a per-plane
// phase and offset) plus Gaussian noise: what DIVISION is designed for.
std::vector<float> SmoothImages(const std::vector<int64_t>& shape, float noise, uint32_t seed) {
  const int64_t planes = shape[0] * shape[1], h = shape[2], w = shape[3];
  std::vector<float> x = Gaussian(Numel(shape), seed, 0.0f, noise);
  for (int64_t p = 0; p < planes; ++p) {
    const double period_y = 100 + 30 * (p % 6), period_x = 120 + 25 * (p % 5), phase = 0.7 * p;
    for (int64_t i = 0; i < h; ++i) {
      for (int64_t j = 0; j < w; ++j) {
        x[(p * h + i) * w + j] += static_cast<float>(
            2.0 * std::sin(2 * M_PI * i / period_y + phase) * std::cos(2 * M_PI * j / period_x) +
            0.3 * (p % 3));
      }
    }
  }
  return x;
}

// The largest stored step of a `division` buffer's groups.
float MaxStep(const std::vector<uint8_t>& buffer, const Layout& l) {
  const std::vector<uint32_t> words = Words(buffer);
  float step = 0;
  for (uint64_t g = 0; g < l.groups; ++g) {
    step = std::max(step, quant_math::UnpackGroupParams(words[division_math::ParamWord(l, g)]).step);
  }
  return step;
}

double RelativeRms(const std::vector<float>& x, const std::vector<float>& y) {
  double err = 0, norm = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (double{y[i]} - x[i]) * (double{y[i]} - x[i]);
    norm += double{x[i]} * x[i];
  }
  return std::sqrt(err / norm);
}

// The [planes, H, W, C] view and the window, as FORMAT.md states them (written out here
// independently of division_math).
struct View {
  int64_t planes, height, width, inner, block_h, block_w;
};

View ViewOf(const std::vector<int64_t>& shape, int block) {
  const int ndim = static_cast<int>(shape.size());
  View v{1, 1, 1, 1, 1, 1};
  for (int i = 0; i + 2 < ndim; ++i) v.planes *= shape[i];
  if (ndim >= 4) {
    v.height = shape[ndim - 2];
    v.width = shape[ndim - 1];
  } else if (ndim >= 2) {
    v.height = shape[ndim - 2];
    v.inner = shape[ndim - 1];
  } else if (ndim == 1) {
    v.width = shape[0];
  }
  v.block_h = std::min<int64_t>(block, v.height);
  v.block_w = std::min<int64_t>(block, v.width);
  return v;
}

// Window means in double, [planes, ceil(H/bh), ceil(W/bw), C].
std::vector<double> ExpectedMeans(const std::vector<float>& x, const View& v) {
  const int64_t hb = (v.height + v.block_h - 1) / v.block_h;
  const int64_t wb = (v.width + v.block_w - 1) / v.block_w;
  std::vector<double> means;
  for (int64_t p = 0; p < v.planes; ++p) {
    for (int64_t a = 0; a < hb; ++a) {
      for (int64_t b = 0; b < wb; ++b) {
        for (int64_t c = 0; c < v.inner; ++c) {
          double sum = 0;
          int count = 0;
          for (int64_t h = a * v.block_h; h < std::min(v.height, (a + 1) * v.block_h); ++h) {
            for (int64_t w = b * v.block_w; w < std::min(v.width, (b + 1) * v.block_w); ++w) {
              sum += x[((p * v.height + h) * v.width + w) * v.inner + c];
              ++count;
            }
          }
          means.push_back(sum / count);
        }
      }
    }
  }
  return means;
}

// ---- division ----

// The stored LFC is the window mean (bf16-rounded), for H and W that are not multiples of B,
// H < B, and the 3-D / 2-D / 1-D views (pooling along tokens, rows, the only dim).
TEST(DivisionTest, LfcIsTheWindowMeanInEveryView) {
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 3, 13, 21}, {1, 2, 5, 30}, {2, 1, 1, 17}, {3, 20, 7}, {50, 9}, {100}, {1}, {}};
  for (const char* spec : {"division", "division:block=4,bits=2", "division:block=64,bits=2"}) {
    const CodecParams params = Spec(spec);
    for (const std::vector<int64_t>& shape : shapes) {
      const std::vector<float> x = Gaussian(Numel(shape), 3, 1.0f, 2.0f);
      const std::vector<uint8_t> buffer = *EncodeFloats(x, shape, params);
      const std::vector<double> expected = ExpectedMeans(x, ViewOf(shape, params.block));
      const Layout l = LayoutFor(shape, params);
      ASSERT_EQ(l.means, expected.size()) << spec;
      const std::vector<uint32_t> words = Words(buffer);
      ASSERT_EQ(words.size(), l.payload_words());
      for (size_t m = 0; m < expected.size(); ++m) {
        const float stored = portable::Bf16ToFloat(static_cast<uint16_t>(words[m / 2] >> (16 * (m % 2))));
        ASSERT_NEAR(stored, expected[m], std::abs(expected[m]) / 256 + 1e-6) << spec << " m " << m;
      }
      if (expected.size() % 2 == 1) {
        EXPECT_EQ(words[expected.size() / 2] >> 16, 0u);
      }
    }
  }
}

TEST(DivisionTest, MeanOfNarrowAndOfRowsAreMeanOfForEveryValue) {
  // The kernels' multiplications against the division operator's MeanOf, window starts too.
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 3, 13, 21}, {1, 2, 5, 30}, {2, 1, 1, 17}, {3, 20, 7}, {50, 9}, {100}, {1}, {4, 7, 9, 5}};
  for (const char* spec : {"division", "division:block=3,bits=2", "division:block=64,bits=2"}) {
    const CodecParams params = Spec(spec);
    for (const std::vector<int64_t>& shape : shapes) {
      const Layout l = LayoutFor(shape, params);
      ASSERT_TRUE(division_math::Narrow(l));
      const division_math::MeanDivisors d = division_math::MakeMeanDivisors(l);
      for (uint64_t i = 0; i < l.planes * l.plane; ++i) {
        ASSERT_EQ(portable::Divide(static_cast<uint32_t>(i), d.plane), i / l.plane);
        const uint64_t p = i / l.plane, j = i % l.plane;
        ASSERT_EQ(portable::Divide(static_cast<uint32_t>(j), d.group_length), j / l.group_length);
        bool starts = false, narrow_starts = false;
        const uint64_t m = division_math::MeanOf(l, p, j, &starts);
        ASSERT_EQ(division_math::MeanOfNarrow(l, d, p, static_cast<uint32_t>(j), &narrow_starts),
                  m) << spec << " value " << i;
        ASSERT_EQ(narrow_starts, starts) << spec << " value " << i;
        if (l.inner == 1) {
          ASSERT_EQ(division_math::MeanOfRowsNarrow(l, d, p, static_cast<uint32_t>(j)), m)
              << spec << " value " << i;
        }
      }
    }
  }
}

class DivisionBitsTest : public ::testing::TestWithParam<int> {};

// Every decoded value lies within one step of its input, the step being its group's stored
// one; the step is the group's residual range / levels rounded up to bfloat16.
TEST_P(DivisionBitsTest, ErrorWithinOneStepOfTheGroup) {
  const int bits = GetParam();
  const CodecParams params = Spec(absl::StrCat("division:block=8,bits=", bits).c_str());
  const float levels = static_cast<float>((1 << bits) - 1);
  for (const std::vector<int64_t>& shape :
       std::vector<std::vector<int64_t>>{{2, 3, 19, 37}, {4, 33, 40}, {300, 7}, {1000}}) {
    const std::vector<float> x = Gaussian(Numel(shape), 5, 0.5f, 2.0f);
    const std::vector<uint8_t> buffer = *EncodeFloats(x, shape, params);
    const std::vector<float> y = DecodeFloats(buffer, shape);
    const Layout l = LayoutFor(shape, params);
    const std::vector<uint32_t> words = Words(buffer);
    const uint16_t* means = reinterpret_cast<const uint16_t*>(words.data());
    for (uint64_t p = 0; p < l.planes; ++p) {
      for (uint64_t q = 0; q < l.groups_per_plane; ++q) {
        const quant_math::GroupParams gp = quant_math::UnpackGroupParams(
            words[division_math::ParamWord(l, p * l.groups_per_plane + q)]);
        float lo = INFINITY, hi = -INFINITY;
        for (uint64_t k = 0; k < division_math::GroupSize(l, q); ++k) {
          const uint64_t j = q * l.group_length + k;
          const float r = x[p * l.plane + j] - portable::Bf16ToFloat(means[division_math::MeanOf(l, p, j)]);
          lo = std::min(lo, r);
          hi = std::max(hi, r);
        }
        // The minimum is rounded down to bfloat16, the step up.
        ASSERT_LE(gp.min, lo);
        ASSERT_GE(gp.min, lo - std::abs(lo) / 128);
        ASSERT_LE(gp.step, (hi - gp.min) / levels * (1 + 1.0f / 128));
        for (uint64_t k = 0; k < division_math::GroupSize(l, q); ++k) {
          const uint64_t i = p * l.plane + q * l.group_length + k;
          ASSERT_LE(std::abs(y[i] - x[i]), gp.step * (1 + 1e-5f) + 4e-7f * (1 + std::abs(x[i])))
              << "bits " << bits << " i " << i;
        }
      }
    }
  }
}

// Stochastic rounding of the residual is unbiased: over many seeds the mean decoded value
// converges to the input, far closer than one step.
TEST_P(DivisionBitsTest, StochasticRoundingIsUnbiased) {
  const int bits = GetParam();
  const std::vector<int64_t> shape = {1, 2, 16, 16};
  const std::vector<float> x = SmoothImages(shape, 0.3f, 11);
  std::vector<double> mean(x.size(), 0.0);
  const int draws = 1000;
  for (int seed = 0; seed < draws; ++seed) {
    const CodecParams params = Spec(absl::StrCat("division:block=8,bits=", bits).c_str(), seed);
    const std::vector<float> y = DecodeFloats(*EncodeFloats(x, shape, params), shape);
    for (size_t i = 0; i < x.size(); ++i) mean[i] += y[i];
  }
  // The largest step of any group (they do not depend on the seed).
  const CodecParams params = Spec(absl::StrCat("division:block=8,bits=", bits).c_str());
  const double step = MaxStep(*EncodeFloats(x, shape, params), LayoutFor(shape, params));
  double worst_bias = 0, mean_bias = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double bias = mean[i] / draws - x[i];
    worst_bias = std::max(worst_bias, std::abs(bias));
    mean_bias += bias;
  }
  mean_bias /= x.size();
  // One draw errs with standard deviation <= step / 2: 5 sigma of the mean of `draws`.
  EXPECT_LT(worst_bias, 5.0 * step / 2 / std::sqrt(draws) * 1.2) << "bits " << bits;
  EXPECT_LT(std::abs(mean_bias), 5.0 * step / 2 / std::sqrt(draws * double(x.size())) + 1e-7)
      << "bits " << bits;
}

INSTANTIATE_TEST_SUITE_P(Bits, DivisionBitsTest, ::testing::Values(1, 2, 4, 8));

// DIVISION's point: on smooth maps the LFC carries most of the signal, so the 2-bit residual
// is far finer than quant2's 2-bit values at about the same bytes.
TEST(DivisionTest, SmoothImagesDecodeMuchBetterThanQuant2) {
  const std::vector<int64_t> shape = {4, 8, 64, 64};
  const std::vector<float> x = SmoothImages(shape, 0.02f, 1);
  const std::vector<uint8_t> division = *EncodeFloats(x, shape, Spec("division"));
  const std::vector<uint8_t> quant = *EncodeFloats(x, shape, Spec("quant2"));
  const double division_error = RelativeRms(x, DecodeFloats(division, shape));
  const double quant_error = RelativeRms(x, DecodeFloats(quant, shape));
  EXPECT_LE(division.size(), quant.size() * 1.2);  // 2.5 vs 2.125 bits per value
  EXPECT_LT(division_error, quant_error / 4) << division_error << " vs " << quant_error;
}

// fp32 NCHW at B = 8, 2 bits: 2 code bits + 16/64 LFC bits + 32/128 group bits per value, i.e.
// 12.8x before the header; measured 12.76x on [8, 16, 32, 32].
TEST(DivisionTest, Float32NchwRatioAtLeastTwelve) {
  const std::vector<int64_t> shape = {8, 16, 32, 32};
  const std::vector<float> x = SmoothImages(shape, 0.5f, 2);
  const std::vector<uint8_t> buffer = *EncodeFloats(x, shape, Spec("division"));
  const double ratio = 4.0 * x.size() / buffer.size();
  EXPECT_GE(ratio, 12.0);
  EXPECT_EQ(buffer.size(), kHeaderSize + 128 * (32 + 32 + 256));
}

// A map that is constant on every window (with bfloat16 values) is its own LFC: the residual
// is zero and decodes exactly.
TEST(DivisionTest, PiecewiseConstantMapsDecodeExactly) {
  const std::vector<int64_t> shape = {2, 2, 20, 12};
  std::vector<float> x(Numel(shape));
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t w = i % 12, h = (i / 12) % 20, p = i / 240;
    x[i] = static_cast<float>(p) * 0.25f + static_cast<float>(h / 8) - 0.5f * (w / 8);
  }
  EXPECT_EQ(DecodeFloats(*EncodeFloats(x, shape, Spec("division")), shape), x);
}

// The CPU reference's fast loops give the bytes of the portable per-element functions the
// CUDA kernels run (division_math::LfcWord per LFC word; per group the residual min/max,
// quant_math's parameters and codes with UniformFloat draws).
template <int K>
std::vector<uint32_t> PortablePayload(const void* input, const Layout& l) {
  std::vector<uint32_t> words(l.payload_words(), 0);
  uint64_t nonfinite = 0;
  for (uint64_t w = 0; w < l.lfc_words; ++w) words[w] = division_math::LfcWord<K>(input, l, w, &nonfinite);
  const uint16_t* means = reinterpret_cast<const uint16_t*>(words.data());
  const uint32_t per_word = 32 / l.bits;
  for (uint64_t g = 0; g < l.groups; ++g) {
    const uint64_t p = g / l.groups_per_plane, q = g % l.groups_per_plane;
    const uint64_t j0 = q * l.group_length, n = division_math::GroupSize(l, q);
    std::vector<float> r(n);
    float lo = INFINITY, hi = -INFINITY;
    for (uint64_t k = 0; k < n; ++k) {
      r[k] = division_math::Residual(elements::Load<K>(input, p * l.plane + j0 + k),
                                     portable::Bf16ToFloat(means[division_math::MeanOf(l, p, j0 + k)]));
      lo = portable::Min(lo, r[k]);
      hi = portable::Max(hi, r[k]);
    }
    const quant_math::GroupParams gp = quant_math::MakeGroupParams(lo, hi, l.bits);
    words[division_math::ParamWord(l, g)] = gp.packed;
    for (uint64_t k = 0; k < n; ++k) {
      const uint64_t i = p * l.plane + j0 + k;
      const uint32_t code = quant_math::Quantize(r[k], gp, portable::UniformFloat(l.seed, i), (1u << l.bits) - 1);
      words[division_math::PlaneCodeWord(l, p) + (j0 + k) / per_word] |= code << (((j0 + k) % per_word) * l.bits);
    }
  }
  return words;
}

TEST(DivisionTest, CpuLoopsWriteThePortableFunctionsBytes) {
  const std::vector<std::vector<int64_t>> shapes = {
      {2, 3, 19, 37}, {1, 1, 3, 70}, {3, 20, 7}, {130, 33}, {1001}, {}};
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const char* spec : {"division", "division:block=3,bits=1", "division:block=16,bits=4,group=64",
                             "division:block=5,bits=8,group=32"}) {
      const CodecParams params = Spec(spec, 77);
      for (const std::vector<int64_t>& shape : shapes) {
        const std::vector<float> x = Gaussian(Numel(shape), 9, -1.0f, 3.0f);
        std::vector<uint16_t> halves(x.size());
        for (size_t i = 0; i < x.size(); ++i) {
          halves[i] = dtype == DType::kFloat16 ? portable::FloatToHalf(x[i]) : portable::FloatToBf16(x[i]);
        }
        const void* data = dtype == DType::kFloat32 ? static_cast<const void*>(x.data()) : halves.data();
        const std::vector<uint8_t> buffer = *testing::EncodeToVector(data, dtype, shape, params);
        const Layout l = LayoutFor(shape, params);
        const std::vector<uint32_t> expected =
            dtype == DType::kFloat32   ? PortablePayload<elements::kF32>(data, l)
            : dtype == DType::kFloat16 ? PortablePayload<elements::kF16>(data, l)
                                       : PortablePayload<elements::kBF16>(data, l);
        EXPECT_EQ(Words(buffer), expected) << spec << " " << DTypeName(dtype) << " ndim " << shape.size();
      }
    }
  }
}

TEST(DivisionTest, HalfAndBfloat16Inputs) {
  const std::vector<int64_t> shape = {2, 4, 24, 24};
  const std::vector<float> x = SmoothImages(shape, 0.1f, 4);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    std::vector<uint16_t> in(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      in[i] = dtype == DType::kFloat16 ? portable::FloatToHalf(x[i]) : portable::FloatToBf16(x[i]);
    }
    const CodecParams params = Spec("division:block=8,bits=4");
    const std::vector<uint8_t> buffer = *testing::EncodeToVector(in.data(), dtype, shape, params);
    const float step = MaxStep(buffer, LayoutFor(shape, params));
    std::vector<uint16_t> out(x.size());
    ASSERT_TRUE(Decode(buffer.data(), buffer.size(), {out.data(), dtype, shape, Device::kCpu}, {}).ok());
    for (size_t i = 0; i < x.size(); ++i) {
      const auto load = [&](uint16_t h) {
        return dtype == DType::kFloat16 ? portable::HalfToFloat(h) : portable::Bf16ToFloat(h);
      };
      // One step, plus the output's rounding to its type.
      ASSERT_NEAR(load(in[i]), load(out[i]), step + std::abs(load(in[i])) / 128)
          << DTypeName(dtype) << " i " << i;
    }
  }
}

TEST(DivisionTest, EmptyAndScalarTensors) {
  for (const char* spec : {"division", "division_dct"}) {
    for (const std::vector<int64_t>& shape :
         std::vector<std::vector<int64_t>>{{0, 5}, {2, 0, 4, 4}, {3, 4, 0}, {0}}) {
      const std::vector<uint8_t> buffer = *EncodeFloats({}, shape, Spec(spec));
      EXPECT_EQ(buffer.size(), kHeaderSize) << spec;
      EXPECT_TRUE(DecodeFloats(buffer, shape).empty());
    }
    const std::vector<float> y = DecodeFloats(*EncodeFloats({-3.5f}, {}, Spec(spec)), {});
    ASSERT_EQ(y.size(), 1u);
    EXPECT_EQ(y[0], -3.5f) << spec;  // a bfloat16 / float16 value is its own LFC
  }
}

TEST(DivisionTest, NonFiniteValuesAndOverflowsAreRefused) {
  for (const char* spec : {"division", "division_dct"}) {
    for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
      std::vector<float> x = Gaussian(2 * 3 * 9 * 9, 1);
      x[100] = bad;
      const absl::StatusOr<std::vector<uint8_t>> encoded = EncodeFloats(x, {2, 3, 9, 9}, Spec(spec));
      ASSERT_EQ(encoded.status().code(), absl::StatusCode::kFailedPrecondition) << spec;
      EXPECT_NE(encoded.status().message().find("1 non-finite"), absl::string_view::npos)
          << encoded.status();
    }
    // Finite values whose window sum (division) or DCT coefficient (division_dct) overflows.
    const std::vector<float> big(64, 3e38f);
    EXPECT_EQ(EncodeFloats(big, {1, 1, 8, 8}, Spec(spec)).status().code(),
              absl::StatusCode::kFailedPrecondition) << spec;
  }
  // A coefficient is the plane's mean times at most 4: beyond bfloat16 only near float's end.
  const std::vector<float> wide = {3e38f, -3e38f, 3e38f, -3e38f, 3e38f, -3e38f, 3e38f, -3e38f};
  EXPECT_EQ(EncodeFloats(wide, {8}, Spec("division_dct")).status().code(),
            absl::StatusCode::kFailedPrecondition);
  const std::vector<float> large = {3e5f, 1.0f, 2.0f, 3.0f};  // beyond float16, not bfloat16
  EXPECT_TRUE(EncodeFloats(large, {4}, Spec("division_dct")).ok());
}

TEST(DivisionTest, SpecsParseAndFormat) {
  const CodecParams d = *ParseCodecSpec("division");
  EXPECT_EQ(d.codec, CodecId::kDivision);
  EXPECT_EQ(d.block, 8);
  EXPECT_EQ(d.bits, 2);
  EXPECT_EQ(d.group_size, kDivisionDefaultGroup);
  const CodecParams f = *ParseCodecSpec("division_dct");
  EXPECT_EQ(f.codec, CodecId::kDivisionDct);
  EXPECT_EQ(f.keep, kDivisionDefaultKeep);
  EXPECT_EQ(ParseCodecSpec("division:block=16,bits=4")->block, 16);
  EXPECT_EQ(ParseCodecSpec("division_dct:keep=32,bits=1")->keep, 32);
  for (const char* spec : {"division", "division:block=4,bits=2", "division:block=8,bits=4,group=256",
                           "division_dct", "division_dct:keep=8,bits=2", "division_dct:keep=1,bits=8,group=32"}) {
    EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec(spec)), spec);
  }
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("division:bits=2,block=8")), "division");
  for (const char* bad : {"division:block=1", "division:block=65", "division:bits=3", "division:group=100",
                          "division:group=0", "division_dct:keep=0", "division_dct:keep=33", "division_fft", "division2",
                          "division:colour=1"}) {
    const absl::StatusOr<CodecParams> p = ParseCodecSpec(bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseCodecSpec("division:block=65").status().message().find("65"), absl::string_view::npos);
}

// Any float tensor is encodable; other dtypes are refused naming the dtype.
TEST(DivisionTest, CheckEncodableRefusesOnlyNonFloatDtypes) {
  for (const char* spec : {"division", "division_dct"}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (const std::vector<int64_t>& shape : std::vector<std::vector<int64_t>>{
               {}, {1}, {7}, {3, 1}, {1, 1, 1}, {2, 3, 1, 1}, {1, 1, 1, 1, 1, 9}, {5, 0}}) {
        EXPECT_TRUE(MaxEncodedSize({dtype, shape}, Spec(spec)).ok()) << spec;
      }
    }
    for (DType dtype : {DType::kInt32, DType::kBool, DType::kUInt8}) {
      const absl::StatusOr<size_t> size = MaxEncodedSize({dtype, {4, 4}}, Spec(spec));
      EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(size.status().message().find(DTypeName(dtype)), absl::string_view::npos);
    }
  }
}

// Every prefix of a buffer is data loss; every byte flip is detected.
// A buffer whose checksum was repaired after a parameter was corrupted is still refused by
// the codec's own validation, naming the value.
TEST(DivisionTest, CorruptParametersAreDataLoss) {
  const std::vector<int64_t> shape = {2, 2, 8, 8};
  const std::vector<uint8_t> good = *EncodeFloats(Gaussian(256, 3), shape, Spec("division"));
  std::vector<float> out(256);
  const MutableTensorView output{out.data(), DType::kFloat32, shape, Device::kCpu};
  for (const auto& [offset, value, words] :
       std::vector<std::tuple<size_t, uint8_t, const char*>>{{80, 3, "bits 3"},
                                                            {81, 1, "block 1"},
                                                            {81, 65, "block 65"},
                                                            {82, 1, "byte 2 is not zero"},
                                                            {84, 100, "group size 100"},
                                                            {100, 1, "byte 20 is not zero"}}) {
    std::vector<uint8_t> bad = good;
    bad[offset] = value;
    absl::StatusOr<Header> header = ParseHeader(bad.data(), bad.size());
    ASSERT_TRUE(header.ok());
    header->checksum = CombineChecksum(HeaderChecksum(*header),
                                       PayloadChecksum(bad.data() + kHeaderSize, header->payload_size));
    WriteHeader(*header, bad.data());
    const absl::Status status = Decode(bad.data(), bad.size(), output, {});
    EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss) << words;
    EXPECT_NE(status.message().find(words), absl::string_view::npos) << status;
  }
}

TEST(DivisionTest, SameSeedSameBytesOtherSeedOtherBytes) {
  const std::vector<int64_t> shape = {2, 4, 16, 16};
  const std::vector<float> x = Gaussian(Numel(shape), 5);
  for (const char* spec : {"division", "division_dct"}) {
    EXPECT_EQ(*EncodeFloats(x, shape, Spec(spec, 9)), *EncodeFloats(x, shape, Spec(spec, 9)));
    EXPECT_NE(*EncodeFloats(x, shape, Spec(spec, 9)), *EncodeFloats(x, shape, Spec(spec, 10)));
  }
}

// ---- division_dct ----

TEST(DctMathTest, CosinesMatchTheLibraryCosine) {
  for (uint64_t n : {1u, 2u, 3u, 7u, 8u, 12u, 100u, 1024u, 99991u}) {
    for (uint64_t m = 0; m < n; m += std::max<uint64_t>(1, n / 997)) {
      ASSERT_NEAR(dct_math::TurnCos(m, n), std::cos(2 * M_PI * double(m) / double(n)), 3e-7)
          << m << "/" << n;
    }
  }
  // Exact at the axes.
  EXPECT_EQ(dct_math::TurnCos(0, 4), 1.0f);
  EXPECT_EQ(dct_math::TurnCos(1, 4), 0.0f);
  EXPECT_EQ(dct_math::TurnCos(2, 4), -1.0f);
  for (uint64_t n : {1u, 5u, 56u, 4097u}) {
    for (uint64_t f : {0u, 1u, 3u}) {
      for (uint64_t m = 0; m < n; m += std::max<uint64_t>(1, n / 50)) {
        ASSERT_NEAR(dct_math::Basis(m, f, n), std::cos(M_PI * (2 * m + 1) * f / (2.0 * n)), 3e-7);
      }
    }
  }
  // The product that reduces the angle does not overflow on a huge axis.
  const uint64_t n = uint64_t{1} << 40;
  EXPECT_EQ(dct_math::MulMod(n - 1, 31, 4 * n), (31 * (n - 1)) % (4 * n));
  EXPECT_EQ(dct_math::MulMod(4 * n - 1, 4 * n - 1, 4 * n), 1u);
}

TEST(DctMathTest, KeptFrequenciesAreAtMostAQuarterOfAnAxis) {
  EXPECT_EQ(dct_math::KeptAlong(1, 8), 1u);
  EXPECT_EQ(dct_math::KeptAlong(4, 8), 1u);
  EXPECT_EQ(dct_math::KeptAlong(5, 8), 2u);
  EXPECT_EQ(dct_math::KeptAlong(16, 8), 4u);
  EXPECT_EQ(dct_math::KeptAlong(56, 8), 8u);
  EXPECT_EQ(dct_math::KeptAlong(56, 32), 14u);
}

// The bfloat16 coefficients of the stored LFC, in stored order.
std::vector<float> StoredCoefficients(const std::vector<uint8_t>& buffer, size_t count) {
  std::vector<float> out(count);
  for (size_t j = 0; j < count; ++j) {
    uint16_t half;
    std::memcpy(&half, buffer.data() + kHeaderSize + 2 * j, 2);
    out[j] = portable::Bf16ToFloat(half);
  }
  return out;
}

// The stored coefficients are the scaled DCT-II's lowest frequencies (u, v below a quarter of
// each axis and k), rounded to bfloat16: checked against a direct transform in double.
TEST(DivisionDctTest, CoefficientsAreTheLowestCosineFrequencies) {
  for (const auto& [shape, keep] : std::vector<std::pair<std::vector<int64_t>, int>>{
           {{2, 1, 12, 10}, 3}, {{1, 2, 5, 6}, 4}, {{1, 1, 16, 16}, 8}, {{3, 9, 2}, 2},
           {{40}, 2}, {{2, 64, 3}, 32}}) {
    CodecParams params = Spec("division_dct");
    params.keep = keep;
    const std::vector<float> x = Gaussian(Numel(shape), 8, 0.3f, 1.0f);
    const std::vector<uint8_t> buffer = *EncodeFloats(x, shape, params);
    const View v = ViewOf(shape, 1);
    const int64_t rows = std::min<int64_t>(keep, (v.height + 3) / 4);
    const int64_t columns = std::min<int64_t>(keep, (v.width + 3) / 4);
    const std::vector<float> stored =
        StoredCoefficients(buffer, v.planes * rows * columns * v.inner);
    size_t j = 0;
    for (int64_t p = 0; p < v.planes; ++p) {
      for (int64_t u = 0; u < rows; ++u) {
        for (int64_t f = 0; f < columns; ++f) {
          for (int64_t c = 0; c < v.inner; ++c, ++j) {
            double sum = 0;
            for (int64_t h = 0; h < v.height; ++h) {
              for (int64_t w = 0; w < v.width; ++w) {
                sum += x[((p * v.height + h) * v.width + w) * v.inner + c] *
                       std::cos(M_PI * (2 * h + 1) * u / (2.0 * v.height)) *
                       std::cos(M_PI * (2 * w + 1) * f / (2.0 * v.width));
              }
            }
            const double expected =
                sum / (v.height * v.width) * (u > 0 ? 2 : 1) * (f > 0 ? 2 : 1);
            // bfloat16 keeps 8 significant bits: 2^-9 relative, plus the float sums' rounding.
            ASSERT_NEAR(stored[j], expected, std::ldexp(std::abs(expected), -8) + 1e-5)
                << "plane " << p << " u " << u << " v " << f << " c " << c;
          }
        }
      }
    }
  }
}

// A plane made of kept frequencies only is (up to the coefficients' bfloat16 rounding) its own
// LFC: the residual is tiny and the decode far better than quant2's. Ramps, which a periodic
// transform misses, are smooth here.
TEST(DivisionDctTest, LowFrequencyPlanesAreCapturedByTheLfc) {
  const std::vector<int64_t> shape = {2, 3, 24, 20};
  std::vector<float> x(Numel(shape));
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = i % 20, h = (i / 20) % 24, p = i / 480;
    x[i] = static_cast<float>(0.5 + 0.1 * p + std::cos(M_PI * (2 * h + 1) * 2 / 48) +
                              0.7 * std::cos(M_PI * (2 * w + 1) * 3 / 40) *
                                  std::cos(M_PI * (2 * h + 1) / 48));
  }
  CodecParams params = Spec("division_dct");
  params.keep = 4;
  const double dct_error = RelativeRms(x, DecodeFloats(*EncodeFloats(x, shape, params), shape));
  const double quant_error =
      RelativeRms(x, DecodeFloats(*EncodeFloats(x, shape, Spec("quant2")), shape));
  EXPECT_LT(dct_error, 3e-3) << dct_error;
  EXPECT_LT(dct_error, quant_error / 50) << dct_error << " vs " << quant_error;
  // With keep 1 (the plane's mean) the cosines are left to the residual.
  params.keep = 1;
  EXPECT_GT(RelativeRms(x, DecodeFloats(*EncodeFloats(x, shape, params), shape)), 10 * dct_error);
}

// An axis too long for a shared cosine table (H x kept frequencies > 2^20: the rows of a long
// 2-D tensor) computes each cosine where it is needed; the smooth signal is still captured.
TEST(DivisionDctTest, LongAxesWithoutACosineTableCaptureLowFrequencies) {
  const int64_t rows = 300000;
  const std::vector<int64_t> shape = {rows, 2};  // view [1, 300000, 1, 2]: 4 x 300000 cosines
  std::vector<float> x(Numel(shape));
  for (int64_t h = 0; h < rows; ++h) {
    for (int64_t c = 0; c < 2; ++c) {
      x[h * 2 + c] = static_cast<float>(1.0 + c + std::cos(M_PI * (2 * h + 1) * (1 + 2 * c) /
                                                        (2.0 * rows)));
    }
  }
  CodecParams params = Spec("division_dct");
  params.keep = 4;
  const double dct_error = RelativeRms(x, DecodeFloats(*EncodeFloats(x, shape, params), shape));
  params.keep = 1;
  const double mean_error = RelativeRms(x, DecodeFloats(*EncodeFloats(x, shape, params), shape));
  EXPECT_LT(dct_error, 3e-3) << dct_error;
  EXPECT_LT(dct_error, mean_error / 20) << dct_error << " vs " << mean_error;
}

TEST(DivisionDctTest, ErrorWithinOneStepAndUnbiased) {
  const std::vector<int64_t> shape = {1, 2, 13, 17};
  const std::vector<float> x = SmoothImages(shape, 0.3f, 6);
  const int draws = 600;
  std::vector<double> mean(x.size(), 0.0);
  double worst = 0, step = 0;
  for (int seed = 0; seed < draws; ++seed) {
    const std::vector<uint8_t> buffer = *EncodeFloats(x, shape, Spec("division_dct", seed));
    const std::vector<float> y = DecodeFloats(buffer, shape);
    const std::vector<uint32_t> words = Words(buffer);
    Layout l = division_math::MakeResidualLayout(shape.data(), 4, 2, kDivisionDefaultGroup, seed);
    l.lfc_words = 1;  // keep 1: each of the 2 planes' mean, one word
    for (uint64_t g = 0; g < l.groups; ++g) {
      step = std::max<double>(step, quant_math::UnpackGroupParams(words[division_math::ParamWord(l, g)]).step);
    }
    for (size_t i = 0; i < x.size(); ++i) {
      mean[i] += y[i];
      worst = std::max<double>(worst, std::abs(y[i] - x[i]));
    }
  }
  EXPECT_LE(worst, step * (1 + 1e-5) + 1e-6);
  double worst_bias = 0;
  for (size_t i = 0; i < x.size(); ++i) worst_bias = std::max(worst_bias, std::abs(mean[i] / draws - x[i]));
  EXPECT_LT(worst_bias, 5.0 * step / 2 / std::sqrt(draws) * 1.2);
}

// An odd number of coefficients leaves the last LFC word's high half zero, and planes that
// share a word (one coefficient each) are written by different chunks without a race.
TEST(DivisionDctTest, OddCoefficientCountsShareWords) {
  const std::vector<int64_t> shape = {3, 1, 2, 2};  // 3 planes, one coefficient each
  const std::vector<float> x = Gaussian(Numel(shape), 4);
  const std::vector<uint8_t> buffer = *EncodeFloats(x, shape, Spec("division_dct"));
  const std::vector<uint32_t> words = Words(buffer);
  EXPECT_EQ(words[1] >> 16, 0u);
  for (int p = 0; p < 3; ++p) {
    const float mean = (x[4 * p] + x[4 * p + 1] + x[4 * p + 2] + x[4 * p + 3]) / 4;
    EXPECT_NEAR(StoredCoefficients(buffer, 3)[p], mean, std::ldexp(std::abs(mean), -8) + 1e-6);
  }
  // Planes of 64 Ki values are a parallel chunk each: neighbours write the two halves of one
  // word from different threads (the tsan build checks that they are separate stores).
  const std::vector<int64_t> big = {8, 1, 256, 256};
  const std::vector<float> y = Gaussian(Numel(big), 5, 0.5f, 1.0f);
  const std::vector<float> stored = StoredCoefficients(*EncodeFloats(y, big, Spec("division_dct")), 8);
  for (int p = 0; p < 8; ++p) {
    double mean = 0;
    for (int i = 0; i < 65536; ++i) mean += y[p * 65536 + i];
    mean /= 65536;
    EXPECT_NEAR(stored[p], mean, std::ldexp(std::abs(mean), -8) + 1e-4) << "plane " << p;
  }
}

}  // namespace
}  // namespace actpack::codecs

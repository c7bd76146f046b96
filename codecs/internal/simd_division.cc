// The vector kernels of `division`'s pooled low-frequency component (declared in simd.h): the
// window means of a band of rows and the upsampled approximations. Each window sums its values
// in division_math::WindowMean's order (rows, then columns, left to right, from +0); the vectors
// run across windows (or across the C values of a [P, H, 1, C] view), never along one window's
// sum, so every lane adds exactly what the reference adds, in its order.
//
// As simd_eb.cc, vectors of at most 8 lanes on every target.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "codecs/internal/simd.h"

#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codecs/internal/simd_division.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// Must follow highway.h: it is compiled per target too.
#include "codecs/internal/simd-inl.h"

#include "codecs/internal/division_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"

HWY_BEFORE_NAMESPACE();
namespace actpack::codecs::simd {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_SCALAR
// The scalar target never runs these (the codecs take the reference when not vectorized).
void DivisionPoolBandVector(int, const void*, const division_math::Layout&, uint64_t, float*,
                            uint16_t*, uint64_t*) {
  std::abort();
}
void DivisionApproximationsVector(const uint16_t*, const division_math::Layout&, uint64_t,
                                  uint64_t, uint64_t, float*) {
  std::abort();
}
#else

using PF = hn::CappedTag<float, 8>;
using PU = hn::RebindToUnsigned<PF>;
using VF = hn::Vec<PF>;

// Transposes 8 vectors of 8 floats: on return v[k] lane j is what v[j] lane k was.
HWY_INLINE void Transpose8x8(VF* v) {
  const PF df;
  const hn::Repartition<uint64_t, PF> d64;
  VF t[8];
  for (int i = 0; i < 8; i += 2) {  // pairs of rows, per 128-bit block
    t[i] = hn::InterleaveLower(df, v[i], v[i + 1]);      // a0 b0 a1 b1 | a4 b4 a5 b5
    t[i + 1] = hn::InterleaveUpper(df, v[i], v[i + 1]);  // a2 b2 a3 b3 | a6 b6 a7 b7
  }
  VF u[8];
  for (int i = 0; i < 8; i += 4) {  // quads of rows
    const auto lo0 = hn::BitCast(d64, t[i]), lo1 = hn::BitCast(d64, t[i + 2]);
    const auto hi0 = hn::BitCast(d64, t[i + 1]), hi1 = hn::BitCast(d64, t[i + 3]);
    u[i] = hn::BitCast(df, hn::InterleaveLower(d64, lo0, lo1));      // column 0 | 4
    u[i + 1] = hn::BitCast(df, hn::InterleaveUpper(d64, lo0, lo1));  // column 1 | 5
    u[i + 2] = hn::BitCast(df, hn::InterleaveLower(d64, hi0, hi1));  // column 2 | 6
    u[i + 3] = hn::BitCast(df, hn::InterleaveUpper(d64, hi0, hi1));  // column 3 | 7
  }
  for (int k = 0; k < 4; ++k) {  // rows 0..3 of a column in the lower block, 4..7 in the upper
    v[k] = hn::ConcatLowerLower(df, u[4 + k], u[k]);
    v[k + 4] = hn::ConcatUpperUpper(df, u[4 + k], u[k]);
  }
}

// acc[wb] += the values of window wb (width b, left to right) for the `windows` whole windows
// of a row x, as the reference's loops do. Lanes run across 8 windows at a time.
void AccumulateWindows(const float* x, uint64_t windows, uint32_t b, float* acc) {
  const PF df;
  const PU du;
  uint64_t wb = 0;
  for (; wb + 8 <= windows; wb += 8) {
    const float* w = x + wb * b;
    VF sum = hn::LoadU(df, acc + wb);
    if (b == 2) {
      VF v0, v1;
      hn::LoadInterleaved2(df, w, v0, v1);
      sum = hn::Add(hn::Add(sum, v0), v1);
    } else if (b == 3) {
      VF v0, v1, v2;
      hn::LoadInterleaved3(df, w, v0, v1, v2);
      sum = hn::Add(hn::Add(hn::Add(sum, v0), v1), v2);
    } else if (b == 4) {
      VF v0, v1, v2, v3;
      hn::LoadInterleaved4(df, w, v0, v1, v2, v3);
      sum = hn::Add(hn::Add(hn::Add(hn::Add(sum, v0), v1), v2), v3);
    } else if (b % 8 == 0) {
      for (uint32_t g = 0; g < b; g += 8) {
        VF v[8];
        for (int j = 0; j < 8; ++j) v[j] = hn::LoadU(df, w + j * b + g);
        Transpose8x8(v);
        for (int k = 0; k < 8; ++k) sum = hn::Add(sum, v[k]);
      }
    } else {
      const auto index = hn::BitCast(hn::RebindToSigned<PF>(),
                                     hn::Mul(hn::Iota(du, 0), hn::Set(du, b)));
      for (uint32_t k = 0; k < b; ++k) sum = hn::Add(sum, hn::GatherIndex(df, w + k, index));
    }
    hn::StoreU(sum, df, acc + wb);
  }
  for (; wb < windows; ++wb) {
    for (uint32_t k = 0; k < b; ++k) acc[wb] = portable::Add(acc[wb], x[wb * b + k]);
  }
}

// Means [first, last) of a band's row of means: acc / count, rounded to bfloat16; counts the
// ones that are not finite (division_math::StoredMean).
void StoreMeans(const float* acc, uint64_t first, uint64_t last, float count, uint16_t* out,
                uint64_t* nonfinite) {
  const PF df;
  const PU du;
  const hn::Rebind<uint16_t, PF> d16;
  const hn::Vec<PU> exponent = hn::Set(du, 0x7f80u);
  const VF divisor = hn::Set(df, count);
  uint64_t m = first;
  uint64_t bad = 0;
  for (; m + 8 <= last; m += 8) {
    const hn::Vec<PU> h = FloatToBf16(du, hn::BitCast(du, hn::Div(hn::LoadU(df, acc + m), divisor)));
    bad += hn::CountTrue(du, hn::Eq(hn::And(h, exponent), exponent));
    hn::StoreU(hn::TruncateTo(d16, h), d16, out + m);
  }
  for (; m < last; ++m) out[m] = division_math::StoredMean(portable::Div(acc[m], count), &bad);
  *nonfinite += bad;
}

template <int K>
void PoolBand(const void* input, const division_math::Layout& l, uint64_t band, float* scratch,
              uint16_t* means, uint64_t* nonfinite) {
  const PF df;
  const uint64_t p = band / l.blocks_h;
  const uint64_t h0 = (band % l.blocks_h) * l.block_h;
  const uint64_t h1 = std::min<uint64_t>(h0 + l.block_h, l.height);
  const uint64_t row_means = l.blocks_w * l.inner;
  float* acc = scratch;
  float* row_values = scratch + row_means + 8;  // a row as float32 (16-bit inputs)
  std::fill(acc, acc + row_means, 0.0f);
  for (uint64_t h = h0; h < h1; ++h) {
    const uint64_t row = (p * l.height + h) * l.width * l.inner;
    if (l.inner == 1) {
      const float* x = static_cast<const float*>(input) + row;
      if constexpr (K != elements::kF32) {
        uint64_t w = 0;
        for (; w + 8 <= l.width; w += 8) hn::StoreU(LoadElements<K>(df, input, row + w), df, row_values + w);
        for (; w < l.width; ++w) row_values[w] = elements::Load<K>(input, row + w);
        x = row_values;
      }
      // Whole windows, then the partial window at the right edge.
      const uint64_t full = l.width / l.block_w;
      AccumulateWindows(x, full, l.block_w, acc);
      for (uint64_t w = full * l.block_w; w < l.width; ++w) {
        acc[full] = portable::Add(acc[full], x[w]);
      }
    } else {
      for (uint64_t w = 0; w < l.width; ++w) {
        float* dst = acc + (w / l.block_w) * l.inner;
        const uint64_t src = row + w * l.inner;
        uint64_t c = 0;
        for (; c + 8 <= l.inner; c += 8) {
          hn::StoreU(hn::Add(hn::LoadU(df, dst + c), LoadElements<K>(df, input, src + c)), df, dst + c);
        }
        for (; c < l.inner; ++c) dst[c] = portable::Add(dst[c], elements::Load<K>(input, src + c));
      }
    }
  }
  // Every window but the last of the row is block_w wide.
  uint16_t* out = means + band * row_means;
  const uint64_t rows = h1 - h0;
  const uint64_t last_w0 = (l.blocks_w - 1) * l.block_w;
  StoreMeans(acc, 0, last_w0 / l.block_w * l.inner, static_cast<float>(rows * l.block_w), out,
             nonfinite);
  StoreMeans(acc, last_w0 / l.block_w * l.inner, row_means,
             static_cast<float>(rows * (l.width - last_w0)), out, nonfinite);
}

void DivisionPoolBandVector(int kind, const void* input, const division_math::Layout& l,
                            uint64_t band, float* scratch, uint16_t* means, uint64_t* nonfinite) {
  return WithKind(kind, [&](auto k) {
    PoolBand<decltype(k)::value>(input, l, band, scratch, means, nonfinite);
  });
}

// division.cc's PoolApproximations: the upsampled LFC of n values of plane p from value j0.
// Whole vectors are stored: a run's lanes past its end are overwritten by the next run (approx
// has room for a vector past n).
void DivisionApproximationsVector(const uint16_t* means, const division_math::Layout& l,
                                  uint64_t p, uint64_t j0, uint64_t n, float* approx) {
  const PF df;
  const PU du;
  const hn::Rebind<uint16_t, PF> d16;
  division_math::MeanCursor at(means, l, p, j0);
  for (uint64_t i = 0; i < n;) {
    const uint64_t run = at.Run(n - i);
    const uint16_t* m = at.Means();
    if (l.inner == 1) {
      const VF value = hn::Set(df, portable::Bf16ToFloat(m[0]));
      for (uint64_t k = 0; k < run; k += 8) hn::StoreU(value, df, approx + i + k);
    } else {
      uint64_t k = 0;
      for (; k + 8 <= run; k += 8) {
        hn::StoreU(FromHalfBits<elements::kBF16>(du, hn::PromoteTo(du, hn::LoadU(d16, m + k))),
                   df, approx + i + k);
      }
      for (; k < run; ++k) approx[i + k] = portable::Bf16ToFloat(m[k]);
    }
    i += run;
    at.Advance(run);
  }
}

#endif  // HWY_TARGET == HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace actpack::codecs::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace actpack::codecs::simd {

HWY_EXPORT(DivisionPoolBandVector);
HWY_EXPORT(DivisionApproximationsVector);

void DivisionPoolBand(int kind, const void* input, const division_math::Layout& l, uint64_t band,
                      float* scratch, uint16_t* means, uint64_t* nonfinite) {
  HWY_DYNAMIC_DISPATCH(DivisionPoolBandVector)(kind, input, l, band, scratch, means, nonfinite);
}

void DivisionApproximations(const uint16_t* means, const division_math::Layout& l, uint64_t p,
                            uint64_t j0, uint64_t n, float* approx) {
  HWY_DYNAMIC_DISPATCH(DivisionApproximationsVector)(means, l, p, j0, n, approx);
}

}  // namespace actpack::codecs::simd
#endif  // HWY_ONCE

// The layout and arithmetic of the DIVISION codecs (`division`, `division_dct`), shared by the
// CPU reference (division.cc) and the CUDA kernels (cuda/division_kernels.cu) so that both
// write the same bytes. codecs/FORMAT.md is the specification; this header is its code.
//
// A tensor is viewed as [planes, H, W, C] (row-major, a reshape of the contiguous tensor):
//   ndim >= 4: [prod(leading dims), H, W, 1]   (NCHW: one plane per sample and channel)
//   ndim 2, 3: [prod(leading dims), T, 1, D]   (the low-pass runs along dim -2: tokens)
//   ndim 1:    [1, 1, n, 1]                    ndim 0: [1, 1, 1, 1]
// The low-frequency component (LFC) is computed over (H, W) for every (plane, c); the
// high-frequency residual is quantized per group of at most `group` values of a plane (the
// plane's H*W*C values cut into near-equal chunks whose length is a multiple of 32, so every
// group starts at a code-word boundary).
//
// This header is included by nvcc: it must not include Abseil.
#ifndef ACTPACK_CODECS_INTERNAL_DIVISION_MATH_H_
#define ACTPACK_CODECS_INTERNAL_DIVISION_MATH_H_

#include <cstdint>

#include "codecs/internal/dct_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"

namespace actpack::codecs::division_math {

struct Layout {
  // The view.
  uint64_t planes, height, width, inner;  // P, H, W, C
  uint64_t plane;                         // H * W * C
  // `division`: the B x B pooling window (clipped to H and W) and the means it yields.
  uint32_t block_h, block_w;
  uint64_t blocks_h, blocks_w;  // ceil(H / block_h), ceil(W / block_w)
  uint64_t means;               // planes * blocks_h * blocks_w * C
  // `division_dct`: the kept frequencies along H (rows) and W (columns); 0 in `division`.
  uint64_t kept_rows, kept_columns;
  // The residual quantizer.
  uint32_t bits;
  uint64_t seed;
  uint64_t group_length;  // values per (min, step) word, a multiple of 32
  uint64_t groups_per_plane;
  uint64_t groups;       // planes * groups_per_plane
  uint64_t plane_words;  // code words per plane: ceil(plane * bits / 32)
  // Payload sections, in 32-bit words: [LFC][group parameters][codes].
  uint64_t lfc_words;
  ACTPACK_HD_METHOD uint64_t payload_words() const { return lfc_words + groups + planes * plane_words; }
};

ACTPACK_HD uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0 ? 1 : 0); }
ACTPACK_HD uint64_t MinU(uint64_t a, uint64_t b) { return a < b ? a : b; }

// The view and the residual quantizer's groups of a tensor of this shape. The LFC fields are
// left zero; MakePoolLayout and MakeDctLayout fill them in. A tensor with no elements has
// no planes, groups or words.
ACTPACK_HD Layout MakeResidualLayout(const int64_t* shape, int ndim, uint32_t bits,
                                     uint32_t group, uint64_t seed) {
  Layout l{};
  l.bits = bits;
  l.seed = seed;
  uint64_t numel = 1;
  for (int i = 0; i < ndim; ++i) numel *= static_cast<uint64_t>(shape[i]);
  if (numel == 0) return l;
  uint64_t leading = 1;
  for (int i = 0; i + 2 < ndim; ++i) leading *= static_cast<uint64_t>(shape[i]);
  l.planes = leading;
  if (ndim >= 4) {
    l.height = static_cast<uint64_t>(shape[ndim - 2]);
    l.width = static_cast<uint64_t>(shape[ndim - 1]);
    l.inner = 1;
  } else if (ndim >= 2) {
    l.height = static_cast<uint64_t>(shape[ndim - 2]);
    l.width = 1;
    l.inner = static_cast<uint64_t>(shape[ndim - 1]);
  } else {
    l.height = 1;
    l.width = ndim == 1 ? static_cast<uint64_t>(shape[0]) : 1;
    l.inner = 1;
  }
  l.plane = l.height * l.width * l.inner;
  // Near-equal chunks of at most `group` values, rounded up to whole code words.
  const uint64_t chunks = CeilDiv(l.plane, group);
  l.group_length = CeilDiv(CeilDiv(l.plane, chunks), 32) * 32;
  l.groups_per_plane = CeilDiv(l.plane, l.group_length);
  l.groups = l.planes * l.groups_per_plane;
  l.plane_words = CeilDiv(l.plane, 32 / bits);
  return l;
}

// `division`: adds the B x B average-pooling LFC (bfloat16 means, two per word, low half
// first) to a residual layout.
ACTPACK_HD Layout MakePoolLayout(Layout l, uint32_t block) {
  if (l.planes == 0) return l;
  l.block_h = static_cast<uint32_t>(MinU(block, l.height));
  l.block_w = static_cast<uint32_t>(MinU(block, l.width));
  l.blocks_h = CeilDiv(l.height, l.block_h);
  l.blocks_w = CeilDiv(l.width, l.block_w);
  l.means = l.planes * l.blocks_h * l.blocks_w * l.inner;
  l.lfc_words = CeilDiv(l.means, 2);
  return l;
}

// `division_dct`: adds the cosine-transform LFC under `keep` (dct_math.h): a bfloat16 per kept
// coefficient, [planes, kept_rows, kept_columns, C], two per word, low half first.
ACTPACK_HD Layout MakeDctLayout(Layout l, uint32_t keep) {
  if (l.planes == 0) return l;
  l.kept_rows = dct_math::KeptAlong(l.height, keep);
  l.kept_columns = dct_math::KeptAlong(l.width, keep);
  l.lfc_words = CeilDiv(l.planes * l.kept_rows * l.kept_columns * l.inner, 2);
  return l;
}

// Index of coefficient (u, v) of channel c of plane p in the DCT's LFC.
ACTPACK_HD uint64_t CoefficientIndex(const Layout& l, uint64_t p, uint64_t u, uint64_t v,
                                     uint64_t c) {
  return ((p * l.kept_rows + u) * l.kept_columns + v) * l.inner + c;
}

// ---- `division`: the pooled LFC ----

// Window `m` of the LFC ([planes, blocks_h, blocks_w, C], row-major): the index of its first
// (top-left) value and its rows and columns (fewer at the bottom and right edges).
struct Window {
  uint64_t first, rows, cols;
};
ACTPACK_HD Window WindowOf(const Layout& l, uint64_t m) {
  const uint64_t c = m % l.inner;
  uint64_t t = m / l.inner;
  const uint64_t wb = t % l.blocks_w;
  t /= l.blocks_w;
  const uint64_t hb = t % l.blocks_h;
  const uint64_t p = t / l.blocks_h;
  const uint64_t h0 = hb * l.block_h, h1 = MinU(h0 + l.block_h, l.height);
  const uint64_t w0 = wb * l.block_w, w1 = MinU(w0 + l.block_w, l.width);
  return Window{((p * l.height + h0) * l.width + w0) * l.inner + c, h1 - h0, w1 - w0};
}

// Mean `m` of the LFC: the window's values summed left to right in row-major order (h, then w)
// in float, divided by their count, both correctly rounded.
template <int K>
ACTPACK_HD float WindowMean(const void* input, const Layout& l, uint64_t m) {
  const Window win = WindowOf(l, m);
  float sum = 0.0f;
  for (uint64_t h = 0; h < win.rows; ++h) {
    const uint64_t row = win.first + h * l.width * l.inner;
    ACTPACK_UNROLL_4  // half a row of the default window a trip
    for (uint64_t w = 0; w < win.cols; ++w) {
      sum = portable::Add(sum, elements::Load<K>(input, row + w * l.inner));
    }
  }
  return portable::Div(sum, static_cast<float>(win.rows * win.cols));
}

// A mean rounded to its stored bfloat16; counts a non-finite result (a non-finite input or an
// overflowing window sum: the encoder refuses such a tensor).
ACTPACK_HD uint16_t StoredMean(float mean, uint64_t* nonfinite) {
  const uint16_t h = portable::FloatToBf16(mean);
  if ((h & 0x7f80u) == 0x7f80u) ++*nonfinite;
  return h;
}

// The non-finite means of an LFC payload word (both halves; 0 past the end is finite): what
// StoredMean counted when it wrote them.
ACTPACK_HD uint32_t NonFiniteMeans(uint32_t word) {
  return ((word & 0x7f80u) == 0x7f80u) + ((word >> 16 & 0x7f80u) == 0x7f80u);
}

// LFC payload word `w`: means 2w (low half) and 2w + 1 (high half, zero past the end), each
// mean_of(m) stored (StoredMean).
template <typename MeanOf>
ACTPACK_HD uint32_t LfcWordOf(const Layout& l, uint64_t w, uint64_t* nonfinite, MeanOf mean_of) {
  uint32_t word = 0;
  for (uint64_t half = 0; half < 2; ++half) {
    const uint64_t m = 2 * w + half;
    if (m >= l.means) break;
    word |= static_cast<uint32_t>(StoredMean(mean_of(m), nonfinite)) << (16 * half);
  }
  return word;
}

template <int K>
ACTPACK_HD uint32_t LfcWord(const void* input, const Layout& l, uint64_t w, uint64_t* nonfinite) {
  return LfcWordOf(l, w, nonfinite, [&](uint64_t m) { return WindowMean<K>(input, l, m); });
}

// The LFC mean (index into the bfloat16 means) that element `j` of plane `p` upsamples from;
// *starts (where given) says whether the element is its window's first (top-left) value.
ACTPACK_HD uint64_t MeanOf(const Layout& l, uint64_t p, uint64_t j, bool* starts = nullptr) {
  uint64_t c, hb, wb, h, w;
  if (l.plane <= 0xffffffffu) {
    // Planes below 2^32 values, in 32-bit arithmetic: a GPU divides 32-bit integers several
    // times faster (its kernels take MeanOfNarrow in tensors below 2^32 values, this above).
    const uint32_t j32 = static_cast<uint32_t>(j), inner = static_cast<uint32_t>(l.inner);
    const uint32_t width = static_cast<uint32_t>(l.width), t = j32 / inner;
    c = j32 - t * inner;
    const uint32_t h32 = t / width;
    h = h32;
    w = t - h32 * width;
    hb = h32 / l.block_h;
    wb = static_cast<uint32_t>(w) / l.block_w;
  } else {
    c = j % l.inner;
    const uint64_t t = j / l.inner;
    h = t / l.width;
    w = t % l.width;
    hb = h / l.block_h;
    wb = w / l.block_w;
  }
  if (starts != nullptr) *starts = h == hb * l.block_h && w == wb * l.block_w;
  return ((p * l.blocks_h + hb) * l.blocks_w + wb) * l.inner + c;
}

// MeanOf's 32-bit case for a kernel that takes many values of one layout: its divisions by the
// layout's sizes as portable::Divisor32 multiplications, made once per launch. They hold in
// tensors of at most 2^32 - 1 values (`narrow`, Narrow), where also a value's plane is found by
// one; a kernel given a wider layout divides by the sizes themselves.
struct MeanDivisors {
  portable::Divisor32 inner, width, block_h, block_w, group_length, plane, groups_per_plane;
  bool narrow;
};

ACTPACK_HD bool Narrow(const Layout& l) { return l.planes * l.plane <= 0xffffffffu; }

ACTPACK_HD MeanDivisors MakeMeanDivisors(const Layout& l) {
  // A size past 32 bits divides every value of a narrow tensor to 0, as 0xffffffff does.
  auto make = [](uint64_t d) {
    return portable::MakeDivisor32(static_cast<uint32_t>(MinU(d == 0 ? 1 : d, 0xffffffffu)));
  };
  return MeanDivisors{make(l.inner),   make(l.width),        make(l.block_h),
                      make(l.block_w), make(l.group_length), make(l.plane),
                      make(l.groups_per_plane), Narrow(l)};
}

// MeanOf(l, p, j, starts) for a Narrow layout.
ACTPACK_HD uint64_t MeanOfNarrow(const Layout& l, const MeanDivisors& d, uint64_t p, uint32_t j,
                                 bool* starts = nullptr) {
  const uint32_t t = portable::Divide(j, d.inner);
  const uint32_t c = j - t * static_cast<uint32_t>(l.inner);
  const uint32_t h = portable::Divide(t, d.width);
  const uint32_t w = t - h * static_cast<uint32_t>(l.width);
  const uint32_t hb = portable::Divide(h, d.block_h);
  const uint32_t wb = portable::Divide(w, d.block_w);
  if (starts != nullptr) *starts = h == hb * l.block_h && w == wb * l.block_w;
  // In 32 bits: the index is below l.means, which is at most the tensor's values.
  const uint32_t row = static_cast<uint32_t>(p) * static_cast<uint32_t>(l.blocks_h) + hb;
  return (row * static_cast<uint32_t>(l.blocks_w) + wb) * static_cast<uint32_t>(l.inner) + c;
}

// MeanOfNarrow for a layout of rows (no inner channels: l.inner == 1), without the channel's
// division.
ACTPACK_HD uint64_t MeanOfRowsNarrow(const Layout& l, const MeanDivisors& d, uint64_t p, uint32_t j) {
  const uint32_t h = portable::Divide(j, d.width);
  const uint32_t w = j - h * static_cast<uint32_t>(l.width);
  const uint32_t hb = portable::Divide(h, d.block_h);
  const uint32_t wb = portable::Divide(w, d.block_w);
  const uint32_t row = static_cast<uint32_t>(p) * static_cast<uint32_t>(l.blocks_h) + hb;
  return row * static_cast<uint32_t>(l.blocks_w) + wb;
}

// The mean values of a plane upsample from, walked in runs from value j0 of plane p: with
// C == 1 a run is the rest of a window's columns in one row (they share a mean), with C > 1 the
// rest of a position's C values (they read consecutive means). Counters, not divisions, move it
// on: a division per value would cost more than the rest of decoding. Host code (the CPU's
// upsampling, reference and vector kernel alike); a GPU thread computes MeanOfNarrow (MeanOf
// in tensors of 2^32 values or more) instead.
struct MeanCursor {
  MeanCursor(const uint16_t* means, const Layout& l, uint64_t p, uint64_t j0) : l_(l) {
    c_ = j0 % l.inner;
    w_ = (j0 / l.inner) % l.width;
    const uint64_t h = j0 / (l.inner * l.width);
    h_in_block_ = h % l.block_h;
    wb_ = w_ / l.block_w;
    w_in_block_ = w_ % l.block_w;
    row_ = means + (p * l.blocks_h + h / l.block_h) * l.blocks_w * l.inner;
  }

  // The values of the run from here, at most n, and their first mean.
  uint64_t Run(uint64_t n) const {
    const uint64_t run = l_.inner == 1 ? MinU(l_.block_w - w_in_block_, l_.width - w_) : l_.inner - c_;
    return MinU(run, n);
  }
  const uint16_t* Means() const { return row_ + wb_ * l_.inner + c_; }

  // Moves `run` values on (no further than Run allows).
  void Advance(uint64_t run) {
    if (l_.inner == 1) return AdvanceColumns(run);
    c_ += run;
    if (c_ == l_.inner) {
      c_ = 0;
      AdvanceColumns(1);
    }
  }

 private:
  void AdvanceColumns(uint64_t columns) {
    w_ += columns;
    w_in_block_ += columns;
    if (w_in_block_ == l_.block_w) {
      w_in_block_ = 0;
      ++wb_;
    }
    if (w_ == l_.width) {
      w_ = 0;
      wb_ = 0;
      w_in_block_ = 0;
      if (++h_in_block_ == l_.block_h) {
        h_in_block_ = 0;
        row_ += l_.blocks_w * l_.inner;
      }
    }
  }

  const Layout& l_;
  uint64_t c_, w_, wb_, w_in_block_, h_in_block_;
  const uint16_t* row_;
};

// ---- the residual quantizer (both codecs) ----

// The residual of a value against its LFC approximation; its code with uniform draw u. A
// non-finite residual (an input near the float limits) never reaches a tensor that encodes:
// the group's range overflows and the encoder refuses the tensor.
ACTPACK_HD float Residual(float x, float approximation) { return portable::Sub(x, approximation); }

// Group `q` of a plane covers its values [q * group_length, + GroupSize).
ACTPACK_HD uint64_t GroupSize(const Layout& l, uint64_t q) {
  return MinU(l.group_length, l.plane - q * l.group_length);
}

// Word offsets of group g's parameter word and of plane p's first code word.
ACTPACK_HD uint64_t ParamWord(const Layout& l, uint64_t g) { return l.lfc_words + g; }
ACTPACK_HD uint64_t PlaneCodeWord(const Layout& l, uint64_t p) {
  return l.lfc_words + l.groups + p * l.plane_words;
}

// The decoded value: the approximation plus the dequantized residual.
ACTPACK_HD float Reconstruct(float approximation, uint32_t code, const quant_math::GroupParams& p) {
  return portable::Add(approximation, quant_math::Dequantize(code, p));
}

}  // namespace actpack::codecs::division_math

#endif  // ACTPACK_CODECS_INTERNAL_DIVISION_MATH_H_

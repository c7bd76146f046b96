// The small discrete Fourier transforms of `division_fft`: the lowest frequencies of each
// (plane, c) of the [planes, H, W, C] view (division_math.h) and the real signal they
// reconstruct. The format defines the coefficients as computed here, operation by operation,
// so every build (and a future GPU port) writes the same bytes: twiddles come from a fixed
// polynomial instead of the C library's cos/sin, sums run in a fixed order, and every float
// operation is portable.h's (correctly rounded, never contracted).
//
// Kept frequencies: rows u in (-k, k) (mod H; all H rows when 2k - 1 >= H), stored in the order
// 0, 1, .., k-1, H-k+1, .., H-1; columns v in [0, min(k, W/2 + 1)). Coefficients are normalised
// by 1/(H*W) (the DC term is the plane's mean), which keeps them in float16 range for inputs
// that are. The approximation is the real inverse (irfft2 semantics: interior columns count
// twice for their conjugate mirror).
//
// This header is included by nvcc: it must not include Abseil.
#ifndef ACTPACK_CODECS_INTERNAL_DFT_MATH_H_
#define ACTPACK_CODECS_INTERNAL_DFT_MATH_H_

#include <cstdint>

#include "codecs/internal/portable.h"

namespace actpack::codecs::dft_math {

struct CosSin {
  float cos;
  float sin;
};

// cos and sin of 2*pi*m/n (n >= 1), within about 1e-7: reduced to an angle in [0, pi/4] by
// exact integer arithmetic, then Taylor polynomials (truncation error < 2e-9 there).
ACTPACK_HD CosSin TurnCosSin(uint64_t m, uint64_t n) {
  m %= n;
  const uint64_t quadrant = (4 * m) / n;      // 4m < 2^64: n <= 2^62 (a tensor dimension)
  const uint64_t rest = 4 * m - quadrant * n;  // the angle within the quadrant, in n-ths of pi/2
  const bool upper = 2 * rest > n;             // past pi/4: use the complement
  const uint64_t r = upper ? n - rest : rest;
  const float x = portable::Mul(1.57079632679489662f,
                                portable::Div(static_cast<float>(r), static_cast<float>(n)));
  const float x2 = portable::Mul(x, x);
  float s = portable::Add(-1.0f / 5040.0f, portable::Mul(x2, 1.0f / 362880.0f));
  s = portable::Add(1.0f / 120.0f, portable::Mul(x2, s));
  s = portable::Add(-1.0f / 6.0f, portable::Mul(x2, s));
  s = portable::Add(1.0f, portable::Mul(x2, s));
  s = portable::Mul(x, s);
  float c = portable::Add(1.0f / 40320.0f, portable::Mul(x2, -1.0f / 3628800.0f));
  c = portable::Add(-1.0f / 720.0f, portable::Mul(x2, c));
  c = portable::Add(1.0f / 24.0f, portable::Mul(x2, c));
  c = portable::Add(-0.5f, portable::Mul(x2, c));
  c = portable::Add(1.0f, portable::Mul(x2, c));
  const float cos_phi = upper ? s : c;
  const float sin_phi = upper ? c : s;
  switch (quadrant) {
    case 0: return {cos_phi, sin_phi};
    case 1: return {-sin_phi, cos_phi};
    case 2: return {-cos_phi, -sin_phi};
    default: return {sin_phi, -cos_phi};
  }
}

// Stored rows and columns of a plane of H x W under `keep` = k.
ACTPACK_HD uint64_t KeptRows(uint64_t height, uint32_t keep) {
  const uint64_t rows = 2 * uint64_t{keep} - 1;
  return rows < height ? rows : height;
}
ACTPACK_HD uint64_t KeptColumns(uint64_t width, uint32_t keep) {
  const uint64_t columns = width / 2 + 1;
  return keep < columns ? keep : columns;
}

// The frequency u of stored row r.
ACTPACK_HD uint64_t RowFrequency(uint64_t r, uint64_t height, uint32_t keep) {
  if (2 * uint64_t{keep} - 1 >= height || r < keep) return r;
  return height - (2 * uint64_t{keep} - 1 - r);
}

// How often column v counts in the real inverse: once for v = 0 and for the Nyquist column of
// an even width (they are their own mirror), twice otherwise.
ACTPACK_HD bool ColumnCountsTwice(uint64_t v, uint64_t width) { return v != 0 && 2 * v != width; }

// Accumulates real x * e^{-i*theta} into (re, im), theta given by its cos and sin.
ACTPACK_HD void AddRealForward(float x, CosSin t, float* re, float* im) {
  *re = portable::Add(*re, portable::Mul(x, t.cos));
  *im = portable::Sub(*im, portable::Mul(x, t.sin));
}

// Accumulates complex x * e^{-i*theta} into (re, im).
ACTPACK_HD void AddForward(float x_re, float x_im, CosSin t, float* re, float* im) {
  // (a + ib)(c - is) = (ac + bs) + i(bc - as)
  *re = portable::Add(*re, portable::Add(portable::Mul(x_re, t.cos), portable::Mul(x_im, t.sin)));
  *im = portable::Add(*im, portable::Sub(portable::Mul(x_im, t.cos), portable::Mul(x_re, t.sin)));
}

// Accumulates x * e^{+i*theta} into (re, im).
ACTPACK_HD void AddInverse(float x_re, float x_im, CosSin t, float* re, float* im) {
  // (a + ib)(c + is) = (ac - bs) + i(as + bc)
  *re = portable::Add(*re, portable::Sub(portable::Mul(x_re, t.cos), portable::Mul(x_im, t.sin)));
  *im = portable::Add(*im, portable::Add(portable::Mul(x_re, t.sin), portable::Mul(x_im, t.cos)));
}

// The real part of x * e^{+i*theta}, doubled for a column that stands for its mirror too.
ACTPACK_HD float RealTerm(float x_re, float x_im, CosSin t, bool twice) {
  const float term = portable::Sub(portable::Mul(x_re, t.cos), portable::Mul(x_im, t.sin));
  return twice ? portable::Add(term, term) : term;
}

}  // namespace actpack::codecs::dft_math

#endif  // ACTPACK_CODECS_INTERNAL_DFT_MATH_H_

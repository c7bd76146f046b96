// The cosine transform of `division_dct`: the lowest frequencies of each (plane, c) of the
// [planes, H, W, C] view (division_math.h) and the smooth signal they reconstruct. The format
// defines the coefficients as computed here, operation by operation, so every build (and the
// GPU's decoder) gets the same bytes from the same payload: cosines come from a fixed
// polynomial instead of the C library's cos, sums run in a fixed order, and every float
// operation is portable.h's (correctly rounded, never contracted).
//
// Kept frequencies along an axis of n values: u < KeptAlong(n, keep) = min(keep, ceil(n / 4)),
// so the low part costs at most one bit per value. The coefficients are the DCT-II's scaled so
// that the inverse is a plain sum of cosines and the (0, 0) term is the plane's mean:
//   X(u, v) = a_u a_v / (H W) * sum_h sum_w x[h, w] cos(pi (2h + 1) u / 2H) cos(pi (2w + 1) v / 2W)
//   x~[h, w] = sum_u sum_v X(u, v) cos(pi (2h + 1) u / 2H) cos(pi (2w + 1) v / 2W)
// with a_0 = 1 and a_u = 2 for u > 0.
//
// This header is included by nvcc: it must not include Abseil.
#ifndef ACTPACK_CODECS_INTERNAL_DCT_MATH_H_
#define ACTPACK_CODECS_INTERNAL_DCT_MATH_H_

#include <cstdint>

#include "codecs/internal/portable.h"

namespace actpack::codecs::dct_math {

// cos(2*pi*m/n) (n >= 1), within about 1e-7: reduced to an angle in [0, pi/4] by exact integer
// arithmetic, then Taylor polynomials (truncation error < 2e-9 there).
ACTPACK_HD float TurnCos(uint64_t m, uint64_t n) {
  m %= n;
  const uint64_t quadrant = (4 * m) / n;      // 4m < 2^64: n <= 2^62 (4 x a tensor dimension)
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
    case 0: return cos_phi;
    case 1: return -sin_phi;
    case 2: return -cos_phi;
    default: return sin_phi;
  }
}

// Frequencies kept along an axis of n >= 1 values under `keep` >= 1.
ACTPACK_HD uint64_t KeptAlong(uint64_t n, uint32_t keep) {
  const uint64_t quarter = n / 4 + (n % 4 != 0 ? 1 : 0);
  return keep < quarter ? keep : quarter;
}

// a * b mod n for a, b < n <= 2^62, without overflow.
ACTPACK_HD uint64_t MulMod(uint64_t a, uint64_t b, uint64_t n) {
  if (a < (uint64_t{1} << 32) && b < (uint64_t{1} << 32)) return (a * b) % n;
  uint64_t result = 0;
  for (; b > 0; b >>= 1) {  // double and add: every intermediate < 2n <= 2^63
    if (b & 1) result = (result + a) % n;
    a = (a + a) % n;
  }
  return result;
}

// cos(pi (2m + 1) f / 2n) = cos(2 pi ((2m + 1) f mod 4n) / 4n): the basis function of
// frequency f at sample m (m, f < n).
ACTPACK_HD float Basis(uint64_t m, uint64_t f, uint64_t n) {
  const uint64_t period = 4 * n;
  return TurnCos(MulMod(2 * m + 1, f, period), period);
}

// The coefficient of frequencies (u, v) from the plane's double sum: divided by H * W, then
// scaled by a_u a_v (a power of two, so exact).
ACTPACK_HD float Coefficient(float sum, uint64_t u, uint64_t v, uint64_t height, uint64_t width) {
  const float mean = portable::Div(sum, static_cast<float>(height * width));
  const float scale = (u > 0 ? 2.0f : 1.0f) * (v > 0 ? 2.0f : 1.0f);
  return portable::Mul(mean, scale);
}

}  // namespace actpack::codecs::dct_math

#endif  // ACTPACK_CODECS_INTERNAL_DCT_MATH_H_

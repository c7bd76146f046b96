// The payload words of the `pool` codec, shared by the CPU reference (pool.cc) and the CUDA
// kernels (cuda/pool_kernels.cu) so that both write the same bytes: each mean is a left-to-right
// float sum of its window divided by the window's element count, both correctly rounded.
//
// This header is included by nvcc: it must not include Abseil.
#ifndef ACTPACK_CODECS_INTERNAL_POOL_MATH_H_
#define ACTPACK_CODECS_INTERNAL_POOL_MATH_H_

#include <cstdint>

#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::pool_math {

// The means of a [rows, row_length] tensor pooled by `window` along its rows.
struct Shape {
  uint64_t rows;
  uint64_t row_length;
  uint32_t window;
  uint64_t means_per_row;  // ceil(row_length / window)
  uint64_t means;          // rows * means_per_row
};

ACTPACK_HD Shape MakeShape(uint64_t rows, uint64_t row_length, uint32_t window) {
  const uint64_t per_row = (row_length + window - 1) / window;
  return Shape{rows, row_length, window, per_row, rows * per_row};
}

// Mean `m` (row-major over [rows, means_per_row]); the last window of a row may be partial.
template <int K>
ACTPACK_HD float WindowMean(const void* input, const Shape& s, uint64_t m) {
  const uint64_t row = m / s.means_per_row;
  const uint64_t start = (m - row * s.means_per_row) * s.window;
  const uint64_t rest = s.row_length - start;
  const uint64_t count = rest < s.window ? rest : s.window;
  const uint64_t first = row * s.row_length + start;
  float sum = 0.0f;
  for (uint64_t j = 0; j < count; ++j) {
    sum = portable::Add(sum, elements::Load<K>(input, first + j));
  }
  return portable::Div(sum, static_cast<float>(count));
}

// Means stored per 32-bit payload word: one float32, or two float16/bfloat16 (low half first).
template <int K>
ACTPACK_HD uint64_t MeansPerWord() {
  return K == elements::kF32 ? 1 : 2;
}

// A mean as a float16 or bfloat16 payload half (K); counts one not finite there in *nonfinite.
template <int K>
ACTPACK_HD uint32_t StoredHalf(float mean, uint64_t* nonfinite) {
  const uint16_t h = K == elements::kF16 ? portable::FloatToHalf(mean) : portable::FloatToBf16(mean);
  const uint16_t exponent_mask = K == elements::kF16 ? 0x7c00u : 0x7f80u;
  if ((h & exponent_mask) == exponent_mask) ++*nonfinite;
  return h;
}

// Payload word `w`; adds to *nonfinite the means that are not finite in the stored type (a
// non-finite input or a window sum that overflows: the encoder refuses such a tensor).
template <int K>
ACTPACK_HD uint32_t EncodeWord(const void* input, const Shape& s, uint64_t w,
                               uint64_t* nonfinite) {
  if constexpr (K == elements::kF32) {
    const float mean = WindowMean<K>(input, s, w);
    if (!portable::IsFinite(mean)) ++*nonfinite;
    return portable::FloatBits(mean);
  } else {
    uint32_t word = 0;
    for (uint64_t half = 0; half < 2; ++half) {
      const uint64_t m = 2 * w + half;
      if (m >= s.means) break;
      word |= StoredHalf<K>(WindowMean<K>(input, s, m), nonfinite) << (16 * half);
    }
    return word;
  }
}

}  // namespace actpack::codecs::pool_math

#endif  // ACTPACK_CODECS_INTERNAL_POOL_MATH_H_

// The payload words of the `cast` codec, shared by the CPU reference (cast.cc) and the CUDA
// kernels (cuda/cast_kernels.cu) so that both write the same bytes.
//
// This header is included by nvcc: it must not include Abseil.
#ifndef ACTPACK_CODECS_INTERNAL_CAST_MATH_H_
#define ACTPACK_CODECS_INTERNAL_CAST_MATH_H_

#include <cstdint>

#include "codecs/internal/portable.h"

namespace actpack::codecs::cast_math {

// Payload word `w`: elements 2w (low half) and 2w + 1 (high half, zero past the end) rounded to
// nearest even into float16 or bfloat16. Adds to *overflow the finite inputs that became
// infinite (the encoder refuses such a tensor).
ACTPACK_HD uint16_t EncodeValue(float v, bool to_bf16, uint64_t* overflow) {
  const uint16_t h = to_bf16 ? portable::FloatToBf16(v) : portable::FloatToHalf(v);
  const uint16_t exponent_mask = to_bf16 ? 0x7f80u : 0x7c00u;
  if (portable::IsFinite(v) && (h & exponent_mask) == exponent_mask) ++*overflow;
  return h;
}

ACTPACK_HD uint32_t EncodeWord(const float* input, uint64_t numel, bool to_bf16, uint64_t w,
                               uint64_t* overflow) {
  uint32_t word = 0;
  for (uint64_t s = 0; s < 2; ++s) {
    const uint64_t i = 2 * w + s;
    if (i >= numel) break;
    word |= static_cast<uint32_t>(EncodeValue(input[i], to_bf16, overflow)) << (16 * s);
  }
  return word;
}

// EncodeWord of a whole pair, given as the 8 bytes of elements 2w (low) and 2w + 1 (high): what
// a GPU reads with one 8-byte load.
ACTPACK_HD uint32_t EncodePair(uint64_t pair, bool to_bf16, uint64_t* overflow) {
  const uint32_t lo = EncodeValue(portable::BitsToFloat(static_cast<uint32_t>(pair)), to_bf16,
                                  overflow);
  const uint32_t hi = EncodeValue(portable::BitsToFloat(static_cast<uint32_t>(pair >> 32)),
                                  to_bf16, overflow);
  return lo | hi << 16;
}

// Element `i` of a cast payload back in float (exact: every half and bfloat16 is a float).
ACTPACK_HD float DecodeElement(const uint16_t* halves, bool from_bf16, uint64_t i) {
  return from_bf16 ? portable::Bf16ToFloat(halves[i]) : portable::HalfToFloat(halves[i]);
}

}  // namespace actpack::codecs::cast_math

#endif  // ACTPACK_CODECS_INTERNAL_CAST_MATH_H_

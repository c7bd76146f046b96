// Loads and stores of the floating element types as float, shared by CPU and CUDA code.
#ifndef ACTPACK_CODECS_INTERNAL_ELEMENTS_H_
#define ACTPACK_CODECS_INTERNAL_ELEMENTS_H_

#include <cstdint>

#include "codecs/internal/portable.h"

namespace actpack::codecs::elements {

// The floating element types, as the kernels' template argument (element_kind.h maps a DType
// to one).
enum Kind : int { kF32 = 1, kF16 = 2, kBF16 = 3 };

template <int K>
ACTPACK_HD float Load(const void* base, uint64_t i) {
  if constexpr (K == kF32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (K == kF16) {
    return portable::HalfToFloat(static_cast<const uint16_t*>(base)[i]);
  } else {
    return portable::Bf16ToFloat(static_cast<const uint16_t*>(base)[i]);
  }
}

template <int K>
ACTPACK_HD void Store(void* base, uint64_t i, float v) {
  if constexpr (K == kF32) {
    static_cast<float*>(base)[i] = v;
  } else if constexpr (K == kF16) {
    static_cast<uint16_t*>(base)[i] = portable::FloatToHalf(v);
  } else {
    static_cast<uint16_t*>(base)[i] = portable::FloatToBf16(v);
  }
}

// The address of element `i` of a tensor of element kind K.
template <int K>
ACTPACK_HD const void* Offset(const void* base, uint64_t i) {
  return static_cast<const uint8_t*>(base) + i * (K == kF32 ? 4 : 2);
}
template <int K>
ACTPACK_HD void* Offset(void* base, uint64_t i) {
  return static_cast<uint8_t*>(base) + i * (K == kF32 ? 4 : 2);
}

// The raw bits of element `i` of a tensor of `Width`-byte elements (1, 2 or 4), zero-extended.
template <int Width>
ACTPACK_HD uint32_t LoadBits(const void* base, uint64_t i) {
  if constexpr (Width == 4) {
    return static_cast<const uint32_t*>(base)[i];
  } else if constexpr (Width == 2) {
    return static_cast<const uint16_t*>(base)[i];
  } else {
    return static_cast<const uint8_t*>(base)[i];
  }
}

template <int Width>
ACTPACK_HD void StoreBits(void* base, uint64_t i, uint32_t bits) {
  if constexpr (Width == 4) {
    static_cast<uint32_t*>(base)[i] = bits;
  } else if constexpr (Width == 2) {
    static_cast<uint16_t*>(base)[i] = static_cast<uint16_t>(bits);
  } else {
    static_cast<uint8_t*>(base)[i] = static_cast<uint8_t>(bits);
  }
}

}  // namespace actpack::codecs::elements

#endif  // ACTPACK_CODECS_INTERNAL_ELEMENTS_H_

// Loads and stores of the floating element types as float, shared by CPU and CUDA code.
#ifndef ACTPACK_CODECS_INTERNAL_ELEMENTS_H_
#define ACTPACK_CODECS_INTERNAL_ELEMENTS_H_

#include <cstdint>

#include "codecs/internal/portable.h"

namespace actpack::codecs::elements {

// Element kinds for templates (values match codecs::DType for the float types).
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

}  // namespace actpack::codecs::elements

#endif  // ACTPACK_CODECS_INTERNAL_ELEMENTS_H_

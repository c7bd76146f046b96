// The element kind (elements::Kind) the CPU and CUDA paths of a codec use for a DType: one
// mapping, not a cast that relies on the two enums' values agreeing.
#ifndef ACTPACK_CODECS_INTERNAL_ELEMENT_KIND_H_
#define ACTPACK_CODECS_INTERNAL_ELEMENT_KIND_H_

#include <cstdint>
#include <type_traits>

#include "codecs/dtype.h"
#include "codecs/internal/elements.h"

namespace actpack::codecs::elements {

// The kind of a floating dtype. Codecs check dtypes before any kernel runs; anything else reads
// as float32 here.
inline constexpr Kind KindOf(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return kF16;
    case DType::kBFloat16: return kBF16;
    default: return kF32;
  }
}

// Calls fn.template operator()<K, kBits>() for the dtype's element kind and a quantizer's bit
// width (1, 2, 4 or 8): the CPU loops of quant and division instantiate per both.
template <typename Fn>
void DispatchKindAndBits(DType dtype, uint32_t bits, Fn&& fn) {
  auto with_kind = [&](auto kind) {
    constexpr int K = decltype(kind)::value;
    switch (bits) {
      case 1: fn.template operator()<K, 1>(); break;
      case 2: fn.template operator()<K, 2>(); break;
      case 4: fn.template operator()<K, 4>(); break;
      default: fn.template operator()<K, 8>(); break;
    }
  };
  switch (dtype) {
    case DType::kFloat16: with_kind(std::integral_constant<int, kF16>()); break;
    case DType::kBFloat16: with_kind(std::integral_constant<int, kBF16>()); break;
    default: with_kind(std::integral_constant<int, kF32>()); break;
  }
}

}  // namespace actpack::codecs::elements

#endif  // ACTPACK_CODECS_INTERNAL_ELEMENT_KIND_H_

// The element kind (elements::Kind) the CPU and CUDA paths of a codec use for a DType: one
// mapping, not a cast that relies on the two enums' values agreeing.
#ifndef ACTPACK_CODECS_INTERNAL_ELEMENT_KIND_H_
#define ACTPACK_CODECS_INTERNAL_ELEMENT_KIND_H_

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

}  // namespace actpack::codecs::elements

#endif  // ACTPACK_CODECS_INTERNAL_ELEMENT_KIND_H_

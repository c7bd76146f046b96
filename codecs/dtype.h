// Element types a codec can see. Values are pinned: they are written into encoded buffers.
#ifndef ACTPACK_CODECS_DTYPE_H_
#define ACTPACK_CODECS_DTYPE_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace actpack::codecs {

enum class DType : uint8_t {
  kFloat32 = 1,
  kFloat16 = 2,
  kBFloat16 = 3,
  kFloat64 = 4,
  kUInt8 = 5,
  kInt8 = 6,
  kInt16 = 7,
  kInt32 = 8,
  kInt64 = 9,
  kBool = 10,
};

// Bytes per element; 0 for a value that is not a DType.
size_t ElementSize(DType dtype);

// "float32", "bfloat16", ...; "unknown" for a value that is not a DType.
absl::string_view DTypeName(DType dtype);

// True for the three floating types lossy codecs accept (fp32, fp16, bf16).
bool IsLossyFloat(DType dtype);

// True when `raw` is one of the pinned DType values.
bool IsValidDType(uint8_t raw);

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_DTYPE_H_

// What a CUDA path says in a build without CUDA.
#ifndef ACTPACK_CODECS_INTERNAL_CUDA_STATUS_H_
#define ACTPACK_CODECS_INTERNAL_CUDA_STATUS_H_

#include "absl/status/status.h"

namespace actpack::codecs::internal {

// kUnimplemented: this build has no CUDA support.
absl::Status CudaNotCompiledIn(const char* what);

}  // namespace actpack::codecs::internal

#endif  // ACTPACK_CODECS_INTERNAL_CUDA_STATUS_H_

// Turns the int error codes of codecs/cuda/kernels.h into absl::Status.
#ifndef ACTPACK_CODECS_INTERNAL_CUDA_STATUS_H_
#define ACTPACK_CODECS_INTERNAL_CUDA_STATUS_H_

#include "absl/status/status.h"

namespace actpack::codecs::internal {

// OK for 0; otherwise kInternal naming the CUDA error and the failing call's site.
absl::Status CudaStatus(int error);

// kUnimplemented: this build has no CUDA support.
absl::Status CudaNotCompiledIn(const char* what);

}  // namespace actpack::codecs::internal

#endif  // ACTPACK_CODECS_INTERNAL_CUDA_STATUS_H_

// cuda_check.h — the one way actpack checks CUDA runtime calls, in the allocator and in the
// codecs' kernel launchers alike.
//
// Every CUDA call goes through ACTPACK_CUDA_STATUS, which turns its cudaError_t into an
// absl::Status naming the error, the call and the file and line it was made from; an
// out-of-memory error is kResourceExhausted (what a budget failure is too), anything else
// kInternal. Include this header only from code compiled with ACTPACK_WITH_CUDA (it needs the
// CUDA headers; nvcc compiles it).
//
// Example:
//   absl::Status Copy(void* dst, const void* src, size_t n, cudaStream_t stream) {
//     ACTPACK_CUDA_RETURN_IF_ERROR(
//         cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, stream));
//     return absl::OkStatus();
//   }
#ifndef ACTPACK_COMMON_CUDA_CHECK_H_
#define ACTPACK_COMMON_CUDA_CHECK_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace actpack {

// CudaErrorToStatus
//
// OK for cudaSuccess. Out-of-memory errors become kResourceExhausted, everything else kInternal.
// Clears CUDA's last-error state so that a recoverable error (an out-of-memory cudaMalloc) does
// not resurface in an unrelated later check.
inline absl::Status CudaErrorToStatus(cudaError_t error, const char* call, const char* file,
                                      int line) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  const absl::StatusCode code = error == cudaErrorMemoryAllocation
                                    ? absl::StatusCode::kResourceExhausted
                                    : absl::StatusCode::kInternal;
  return absl::Status(code, absl::StrCat("actpack: CUDA error ", cudaGetErrorName(error), " (",
                                         cudaGetErrorString(error), ") at ", file, ":", line,
                                         ": ", call));
}

}  // namespace actpack

// The status of a CUDA runtime call, recording where it was made.
#define ACTPACK_CUDA_STATUS(call) \
  ::actpack::CudaErrorToStatus((call), #call, __FILE__, __LINE__)

// Returns the status of a failed CUDA runtime call from the enclosing function. After a kernel
// launch, ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError()) reports a bad configuration at once.
#define ACTPACK_CUDA_RETURN_IF_ERROR(call)                         \
  do {                                                             \
    ::absl::Status actpack_cuda_status_ = ACTPACK_CUDA_STATUS(call); \
    if (!actpack_cuda_status_.ok()) return actpack_cuda_status_;   \
  } while (false)

#endif  // ACTPACK_COMMON_CUDA_CHECK_H_

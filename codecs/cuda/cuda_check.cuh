// The one checking macro for CUDA calls in actpack's kernels: on failure it records the call
// and its file:line (LastCudaErrorSite) and returns the error from the enclosing function.
#ifndef ACTPACK_CODECS_CUDA_CUDA_CHECK_CUH_
#define ACTPACK_CODECS_CUDA_CUDA_CHECK_CUH_

#include <cuda_runtime.h>

namespace actpack::codecs::cuda {
void RecordCudaErrorSite(const char* call, const char* file, int line);
}  // namespace actpack::codecs::cuda

#define ACTPACK_CUDA_TRY(call)                                                      \
  do {                                                                              \
    const cudaError_t actpack_cuda_error_ = (call);                                 \
    if (actpack_cuda_error_ != cudaSuccess) {                                       \
      ::actpack::codecs::cuda::RecordCudaErrorSite(#call, __FILE__, __LINE__);      \
      return static_cast<int>(actpack_cuda_error_);                                 \
    }                                                                               \
  } while (0)

// After a kernel launch: a launch error (bad configuration) is reported at once.
#define ACTPACK_CUDA_TRY_LAUNCH() ACTPACK_CUDA_TRY(cudaGetLastError())

#endif  // ACTPACK_CODECS_CUDA_CUDA_CHECK_CUH_

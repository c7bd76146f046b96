#include "codecs/internal/cuda_status.h"

#include "absl/strings/str_cat.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs::internal {

absl::Status CudaStatus(int error) {
  if (error == 0) return absl::OkStatus();
#ifdef ACTPACK_WITH_CUDA
  return absl::InternalError(absl::StrCat("actpack: CUDA error ", error, " (",
                                          cuda::CudaErrorString(error), ") in ",
                                          cuda::LastCudaErrorSite()));
#else
  return absl::InternalError(absl::StrCat("actpack: CUDA error ", error));
#endif
}

absl::Status CudaNotCompiledIn(const char* what) {
  return absl::UnimplementedError(absl::StrCat(
      "actpack: ", what, " on a CUDA tensor needs CUDA support, which is not compiled into this "
      "build (rebuild with --config=cuda, or pip install against a CUDA build of torch)"));
}

}  // namespace actpack::codecs::internal

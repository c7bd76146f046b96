#include "codecs/internal/cuda_status.h"

#include "absl/strings/str_cat.h"

namespace actpack::codecs::internal {

absl::Status CudaNotCompiledIn(const char* what) {
  return absl::UnimplementedError(absl::StrCat(
      "actpack: ", what, " on a CUDA tensor needs CUDA support, which is not compiled into this "
      "build (rebuild with --config=cuda, or pip install against a CUDA build of torch)"));
}

}  // namespace actpack::codecs::internal

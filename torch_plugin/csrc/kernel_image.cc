#include "torch_plugin/csrc/kernel_image.h"

#include <c10/util/Exception.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"

#ifdef ACTPACK_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime.h>

#include <array>
#include <atomic>

#include "allocator/allocator_stack.h"
#endif

namespace actpack::torch_plugin {

#ifdef ACTPACK_WITH_CUDA
namespace internal {
// kernel_image_probe.cu: built with the same -gencode flags as the codecs' kernels.
cudaError_t ProbeKernelImage();
const char* CudaArchitectures();
}  // namespace internal
#endif

std::string CudaArchitecturesBuilt() {
#ifdef ACTPACK_WITH_CUDA
  return internal::CudaArchitectures();
#else
  return "";
#endif
}

std::string NoKernelImageMessage(int device, const std::string& name, int major, int minor,
                                 const std::string& built, bool ptx_too_new) {
  std::vector<std::string> machine, ptx;
  for (absl::string_view code : absl::StrSplit(built, ' ', absl::SkipEmpty())) {
    (absl::StartsWith(code, "compute_") ? ptx : machine).emplace_back(code);
  }
  std::string holds;
  if (!machine.empty()) holds = absl::StrCat("machine code for ", absl::StrJoin(machine, ", "));
  if (!ptx.empty()) {
    absl::StrAppend(&holds, holds.empty() ? "" : " and ", "PTX for ", absl::StrJoin(ptx, ", "));
  }
  if (holds.empty()) holds = "no CUDA kernels";
  const std::string arch = absl::StrCat("sm_", major, minor);
  const std::string rebuild = absl::StrCat(
      "TORCH_CUDA_ARCH_LIST=\"", major, ".", minor,
      "\" pip install --no-build-isolation --force-reinstall <actpack's source> (a list such as "
      "\"7.5;8.0;9.0+PTX\" builds for several GPUs at once)");
  std::string message = absl::StrCat("actpack: its CUDA kernels cannot run on cuda:", device,
                                     " (", name, ", ", arch, "): this build holds ", holds);
  if (ptx_too_new) {
    absl::StrAppend(&message,
                    ", and the NVIDIA driver is older than the CUDA toolkit that wrote the PTX, "
                    "so it cannot compile it for this GPU. Update the driver, or rebuild actpack "
                    "with machine code for ", arch, ": ", rebuild);
  } else {
    absl::StrAppend(&message, ", none of which an ", arch,
                    " GPU runs. Rebuild actpack for the GPUs it must run on: ", rebuild);
  }
  return message;
}

#ifdef ACTPACK_WITH_CUDA
void CheckKernelImage(int device) {
  // Each device's first passing check is the last: a pack pays one load after it.
  static std::array<std::atomic<bool>, allocator::kMaxDevices> passed{};
  const bool cached = device >= 0 && device < allocator::kMaxDevices;
  if (cached && passed[device].load(std::memory_order_acquire)) return;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(device));
  const cudaError_t error = internal::ProbeKernelImage();
  if (error == cudaSuccess) {
    if (cached) passed[device].store(true, std::memory_order_release);
    return;
  }
  cudaDeviceProp properties{};
  const bool known = cudaGetDeviceProperties(&properties, device) == cudaSuccess;
  (void)cudaGetLastError();
  const std::string name = known ? properties.name : "unknown GPU";
  switch (error) {
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorInvalidDeviceFunction:
      TORCH_CHECK(false, NoKernelImageMessage(device, name, properties.major, properties.minor,
                                              CudaArchitecturesBuilt()));
    case cudaErrorUnsupportedPtxVersion:
      TORCH_CHECK(false, NoKernelImageMessage(device, name, properties.major, properties.minor,
                                              CudaArchitecturesBuilt(), /*ptx_too_new=*/true));
    default:
      TORCH_CHECK(false, "actpack: could not check that its CUDA kernels run on cuda:", device,
                  " (", name, "): cudaFuncGetAttributes: ", cudaGetErrorString(error));
  }
}
#else
void CheckKernelImage(int) {}
#endif

}  // namespace actpack::torch_plugin

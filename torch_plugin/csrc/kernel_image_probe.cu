// The probe of kernel_image.cc: a kernel built with the same -gencode flags as the codecs'
// kernels (setup.py gives every .cu one list), so the driver has an image of it for a device
// exactly when it has one of theirs; and the list of those architectures, which the build
// defines as ACTPACK_CUDA_ARCHS: nvcc's code= values joined by '+' (sm_80+sm_90+compute_90),
// a macro without quotes or spaces, which every build tool passes through unharmed.
#include <cuda_runtime.h>

#ifndef ACTPACK_CUDA_ARCHS
#error "ACTPACK_CUDA_ARCHS must name the -gencode code= values this file is compiled for"
#endif

#define ACTPACK_STRINGIZE_(x) #x
#define ACTPACK_STRINGIZE(x) ACTPACK_STRINGIZE_(x)

namespace actpack::torch_plugin::internal {
namespace {

__global__ void KernelImageProbe() {}

// "sm_80 sm_90 compute_90"
struct Architectures {
  char text[sizeof(ACTPACK_STRINGIZE(ACTPACK_CUDA_ARCHS))] = ACTPACK_STRINGIZE(ACTPACK_CUDA_ARCHS);
  Architectures() {
    for (char& c : text) {
      if (c == '+') c = ' ';
    }
  }
};

}  // namespace

// cudaSuccess when the current device can run the build's kernels; the error leaves no trace
// in cudaGetLastError.
cudaError_t ProbeKernelImage() {
  cudaFuncAttributes attributes;
  const cudaError_t error = cudaFuncGetAttributes(&attributes, KernelImageProbe);
  if (error != cudaSuccess) (void)cudaGetLastError();
  return error;
}

const char* CudaArchitectures() {
  static const Architectures architectures;
  return architectures.text;
}

}  // namespace actpack::torch_plugin::internal

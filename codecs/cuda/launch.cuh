// The one spelling of a kernel launch in actpack's CUDA sources:
//
//   ACTPACK_LAUNCH(QuantDecodeKernel<elements::kF16>, blocks, 256, stream)(words, layout, output);
//
// is `kernel<<<grid, block, 0, stream>>>(args...)` under nvcc and a cudaemu::Launch under the
// CUDA emulator (testing/cudaemu), which compiles the same source as host C++.
#ifndef ACTPACK_CODECS_CUDA_LAUNCH_CUH_
#define ACTPACK_CODECS_CUDA_LAUNCH_CUH_

#include <cuda_runtime.h>

#if defined(CUDAEMU)
#define ACTPACK_LAUNCH(kernel, grid, block, stream) \
  ::cudaemu::Launch(kernel, #kernel, grid, block, 0, stream)
#else
#define ACTPACK_LAUNCH(kernel, grid, block, stream) kernel<<<grid, block, 0, stream>>>
#endif

#endif  // ACTPACK_CODECS_CUDA_LAUNCH_CUH_

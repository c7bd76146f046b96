// cudaemu's stand-in for <cuda_runtime.h>: the runtime API plus what a .cu file needs to
// compile as host C++ (keywords, built-in variables, intrinsics, the launch call).
#ifndef CUDAEMU_CUDA_RUNTIME_H_
#define CUDAEMU_CUDA_RUNTIME_H_

#include "cuda_runtime_api.h"
#include "cudaemu/device.h"

#endif  // CUDAEMU_CUDA_RUNTIME_H_

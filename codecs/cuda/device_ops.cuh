// Device helpers shared by actpack's kernels: warp reductions into global accumulators and the
// per-thread scratch those accumulators live in.
#ifndef ACTPACK_CODECS_CUDA_DEVICE_OPS_CUH_
#define ACTPACK_CODECS_CUDA_DEVICE_OPS_CUH_

#include <cstdint>

namespace actpack::codecs::cuda {

inline constexpr int kScratchWords = 8;

// A zeroed array of kScratchWords accumulators on the current device, ordered on `stream`.
int GetScratch(void* stream, unsigned long long** scratch);

// Copies `count` accumulators back to the host, waiting for `stream`.
int ReadScratch(const unsigned long long* scratch, void* stream, uint64_t* values, int count);

// Sums `value` over the warp and adds it to *target once per warp (mod 2^64).
__device__ __forceinline__ void WarpSumToGlobal(uint64_t value, unsigned long long* target) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if ((threadIdx.x & 31) == 0 && value != 0) {
    atomicAdd(target, static_cast<unsigned long long>(value));
  }
}

}  // namespace actpack::codecs::cuda

#endif  // ACTPACK_CODECS_CUDA_DEVICE_OPS_CUH_

// Device helpers shared by actpack's kernels: warp reductions into global accumulators (a
// DeviceStatus's words) and grid sizing.
#ifndef ACTPACK_CODECS_CUDA_DEVICE_OPS_CUH_
#define ACTPACK_CODECS_CUDA_DEVICE_OPS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "codecs/internal/device_status.h"

namespace actpack::codecs::cuda {

// Sums `value` over the warp and adds it to *target once per warp (mod 2^64).
__device__ __forceinline__ void WarpSumToGlobal(uint64_t value, unsigned long long* target) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if ((threadIdx.x & 31) == 0 && value != 0) {
    atomicAdd(target, static_cast<unsigned long long>(value));
  }
}

// Takes the warp's maximum of `value` into *target once per warp.
__device__ __forceinline__ void WarpMaxToGlobal(uint64_t value, unsigned long long* target) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = other > value ? other : value;
  }
  if ((threadIdx.x & 31) == 0 && value != 0) {
    atomicMax(target, static_cast<unsigned long long>(value));
  }
}

// Whether PlaceDeferred placed the status's encoding nowhere (or its placement word is none it
// writes): the decode's buffer holds none of it, so the decode's check says that alone
// (kFailLost) and a codec's own checks of the buffer add nothing.
__device__ __forceinline__ bool PlacedNowhere(const DeviceStatus* status) {
  return (status->placement & kPlacementKindMask) > kPlacedInArena;
}

// Blocks for a grid-stride loop over `work_items` items, `per_block` per block per pass.
inline int BlocksFor(uint64_t work_items, int per_block) {
  return static_cast<int>(std::max<uint64_t>(
      1, std::min<uint64_t>(65535 * 16, (work_items + per_block - 1) / per_block)));
}

}  // namespace actpack::codecs::cuda

#endif  // ACTPACK_CODECS_CUDA_DEVICE_OPS_CUH_

// CUDA kernels of the `cast` codec. They write exactly the payload of the CPU reference
// (cast.cc): both compute each payload word with cast_math::EncodeWord.
//
// Encode: one thread per payload word (two neighbouring floats, one 8-byte load) in a
// grid-stride loop; the checksum and the overflow count are summed per warp into the call's
// DeviceStatus. Decode: one thread per element.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/cast_math.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    CastEncodeKernel(const float* __restrict__ input, uint64_t numel, bool to_bf16,
                     uint32_t* __restrict__ payload, DeviceStatus* __restrict__ status) {
  const uint64_t words = (numel + 1) / 2;
  uint64_t checksum = 0;
  uint64_t overflow = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  // One 8-byte load per pair where the input allows it (a warp's request is then 256
  // contiguous bytes; two 4-byte loads would each touch every sector of both).
  const bool aligned = reinterpret_cast<uintptr_t>(input) % 8 == 0;
  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < words; w += stride) {
    const uint32_t word =
        aligned && 2 * w + 1 < numel
            ? cast_math::EncodePair(reinterpret_cast<const uint64_t*>(input)[w], to_bf16,
                                    &overflow)
            : cast_math::EncodeWord(input, numel, to_bf16, w, &overflow);
    payload[w] = word;
    checksum += portable::ChecksumTerm(word, w);
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpSumToGlobal(overflow, &status->unrepresentable);
}

__global__ void CastDecodeKernel(const uint16_t* __restrict__ halves, uint64_t numel,
                                 bool from_bf16, float* __restrict__ output) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    output[i] = cast_math::DecodeElement(halves, from_bf16, i);
  }
}

}  // namespace

absl::Status CastEncode(const float* input, uint64_t numel, int to_bf16, uint8_t* payload,
                        DeviceStatus* status, void* stream) {
  const uint64_t words = (numel + 1) / 2;
  if (words > 0) {
    const cudaStream_t s = static_cast<cudaStream_t>(stream);
    ACTPACK_LAUNCH(CastEncodeKernel, BlocksFor(words, kThreads), kThreads, s)(
        input, numel, to_bf16 != 0, reinterpret_cast<uint32_t*>(payload), status);
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

absl::Status CastDecode(const uint8_t* payload, uint64_t numel, int from_bf16, float* output,
                        void* stream) {
  if (numel == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  ACTPACK_LAUNCH(CastDecodeKernel, BlocksFor(numel, kThreads), kThreads, s)(
      reinterpret_cast<const uint16_t*>(payload), numel, from_bf16 != 0, output);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

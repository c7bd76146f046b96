// CUDA kernels of the `mask` codec. They write exactly the payload of the CPU reference
// (mask.cc): bit i % 32 of word i / 32 is set when element i is not all-zero bits.
//
// Encode: one warp per payload word in a grid-stride loop; each lane loads one element
// (coalesced) and __ballot_sync assembles the word, which lane 0 writes. The checksum, the
// largest nonzero element bits and the largest complement (for the smallest) are reduced per
// warp into global accumulators. Decode: one thread per element.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr unsigned kFullMask = 0xffffffffu;

template <int Width>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    MaskEncodeKernel(const void* __restrict__ input, uint64_t numel,
                     uint32_t* __restrict__ payload, unsigned long long* __restrict__ counters) {
  const int lane = threadIdx.x & 31;
  const uint64_t words = (numel + 31) / 32;
  uint64_t checksum = 0;
  uint64_t max_bits = 0;
  uint64_t max_complement = 0;  // of the nonzero bits: the smallest nonzero is ~max_complement
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock;
  // The loop bound is the same for every lane of a warp, so the ballot sees all 32 lanes.
  for (uint64_t w = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; w < words;
       w += warp_stride) {
    const uint64_t i = 32 * w + lane;
    const uint32_t bits = i < numel ? elements::LoadBits<Width>(input, i) : 0u;
    if (bits != 0) {
      max_bits = bits > max_bits ? bits : max_bits;
      const uint64_t complement = ~bits;
      max_complement = complement > max_complement ? complement : max_complement;
    }
    const uint32_t word = __ballot_sync(kFullMask, bits != 0);
    if (lane == 0) {
      payload[w] = word;
      checksum += portable::ChecksumTerm(word, w);
    }
  }
  WarpSumToGlobal(checksum, &counters[0]);
  WarpMaxToGlobal(max_bits, &counters[1]);
  WarpMaxToGlobal(max_complement, &counters[2]);
}

template <int Width>
__global__ void MaskDecodeKernel(const uint32_t* __restrict__ payload, uint64_t numel,
                                 uint32_t value, void* __restrict__ output) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const bool set = (payload[i / 32] >> (i % 32)) & 1u;
    elements::StoreBits<Width>(output, i, set ? value : 0u);
  }
}

}  // namespace

absl::Status MaskEncode(const void* input, uint64_t numel, int width, uint8_t* payload,
                        unsigned long long* counters, void* stream, uint64_t* payload_checksum,
                        uint32_t* max_bits, uint32_t* min_bits) {
  absl::Status status = ZeroCounters(counters, stream);
  if (!status.ok()) return status;
  const uint64_t words = (numel + 31) / 32;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* out = reinterpret_cast<uint32_t*>(payload);
  if (words > 0) {
    const int blocks = BlocksFor(words, kWarpsPerBlock);
    switch (width) {  // coverage: every branch
      case 4:
        ACTPACK_LAUNCH(MaskEncodeKernel<4>, blocks, kWarpsPerBlock * 32, s)(
            input, numel, out, counters);
        break;
      case 2:
        ACTPACK_LAUNCH(MaskEncodeKernel<2>, blocks, kWarpsPerBlock * 32, s)(
            input, numel, out, counters);
        break;
      default:
        ACTPACK_LAUNCH(MaskEncodeKernel<1>, blocks, kWarpsPerBlock * 32, s)(
            input, numel, out, counters);
    }
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  uint64_t values[3] = {0, 0, 0};
  const absl::Status read = ReadCounters(counters, stream, values, 3);
  if (!read.ok()) return read;
  *payload_checksum = values[0];
  *max_bits = static_cast<uint32_t>(values[1]);
  *min_bits = values[1] == 0 ? 0u : static_cast<uint32_t>(~values[2]);
  return absl::OkStatus();
}

absl::Status MaskDecode(const uint8_t* payload, uint64_t numel, int width, uint32_t value,
                        void* output, void* stream) {
  if (numel == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  const int blocks = BlocksFor(numel, 256);
  switch (width) {  // coverage: every branch
    case 4: ACTPACK_LAUNCH(MaskDecodeKernel<4>, blocks, 256, s)(words, numel, value, output); break;
    case 2: ACTPACK_LAUNCH(MaskDecodeKernel<2>, blocks, 256, s)(words, numel, value, output); break;
    default: ACTPACK_LAUNCH(MaskDecodeKernel<1>, blocks, 256, s)(words, numel, value, output);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

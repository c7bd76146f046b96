// CUDA kernels of the `pool` codec. They write exactly the payload of the CPU reference
// (pool.cc): both compute each payload word with pool_math::EncodeWord (a left-to-right
// correctly rounded sum per window, so no reassociation).
//
// Encode: one thread per payload word (one or two windows of k <= 64 neighbouring values; a
// warp reads a contiguous span of its rows) in a grid-stride loop; the checksum and the count
// of non-finite means are summed per warp into the call's DeviceStatus. Decode: one thread per
// output element (coalesced writes; the means are read through the cache).
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/elements.h"
#include "codecs/internal/pool_math.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

constexpr int kThreads = 256;

template <int K>
__global__ void __launch_bounds__(kThreads)
    PoolEncodeKernel(const void* __restrict__ input, pool_math::Shape shape, uint64_t words,
                     uint32_t* __restrict__ payload, DeviceStatus* __restrict__ status) {
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < words; w += stride) {
    const uint32_t word = pool_math::EncodeWord<K>(input, shape, w, &nonfinite);
    payload[w] = word;
    checksum += portable::ChecksumTerm(word, w);
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpSumToGlobal(nonfinite, &status->nonfinite);
}

template <int Width>
__global__ void PoolDecodeKernel(const void* __restrict__ means, pool_math::Shape shape,
                                 void* __restrict__ output) {
  const uint64_t numel = shape.rows * shape.row_length;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const uint64_t row = i / shape.row_length;
    const uint64_t column = i - row * shape.row_length;
    const uint32_t bits =
        elements::LoadBits<Width>(means, row * shape.means_per_row + column / shape.window);
    elements::StoreBits<Width>(output, i, bits);
  }
}

uint64_t PayloadWords(const pool_math::Shape& shape, int element_kind) {
  const uint64_t width = element_kind == elements::kF32 ? 4 : 2;
  return (shape.means * width + 3) / 4;
}

}  // namespace

absl::Status PoolEncode(const void* input, const PoolLayout& layout, uint8_t* payload,
                        DeviceStatus* status, void* stream) {
  const pool_math::Shape shape =
      pool_math::MakeShape(layout.rows, layout.row_length, layout.window);
  const uint64_t words = PayloadWords(shape, layout.element_kind);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* out = reinterpret_cast<uint32_t*>(payload);
  if (words > 0) {
    const int blocks = BlocksFor(words, kThreads);
    switch (layout.element_kind) {  // coverage: every branch
      case elements::kF16:
        ACTPACK_LAUNCH(PoolEncodeKernel<elements::kF16>, blocks, kThreads, s)(
            input, shape, words, out, status);
        break;
      case elements::kBF16:
        ACTPACK_LAUNCH(PoolEncodeKernel<elements::kBF16>, blocks, kThreads, s)(
            input, shape, words, out, status);
        break;
      default:
        ACTPACK_LAUNCH(PoolEncodeKernel<elements::kF32>, blocks, kThreads, s)(
            input, shape, words, out, status);
    }
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

absl::Status PoolDecode(const uint8_t* payload, const PoolLayout& layout, void* output,
                        void* stream) {
  const pool_math::Shape shape =
      pool_math::MakeShape(layout.rows, layout.row_length, layout.window);
  const uint64_t numel = shape.rows * shape.row_length;
  if (numel == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const int blocks = BlocksFor(numel, kThreads);
  if (layout.element_kind == elements::kF32) {  // coverage: every branch
    ACTPACK_LAUNCH(PoolDecodeKernel<4>, blocks, kThreads, s)(payload, shape, output);
  } else {
    ACTPACK_LAUNCH(PoolDecodeKernel<2>, blocks, kThreads, s)(payload, shape, output);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

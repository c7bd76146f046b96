// CUDA kernels of the `bitpack` codec. They write exactly the payload of the CPU reference
// (bitpack.cc), with the same functions (codecs/internal/bitpack_math.h).
//
// Range: a grid-stride pass over the elements; each thread keeps the largest value and the
// largest complement (for the smallest) of the elements as order-preserving unsigned numbers
// (v with its sign bit flipped), reduced per warp into global accumulators. Encode: one thread
// per group of 32 elements in a grid-stride loop writes the group's b words and adds their
// checksum terms, summed per warp. Decode: one thread per element reads the words holding its
// bits.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/bitpack_math.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

namespace bm = bitpack_math;

constexpr int kThreads = 256;
constexpr uint64_t kSignBit = uint64_t{1} << 63;

template <int K>
__global__ void __launch_bounds__(kThreads)
    BitpackRangeKernel(const void* __restrict__ input, uint64_t numel,
                       unsigned long long* __restrict__ counters) {
  uint64_t max_key = 0;         // of v ^ kSignBit: unsigned order is v's signed order
  uint64_t max_complement = 0;  // of ~(v ^ kSignBit): the smallest is ~max_complement
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const uint64_t key = static_cast<uint64_t>(bm::Load<K>(input, i)) ^ kSignBit;
    max_key = key > max_key ? key : max_key;
    max_complement = ~key > max_complement ? ~key : max_complement;
  }
  // Every thread of the block gets here: the collectives see whole warps.
  WarpMaxToGlobal(max_key, &counters[0]);
  WarpMaxToGlobal(max_complement, &counters[1]);
}

template <int K>
__global__ void __launch_bounds__(kThreads)
    BitpackEncodeKernel(const void* __restrict__ input, uint64_t numel, int64_t base,
                        uint32_t bits, uint32_t* __restrict__ payload,
                        unsigned long long* __restrict__ counters) {
  const uint64_t groups = (numel + bm::kGroup - 1) / bm::kGroup;
  uint64_t checksum = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t g = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; g < groups; g += stride) {
    checksum += bm::PackGroup<K>(input, numel, g, base, bits, payload);
  }
  WarpSumToGlobal(checksum, &counters[0]);
}

template <int K>
__global__ void BitpackDecodeKernel(const uint32_t* __restrict__ payload, uint64_t numel,
                                    int64_t base, uint32_t bits, void* __restrict__ output) {
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const uint64_t offset =
        bm::Extract(payload + i / bm::kGroup * bits, static_cast<uint32_t>(i % bm::kGroup), bits);
    bm::Store<K>(output, i, static_cast<int64_t>(static_cast<uint64_t>(base) + offset));
  }
}

}  // namespace

absl::Status BitpackRange(const void* input, uint64_t numel, int kind,
                          unsigned long long* counters, void* stream, int64_t* min,
                          int64_t* max) {
  absl::Status status = ZeroCounters(counters, stream);
  if (!status.ok()) return status;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  if (numel > 0) {
    const int blocks = BlocksFor(numel, kThreads);
    switch (kind) {  // coverage: every branch
      case bm::kU8:
        ACTPACK_LAUNCH(BitpackRangeKernel<bm::kU8>, blocks, kThreads, s)(input, numel, counters);
        break;
      case bm::kI8:
        ACTPACK_LAUNCH(BitpackRangeKernel<bm::kI8>, blocks, kThreads, s)(input, numel, counters);
        break;
      case bm::kI16:
        ACTPACK_LAUNCH(BitpackRangeKernel<bm::kI16>, blocks, kThreads, s)(input, numel, counters);
        break;
      case bm::kI32:
        ACTPACK_LAUNCH(BitpackRangeKernel<bm::kI32>, blocks, kThreads, s)(input, numel, counters);
        break;
      default:
        ACTPACK_LAUNCH(BitpackRangeKernel<bm::kI64>, blocks, kThreads, s)(input, numel, counters);
    }
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  uint64_t values[2] = {0, 0};
  const absl::Status read = ReadCounters(counters, stream, values, 2);
  if (!read.ok()) return read;
  *max = static_cast<int64_t>(values[0] ^ kSignBit);
  *min = static_cast<int64_t>(~values[1] ^ kSignBit);
  return absl::OkStatus();
}

absl::Status BitpackEncode(const void* input, uint64_t numel, int kind, int64_t base,
                           uint32_t bits, uint8_t* payload, unsigned long long* counters,
                           void* stream, uint64_t* payload_checksum) {
  absl::Status status = ZeroCounters(counters, stream);
  if (!status.ok()) return status;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* words = reinterpret_cast<uint32_t*>(payload);
  const uint64_t groups = (numel + bm::kGroup - 1) / bm::kGroup;
  if (groups > 0 && bits > 0) {
    const int blocks = BlocksFor(groups, kThreads);
    switch (kind) {  // coverage: every branch
      case bm::kU8:
        ACTPACK_LAUNCH(BitpackEncodeKernel<bm::kU8>, blocks, kThreads, s)(
            input, numel, base, bits, words, counters);
        break;
      case bm::kI8:
        ACTPACK_LAUNCH(BitpackEncodeKernel<bm::kI8>, blocks, kThreads, s)(
            input, numel, base, bits, words, counters);
        break;
      case bm::kI16:
        ACTPACK_LAUNCH(BitpackEncodeKernel<bm::kI16>, blocks, kThreads, s)(
            input, numel, base, bits, words, counters);
        break;
      case bm::kI32:
        ACTPACK_LAUNCH(BitpackEncodeKernel<bm::kI32>, blocks, kThreads, s)(
            input, numel, base, bits, words, counters);
        break;
      default:
        ACTPACK_LAUNCH(BitpackEncodeKernel<bm::kI64>, blocks, kThreads, s)(
            input, numel, base, bits, words, counters);
    }
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  uint64_t checksum = 0;
  const absl::Status read = ReadCounters(counters, stream, &checksum, 1);
  if (!read.ok()) return read;
  *payload_checksum = checksum;
  return absl::OkStatus();
}

absl::Status BitpackDecode(const uint8_t* payload, uint64_t numel, int kind, int64_t base,
                           uint32_t bits, void* output, void* stream) {
  if (numel == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  const int blocks = BlocksFor(numel, kThreads);
  switch (kind) {  // coverage: every branch
    case bm::kU8:
      ACTPACK_LAUNCH(BitpackDecodeKernel<bm::kU8>, blocks, kThreads, s)(words, numel, base, bits,
                                                                         output);
      break;
    case bm::kI8:
      ACTPACK_LAUNCH(BitpackDecodeKernel<bm::kI8>, blocks, kThreads, s)(words, numel, base, bits,
                                                                         output);
      break;
    case bm::kI16:
      ACTPACK_LAUNCH(BitpackDecodeKernel<bm::kI16>, blocks, kThreads, s)(words, numel, base,
                                                                          bits, output);
      break;
    case bm::kI32:
      ACTPACK_LAUNCH(BitpackDecodeKernel<bm::kI32>, blocks, kThreads, s)(words, numel, base,
                                                                          bits, output);
      break;
    default:
      ACTPACK_LAUNCH(BitpackDecodeKernel<bm::kI64>, blocks, kThreads, s)(words, numel, base,
                                                                          bits, output);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

// Copies, counters and the payload checksum on the GPU.
#include <algorithm>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

__global__ void ChecksumKernel(const uint8_t* __restrict__ payload, uint64_t bytes,
                               unsigned long long* __restrict__ sum) {
  const uint64_t full_words = bytes / 4;
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  uint64_t local = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < full_words; w += stride) {
    local += portable::ChecksumTerm(words[w], w);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0 && bytes % 4 != 0) {
    uint32_t tail = 0;
    for (uint64_t b = 0; b < bytes % 4; ++b) {
      tail |= static_cast<uint32_t>(payload[full_words * 4 + b]) << (8 * b);
    }
    local += portable::ChecksumTerm(tail, full_words);
  }
  WarpSumToGlobal(local, sum);
}

}  // namespace

absl::Status CopyToHost(void* host_dst, const void* device_src, uint64_t bytes, void* stream) {
  if (bytes == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDefault, s));
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

absl::Status CopyToDevice(void* device_dst, const void* host_src, uint64_t bytes, void* stream) {
  if (bytes == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyDefault, s));
  // The source may be a stack buffer of the caller: wait until it has been read.
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
  return absl::OkStatus();
}

absl::Status ZeroCounters(unsigned long long* counters, void* stream) {
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(counters, 0, kCounterWords * sizeof(*counters),
                                               static_cast<cudaStream_t>(stream)));
  return absl::OkStatus();
}

absl::Status ReadCounters(const unsigned long long* counters, void* stream, uint64_t* values,
                          int count) {
  return CopyToHost(values, counters, count * sizeof(*counters), stream);
}

absl::Status PayloadChecksum(const uint8_t* payload, uint64_t bytes, unsigned long long* counters,
                             void* stream, uint64_t* checksum) {
  absl::Status status = ZeroCounters(counters, stream);
  if (!status.ok()) return status;
  const uint64_t words = bytes / 4 + 1;
  const int blocks = static_cast<int>(std::min<uint64_t>(4096, (words + 255) / 256));
  ACTPACK_LAUNCH(ChecksumKernel, blocks, 256, static_cast<cudaStream_t>(stream))(payload, bytes,
                                                                                counters);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return ReadCounters(counters, stream, checksum, 1);
}

}  // namespace actpack::codecs::cuda

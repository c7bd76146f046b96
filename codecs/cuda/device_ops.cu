// Copies, per-thread scratch and the payload checksum on the GPU.
#include <cstdio>
#include <string>

#include "codecs/cuda/cuda_check.cuh"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

thread_local std::string last_error_site = "no CUDA error";

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

void RecordCudaErrorSite(const char* call, const char* file, int line) {
  last_error_site = std::string(call) + " at " + file + ":" + std::to_string(line);
}

const char* LastCudaErrorSite() { return last_error_site.c_str(); }

const char* CudaErrorString(int error) {
  return cudaGetErrorString(static_cast<cudaError_t>(error));
}

int CopyToHost(void* host_dst, const void* device_src, uint64_t bytes, void* stream) {
  if (bytes == 0) return 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  ACTPACK_CUDA_TRY(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDefault, s));
  ACTPACK_CUDA_TRY(cudaStreamSynchronize(s));
  return 0;
}

int CopyToDevice(void* device_dst, const void* host_src, uint64_t bytes, void* stream) {
  if (bytes == 0) return 0;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  ACTPACK_CUDA_TRY(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyDefault, s));
  // The source may be a stack buffer of the caller: wait until it has been read.
  ACTPACK_CUDA_TRY(cudaStreamSynchronize(s));
  return 0;
}

int GetScratch(void* stream, unsigned long long** scratch) {
  // One small zeroed accumulator array per thread and device, allocated once: encode calls are
  // too frequent to go through cudaMalloc each time.
  constexpr int kMaxDevices = 64;
  thread_local unsigned long long* per_device[kMaxDevices] = {};
  int device = 0;
  ACTPACK_CUDA_TRY(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) return static_cast<int>(cudaErrorInvalidDevice);
  if (per_device[device] == nullptr) {
    ACTPACK_CUDA_TRY(cudaMalloc(&per_device[device], kScratchWords * sizeof(unsigned long long)));
  }
  *scratch = per_device[device];
  ACTPACK_CUDA_TRY(cudaMemsetAsync(*scratch, 0, kScratchWords * sizeof(unsigned long long),
                                   static_cast<cudaStream_t>(stream)));
  return 0;
}

int ReadScratch(const unsigned long long* scratch, void* stream, uint64_t* values, int count) {
  return CopyToHost(values, scratch, count * sizeof(unsigned long long), stream);
}

int PayloadChecksum(const uint8_t* payload, uint64_t bytes, void* stream, uint64_t* checksum) {
  unsigned long long* scratch = nullptr;
  const int error = GetScratch(stream, &scratch);
  if (error != 0) return error;
  const uint64_t words = bytes / 4 + 1;
  const int blocks = static_cast<int>(std::min<uint64_t>(4096, (words + 255) / 256));
  ACTPACK_LAUNCH(ChecksumKernel, blocks, 256, static_cast<cudaStream_t>(stream))(payload, bytes, scratch);
  ACTPACK_CUDA_TRY_LAUNCH();
  return ReadScratch(scratch, stream, checksum, 1);
}

}  // namespace actpack::codecs::cuda

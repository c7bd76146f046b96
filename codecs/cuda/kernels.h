// Host-callable entry points of the CUDA kernels. Plain C++ (no CUDA types) so that the CPU
// sources can declare calls into them; they exist only in builds with ACTPACK_WITH_CUDA.
// Every function returns a cudaError_t as int (0 = success); on failure LastCudaErrorSite()
// names the call and where it was made.
#ifndef ACTPACK_CODECS_CUDA_KERNELS_H_
#define ACTPACK_CODECS_CUDA_KERNELS_H_

#include <cstdint>

namespace actpack::codecs::cuda {

// "cudaMemcpyAsync(...) at codecs/cuda/device_ops.cu:42" for the last failed call.
const char* LastCudaErrorSite();
const char* CudaErrorString(int error);

// Synchronous copies (they wait for `stream`).
int CopyToHost(void* host_dst, const void* device_src, uint64_t bytes, void* stream);
int CopyToDevice(void* device_dst, const void* host_src, uint64_t bytes, void* stream);

// format.h's PayloadChecksum of device memory; waits for `stream`.
int PayloadChecksum(const uint8_t* payload, uint64_t bytes, void* stream, uint64_t* checksum);

struct QuantLayout {
  uint64_t numel;
  uint32_t group_size;
  uint32_t bits;
  uint64_t seed;
  int element_kind;  // elements::Kind
};

// Per-group stochastic quantization; writes the same payload as the CPU reference (quant.cc)
// and waits for `stream` to report the checksum and the counts of non-finite values and of
// groups whose range overflows float.
int QuantEncode(const void* input, const QuantLayout& layout, uint8_t* payload, void* stream,
                uint64_t* payload_checksum, uint64_t* nonfinite, uint64_t* overflow_groups);

// Asynchronous on `stream`.
int QuantDecode(const uint8_t* payload, const QuantLayout& layout, void* output, void* stream);

}  // namespace actpack::codecs::cuda

#endif  // ACTPACK_CODECS_CUDA_KERNELS_H_

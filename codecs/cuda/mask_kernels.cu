// CUDA kernels of the `mask` codec. They write exactly the payload of the CPU reference
// (mask.cc): bit i % 32 of word i / 32 is set when element i is not all-zero bits.
//
// Encode: one warp per payload word in a grid-stride loop; each lane loads one element
// (coalesced) and __ballot_sync assembles the word, which lane 0 writes. The checksum, the
// largest nonzero element bits and the largest complement (for the smallest) are reduced per
// warp into the call's DeviceStatus, and one thread turns them into the value. Decode: one
// thread checks the value in the buffer's header, then one thread per element writes it.
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
// DeviceStatus::work words of the encode.
constexpr int kMaxBitsWord = 0;
constexpr int kMaxComplementWord = 1;
// The dtypes a mask takes, by their codes in the format (dtype.h, FORMAT.md).
constexpr int kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3, kBool = 10;

template <int Width>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    MaskEncodeKernel(const void* __restrict__ input, uint64_t numel,
                     uint32_t* __restrict__ payload, DeviceStatus* __restrict__ status) {
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
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpMaxToGlobal(max_bits, &status->work[kMaxBitsWord]);
  WarpMaxToGlobal(max_complement, &status->work[kMaxComplementWord]);
}

// The value of a mask of `dtype` (dtype.h's pinned codes, FORMAT.md): whether `bits` is one the
// decoder accepts (not wider than the dtype, not a NaN, a bool's 0 or 1).
__device__ __forceinline__ bool ValidValue(int dtype, uint32_t bits) {
  switch (dtype) {
    case kFloat32: return (bits & 0x7fffffffu) <= 0x7f800000u;
    case kFloat16: return bits <= 0xffffu && (bits & 0x7fffu) <= 0x7c00u;
    case kBFloat16: return bits <= 0xffffu && (bits & 0x7fffu) <= 0x7f80u;
    case kBool: return bits <= 1u;
    default: return bits <= 0xffu;  // uint8
  }
}

// One thread, after the encode: the value (header parameter word 0), and whether the tensor
// was one of zeros and that value.
__global__ void MaskValueKernel(int dtype, DeviceStatus* __restrict__ status) {
  const uint32_t value = static_cast<uint32_t>(status->work[kMaxBitsWord]);
  const uint32_t smallest =
      value == 0 ? 0u : static_cast<uint32_t>(~status->work[kMaxComplementWord]);
  status->params[0] = value;
  if (smallest != value || !ValidValue(dtype, value)) status->unrepresentable = 1;
}

// One thread, before the decode: the buffer's value is one its dtype holds, and the other
// parameter words are zero.
__global__ void MaskCheckKernel(const uint32_t* __restrict__ header, int dtype,
                                DeviceStatus* __restrict__ status) {
  bool ok = ValidValue(dtype, header[kParamsWord]);
  for (int j = 1; j < 6; ++j) ok = ok && header[kParamsWord + j] == 0;
  if (!ok && !PlacedNowhere(status)) status->failures |= kFailParams;
}

template <int Width>
__global__ void MaskDecodeKernel(const uint32_t* __restrict__ header, uint64_t numel,
                                 const DeviceStatus* __restrict__ status,
                                 void* __restrict__ output) {
  if (status->failures != 0) return;
  const uint32_t value = header[kParamsWord];
  const uint32_t* payload = header + kHeaderWords;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const bool set = (payload[i / 32] >> (i % 32)) & 1u;
    elements::StoreBits<Width>(output, i, set ? value : 0u);
  }
}

int WidthOf(int dtype) {
  switch (dtype) {
    case kFloat32: return 4;
    case kFloat16:
    case kBFloat16: return 2;
    default: return 1;
  }
}

}  // namespace

absl::Status MaskEncode(const void* input, uint64_t numel, int dtype, uint8_t* payload,
                        DeviceStatus* status, void* stream) {
  const uint64_t words = (numel + 31) / 32;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* out = reinterpret_cast<uint32_t*>(payload);
  if (words > 0) {
    const int blocks = BlocksFor(words, kWarpsPerBlock);
    switch (WidthOf(dtype)) {  // coverage: every branch
      case 4:
        ACTPACK_LAUNCH(MaskEncodeKernel<4>, blocks, kWarpsPerBlock * 32, s)(
            input, numel, out, status);
        break;
      case 2:
        ACTPACK_LAUNCH(MaskEncodeKernel<2>, blocks, kWarpsPerBlock * 32, s)(
            input, numel, out, status);
        break;
      default:
        ACTPACK_LAUNCH(MaskEncodeKernel<1>, blocks, kWarpsPerBlock * 32, s)(
            input, numel, out, status);
    }
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  ACTPACK_LAUNCH(MaskValueKernel, 1, 1, s)(dtype, status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status MaskDecode(const uint8_t* header, uint64_t numel, int dtype, DeviceStatus* status,
                        void* output, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(header);
  ACTPACK_LAUNCH(MaskCheckKernel, 1, 1, s)(words, dtype, status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (numel == 0) return absl::OkStatus();
  const int blocks = BlocksFor(numel, 256);
  switch (WidthOf(dtype)) {  // coverage: every branch
    case 4: ACTPACK_LAUNCH(MaskDecodeKernel<4>, blocks, 256, s)(words, numel, status, output); break;
    case 2: ACTPACK_LAUNCH(MaskDecodeKernel<2>, blocks, 256, s)(words, numel, status, output); break;
    default: ACTPACK_LAUNCH(MaskDecodeKernel<1>, blocks, 256, s)(words, numel, status, output);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

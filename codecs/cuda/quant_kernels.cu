// CUDA kernels of the `quant` codec. They write exactly the payload of the CPU reference
// (quant.cc): same group layout, same counter-based random draws, same rounding (quant_math.h).
//
// Encode: one warp per group. Pass 1 reduces the group's min/max with shuffles; pass 2 lets
// each lane quantize one value per 32 (coalesced loads) and ORs the codes of 32/bits
// neighbouring lanes into one 32-bit word with shuffles, so code words are written coalesced.
// The checksum and the counts are summed per warp into the call's DeviceStatus.
// Decode: one warp per group too, each lane one value per 32 (coalesced stores).
// Per element both do 32-bit arithmetic only: 32/bits is a power of two (shifts and masks, not
// divisions) and the random stream's key is hashed once per group (portable::UniformDraws).
// The first H100 run measured the kernels at 0.3-0.5 of a copy where their traffic allows more
// than one: 64-bit hashing and a 64-bit division per element were the suspects.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"

namespace actpack::codecs::cuda {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr unsigned kFullMask = 0xffffffffu;

// log2(32 / bits): a code's word is its index >> this.
__device__ __forceinline__ uint32_t WordShift(uint32_t bits) {
  return bits == 1 ? 5u : bits == 2 ? 4u : bits == 4 ? 3u : 2u;
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    QuantEncodeKernel(const void* __restrict__ input, quant_math::Layout layout,
                      uint32_t* __restrict__ payload, DeviceStatus* __restrict__ status) {
  const int lane = threadIdx.x & 31;
  const uint64_t groups = layout.groups;
  const uint32_t word_shift = WordShift(layout.bits);
  const uint32_t per_word = 1u << word_shift;
  const uint32_t levels = (1u << layout.bits) - 1;
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;
  uint64_t overflow = 0;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock;
  for (uint64_t g = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; g < groups;
       g += warp_stride) {
    const uint64_t first = g * layout.group_size;
    const uint64_t end = first + layout.group_size;
    const uint64_t last = end < layout.numel ? end : layout.numel;
    float lo = __int_as_float(0x7f800000);  // +inf
    float hi = -lo;
    for (uint64_t i = first + lane; i < last; i += 32) {
      const float v = elements::Load<K>(input, i);
      if (!portable::IsFinite(v)) {
        ++nonfinite;
        continue;
      }
      lo = portable::Min(lo, v);
      hi = portable::Max(hi, v);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      lo = portable::Min(lo, __shfl_xor_sync(kFullMask, lo, offset));
      hi = portable::Max(hi, __shfl_xor_sync(kFullMask, hi, offset));
    }
    const quant_math::GroupParams p = quant_math::MakeGroupParams(lo, hi, layout.bits);
    if (lane == 0) {
      payload[g] = p.packed;
      checksum += portable::ChecksumTerm(p.packed, g);
      if (!p.ok) ++overflow;
    }
    const portable::UniformDraws draws(layout.seed, first, last);
    const uint64_t first_word = layout.CodeWord(g, 0);
    for (uint32_t base = 0; base < layout.group_size; base += 32) {
      const uint64_t i = first + base + lane;
      uint32_t code = 0;
      if (i < last) {
        const float v = elements::Load<K>(input, i);
        if (portable::IsFinite(v)) code = quant_math::Quantize(v, p, draws(i), levels);
      }
      const uint32_t slot = lane & (per_word - 1);
      uint32_t word = code << (slot * layout.bits);
      for (uint32_t offset = 1; offset < per_word; offset *= 2) {
        word |= __shfl_xor_sync(kFullMask, word, offset);
      }
      if (slot == 0) {
        const uint64_t index = first_word + ((base + lane) >> word_shift);
        payload[index] = word;
        checksum += portable::ChecksumTerm(word, index);
      }
    }
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpSumToGlobal(nonfinite, &status->nonfinite);
  WarpSumToGlobal(overflow, &status->unrepresentable);
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    QuantDecodeKernel(const uint32_t* __restrict__ payload, quant_math::Layout layout,
                      void* __restrict__ output) {
  const int lane = threadIdx.x & 31;
  const uint32_t word_shift = WordShift(layout.bits);
  const uint32_t slot_mask = (1u << word_shift) - 1;
  const uint32_t mask = (1u << layout.bits) - 1;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock;
  for (uint64_t g = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; g < layout.groups;
       g += warp_stride) {
    const uint64_t first = g * layout.group_size;
    const uint64_t left = layout.numel - first;
    const uint32_t n = left < layout.group_size ? static_cast<uint32_t>(left) : layout.group_size;
    const quant_math::GroupParams p = quant_math::UnpackGroupParams(payload[g]);
    const uint32_t* __restrict__ words = payload + layout.CodeWord(g, 0);
    for (uint32_t k = lane; k < n; k += 32) {
      const uint32_t code = (words[k >> word_shift] >> ((k & slot_mask) * layout.bits)) & mask;
      elements::Store<K>(output, first + k, quant_math::Dequantize(code, p));
    }
  }
}

}  // namespace

absl::Status QuantEncode(const void* input, const quant_math::Layout& layout,
                         elements::Kind kind, uint8_t* payload, DeviceStatus* status,
                         void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* words = reinterpret_cast<uint32_t*>(payload);
  if (layout.groups > 0) {
    const int blocks = BlocksFor(layout.groups, kWarpsPerBlock);
    switch (kind) {  // coverage: every branch
      case elements::kF16:
        ACTPACK_LAUNCH(QuantEncodeKernel<elements::kF16>, blocks, kWarpsPerBlock * 32, s)(
            input, layout, words, status);
        break;
      case elements::kBF16:
        ACTPACK_LAUNCH(QuantEncodeKernel<elements::kBF16>, blocks, kWarpsPerBlock * 32, s)(
            input, layout, words, status);
        break;
      default:
        ACTPACK_LAUNCH(QuantEncodeKernel<elements::kF32>, blocks, kWarpsPerBlock * 32, s)(
            input, layout, words, status);
    }
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

absl::Status QuantDecode(const uint8_t* payload, const quant_math::Layout& layout,
                         elements::Kind kind, void* output, void* stream) {
  if (layout.numel == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  const int blocks = BlocksFor(layout.groups, kWarpsPerBlock);
  const int threads = kWarpsPerBlock * 32;
  switch (kind) {  // coverage: every branch
    case elements::kF16:
      ACTPACK_LAUNCH(QuantDecodeKernel<elements::kF16>, blocks, threads, s)(words, layout, output);
      break;
    case elements::kBF16:
      ACTPACK_LAUNCH(QuantDecodeKernel<elements::kBF16>, blocks, threads, s)(words, layout, output);
      break;
    default:
      ACTPACK_LAUNCH(QuantDecodeKernel<elements::kF32>, blocks, threads, s)(words, layout, output);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

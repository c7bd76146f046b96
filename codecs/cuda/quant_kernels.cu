// CUDA kernels of the `quant` codec. They write exactly the payload of the CPU reference
// (quant.cc): same group layout, same counter-based random draws, same rounding (quant_math.h).
//
// Encode: one warp per group. Pass 1 reduces the group's min/max with shuffles; pass 2 lets
// each lane quantize one value per 32 (coalesced loads) and ORs the codes of 32/bits
// neighbouring lanes into one 32-bit word with shuffles, so code words are written coalesced.
// The checksum and the counts are summed per warp into the call's DeviceStatus.
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

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    QuantEncodeKernel(const void* __restrict__ input, quant_math::Layout layout,
                      uint32_t* __restrict__ payload, DeviceStatus* __restrict__ status) {
  const int lane = threadIdx.x & 31;
  const uint64_t groups = layout.groups;
  const uint32_t per_word = 32 / layout.bits;
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
    for (uint32_t base = 0; base < layout.group_size; base += 32) {
      const uint64_t i = first + base + lane;
      uint32_t code = 0;
      if (i < last) {
        const float v = elements::Load<K>(input, i);
        if (portable::IsFinite(v)) {
          code = quant_math::Quantize(v, p, portable::UniformFloat(layout.seed, i), levels);
        }
      }
      uint32_t word = code << ((lane % per_word) * layout.bits);
      for (uint32_t offset = 1; offset < per_word; offset *= 2) {
        word |= __shfl_xor_sync(kFullMask, word, offset);
      }
      if (lane % per_word == 0) {
        const uint64_t index = layout.CodeWord(g, (base + lane) / per_word);
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
__global__ void QuantDecodeKernel(const uint32_t* __restrict__ payload, quant_math::Layout layout,
                                  void* __restrict__ output) {
  const uint32_t per_word = 32 / layout.bits;
  const uint32_t mask = (1u << layout.bits) - 1;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < layout.numel;
       i += stride) {
    const uint64_t g = i / layout.group_size;
    const uint64_t k = i - g * layout.group_size;
    const quant_math::GroupParams p = quant_math::UnpackGroupParams(payload[g]);
    const uint32_t word = payload[layout.CodeWord(g, k / per_word)];
    const uint32_t code = (word >> ((k % per_word) * layout.bits)) & mask;
    elements::Store<K>(output, i, quant_math::Dequantize(code, p));
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
  const int blocks = BlocksFor(layout.numel, 256);
  switch (kind) {  // coverage: every branch
    case elements::kF16:
      ACTPACK_LAUNCH(QuantDecodeKernel<elements::kF16>, blocks, 256, s)(words, layout, output);
      break;
    case elements::kBF16:
      ACTPACK_LAUNCH(QuantDecodeKernel<elements::kBF16>, blocks, 256, s)(words, layout, output);
      break;
    default:
      ACTPACK_LAUNCH(QuantDecodeKernel<elements::kF32>, blocks, 256, s)(words, layout, output);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

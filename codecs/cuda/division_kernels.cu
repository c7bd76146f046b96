// CUDA kernels of the `division` codec. They write exactly the payload of the CPU reference
// (division.cc): the same window sums (division_math::LfcWord, a left-to-right correctly
// rounded sum per window), the same residuals, group parameters and counter-based draws
// (division_math.h, quant_math.h).
//
// Encode, two kernels on one stream: (1) one thread per LFC word (two windows; for C > 1 the
// warp reads contiguous columns of the same rows); (2) one warp per residual group, as
// quant's kernel: a shuffle reduction of the group's residual min/max, then each lane
// quantizes one value per 32 and the codes of 32/bits neighbouring lanes are ORed into one
// word, written coalesced. The LFC means that (2) subtracts are read back from the payload
// (1) wrote. Checksum and counts are summed per warp into the call's DeviceStatus.
// Decode: one thread per output element.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/division_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"

namespace actpack::codecs::cuda {
namespace {

using division_math::Layout;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = 8;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kLfcOverflowWord = 0;  // DeviceStatus::work, kernels.h

template <int K>
__global__ void __launch_bounds__(kThreads)
    DivisionLfcKernel(const void* __restrict__ input, Layout layout,
                      uint32_t* __restrict__ payload, DeviceStatus* __restrict__ status) {
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < layout.lfc_words;
       w += stride) {
    const uint32_t word = division_math::LfcWord<K>(input, layout, w, &nonfinite);
    payload[w] = word;
    checksum += portable::ChecksumTerm(word, w);
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  // LFC means not finite in bfloat16: out of reach, and counted apart for the message.
  WarpSumToGlobal(nonfinite, &status->unrepresentable);
  WarpSumToGlobal(nonfinite, &status->work[kLfcOverflowWord]);
}

// The residual of element k of group (p, q) against the mean it upsamples from.
template <int K>
__device__ __forceinline__ float ResidualAt(const void* __restrict__ input,
                                            const uint16_t* __restrict__ means,
                                            const Layout& l, uint64_t p, uint64_t j, float* x) {
  *x = elements::Load<K>(input, p * l.plane + j);
  const float mean = portable::Bf16ToFloat(means[division_math::MeanOf(l, p, j)]);
  return division_math::Residual(*x, mean);
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    DivisionResidualKernel(const void* __restrict__ input, Layout l,
                           uint32_t* __restrict__ payload,
                           DeviceStatus* __restrict__ status) {
  const int lane = threadIdx.x & 31;
  const uint32_t per_word = 32 / l.bits;
  const uint32_t levels = (1u << l.bits) - 1;
  const uint16_t* means = reinterpret_cast<const uint16_t*>(payload);
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;
  uint64_t overflow_groups = 0;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock;
  for (uint64_t g = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; g < l.groups;
       g += warp_stride) {
    const uint64_t p = g / l.groups_per_plane;
    const uint64_t q = g - p * l.groups_per_plane;
    const uint64_t j0 = q * l.group_length;
    const uint64_t n = division_math::GroupSize(l, q);
    float lo = __int_as_float(0x7f800000);  // +inf
    float hi = -lo;
    int overflow = 0;
    for (uint64_t k = lane; k < n; k += 32) {
      float x;
      const float r = ResidualAt<K>(input, means, l, p, j0 + k, &x);
      if (!portable::IsFinite(x)) {
        ++nonfinite;
        continue;
      }
      if (!portable::IsFinite(r)) {
        overflow = 1;
        continue;
      }
      lo = portable::Min(lo, r);
      hi = portable::Max(hi, r);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      lo = portable::Min(lo, __shfl_xor_sync(kFullMask, lo, offset));
      hi = portable::Max(hi, __shfl_xor_sync(kFullMask, hi, offset));
    }
    const bool any_overflow = __any_sync(kFullMask, overflow) != 0;
    const quant_math::GroupParams gp = quant_math::MakeGroupParams(lo, hi, l.bits);
    if (lane == 0) {
      const uint64_t param_word = division_math::ParamWord(l, g);
      payload[param_word] = gp.packed;
      checksum += portable::ChecksumTerm(gp.packed, param_word);
      if (!gp.ok || any_overflow) ++overflow_groups;
    }
    const uint64_t first_element = p * l.plane + j0;
    const portable::UniformDraws draws(l.seed, first_element, first_element + n);
    const uint64_t first_word = division_math::PlaneCodeWord(l, p) + j0 / per_word;
    const uint64_t n_words = division_math::CeilDiv(n, per_word);
    for (uint64_t base = 0; base < n; base += 32) {
      const uint64_t k = base + lane;
      uint32_t code = 0;
      if (k < n) {
        float x;
        const float r = ResidualAt<K>(input, means, l, p, j0 + k, &x);
        if (portable::IsFinite(r)) {
          code = quant_math::Quantize(r, gp, draws(first_element + k), levels);
        }
      }
      uint32_t word = code << ((lane % per_word) * l.bits);
      for (uint32_t offset = 1; offset < per_word; offset *= 2) {
        word |= __shfl_xor_sync(kFullMask, word, offset);
      }
      const uint64_t index = k / per_word;
      if (lane % per_word == 0 && index < n_words) {
        payload[first_word + index] = word;
        checksum += portable::ChecksumTerm(word, first_word + index);
      }
    }
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpSumToGlobal(nonfinite, &status->nonfinite);
  WarpSumToGlobal(overflow_groups, &status->unrepresentable);
}

template <int K>
__global__ void DivisionDecodeKernel(const uint32_t* __restrict__ payload, Layout l,
                                     void* __restrict__ output) {
  const uint32_t per_word = 32 / l.bits;
  const uint32_t mask = (1u << l.bits) - 1;
  const uint16_t* means = reinterpret_cast<const uint16_t*>(payload);
  const uint64_t numel = l.planes * l.plane;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const bool narrow = l.plane <= 0xffffffffu;  // 32-bit division where it suffices
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const uint64_t p = i / l.plane;
    const uint64_t j = i - p * l.plane;
    const uint64_t q = narrow ? static_cast<uint32_t>(j) / static_cast<uint32_t>(l.group_length)
                              : j / l.group_length;
    const quant_math::GroupParams gp = quant_math::UnpackGroupParams(
        payload[division_math::ParamWord(l, p * l.groups_per_plane + q)]);
    const uint32_t word = payload[division_math::PlaneCodeWord(l, p) + j / per_word];
    const uint32_t code = (word >> ((j % per_word) * l.bits)) & mask;
    const float mean = portable::Bf16ToFloat(means[division_math::MeanOf(l, p, j)]);
    elements::Store<K>(output, i, division_math::Reconstruct(mean, code, gp));
  }
}

}  // namespace

absl::Status DivisionEncode(const void* input, const division_math::Layout& layout,
                            int element_kind, uint8_t* payload, DeviceStatus* status,
                            void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* words = reinterpret_cast<uint32_t*>(payload);
  if (layout.lfc_words > 0) {
    const int blocks = BlocksFor(layout.lfc_words, kThreads);
    switch (element_kind) {  // coverage: every branch
      case elements::kF16:
        ACTPACK_LAUNCH(DivisionLfcKernel<elements::kF16>, blocks, kThreads, s)(input, layout, words,
                                                                      status);
        break;
      case elements::kBF16:
        ACTPACK_LAUNCH(DivisionLfcKernel<elements::kBF16>, blocks, kThreads, s)(
            input, layout, words, status);
        break;
      default:
        ACTPACK_LAUNCH(DivisionLfcKernel<elements::kF32>, blocks, kThreads, s)(input, layout, words,
                                                                      status);
    }
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (layout.groups > 0) {
    const int blocks = BlocksFor(layout.groups, kWarpsPerBlock);
    switch (element_kind) {  // coverage: every branch
      case elements::kF16:
        ACTPACK_LAUNCH(DivisionResidualKernel<elements::kF16>, blocks, kWarpsPerBlock * 32, s)(
            input, layout, words, status);
        break;
      case elements::kBF16:
        ACTPACK_LAUNCH(DivisionResidualKernel<elements::kBF16>, blocks, kWarpsPerBlock * 32, s)(
            input, layout, words, status);
        break;
      default:
        ACTPACK_LAUNCH(DivisionResidualKernel<elements::kF32>, blocks, kWarpsPerBlock * 32, s)(
            input, layout, words, status);
    }
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

absl::Status DivisionDecode(const uint8_t* payload, const division_math::Layout& layout,
                            int element_kind, void* output, void* stream) {
  const uint64_t numel = layout.planes * layout.plane;
  if (numel == 0) return absl::OkStatus();
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  const int blocks = BlocksFor(numel, kThreads);
  switch (element_kind) {  // coverage: every branch
    case elements::kF16:
      ACTPACK_LAUNCH(DivisionDecodeKernel<elements::kF16>, blocks, kThreads, s)(
          words, layout, output);
      break;
    case elements::kBF16:
      ACTPACK_LAUNCH(DivisionDecodeKernel<elements::kBF16>, blocks, kThreads, s)(
          words, layout, output);
      break;
    default:
      ACTPACK_LAUNCH(DivisionDecodeKernel<elements::kF32>, blocks, kThreads, s)(
          words, layout, output);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

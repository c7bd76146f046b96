// CUDA kernels of the `quant` codec. They write exactly the payload of the CPU reference
// (quant.cc): same group layout, same counter-based random draws, same rounding (quant_math.h).
//
// Encode: one warp per group. Where the input is 16-byte aligned and a group fits in
// kVectorsPerLane 16-byte vectors a lane (float32 groups up to 256 values, 16-bit ones up to
// 512), each lane loads its vectors first (independent loads in flight), the warp reduces the
// group's min/max from those registers with shuffles, and each lane quantizes the values it
// holds: one pass over the input. A lane's codes fill part of a word (its 4 or 8 values' bits),
// the codes of neighbouring lanes are ORed into one word with shuffles, and code words are
// written coalesced. Elsewhere (an unaligned input, larger groups) a scalar kernel reads each
// value as 4 or 2 bytes, twice (range, then codes; the second mostly from cache).
// Decode: one warp per group too, a lane a 16-byte vector of output at a time where the output
// is 16-byte aligned (the scalar kernel a value a lane elsewhere).
// Both sum the payload's checksum terms as they write or read it and close their launch
// (device_ops.cuh's CloseLaunch): the encode's last block writes the header, the decode's
// checks the buffer, so an encode is one launch and a decode one launch and Poison's.
// Per element both do 32-bit arithmetic only: 32/bits is a power of two (shifts and masks, not
// divisions) and the random stream's key is hashed once per group (portable::UniformDraws).
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
// 16-byte vectors a lane holds of its group in the vector kernels.
constexpr uint32_t kVectorsPerLane = 2;


// The vector at value `at` of `input` whose values from `last` on lie past the tensor: those
// read as zero bits, the others element by element. Out of line: a tensor has at most one.
template <int K>
__device__ __noinline__ uint4 LoadPartialVector(const void* input, uint64_t at, uint64_t last) {
  constexpr uint32_t kPer = kValuesPerVector<K>;
  uint32_t w[4] = {0, 0, 0, 0};
  for (uint32_t e = 0; e < kPer; ++e) {
    if (at + e >= last) continue;
    if constexpr (K == elements::kF32) {
      w[e] = elements::LoadBits<4>(input, at + e);
    } else {
      w[e / 2] |= elements::LoadBits<2>(input, at + e) << (16 * (e & 1));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The codes of a vector's first `count` values (the others' 0), each at its bit position. The
// inline path takes a whole vector of a group whose draws share one key (UniformDraws::one_key);
// VectorCodesAnyKey, out of line, the rest (a tensor's last vector, a group straddling a
// 2^32-element stream).
template <int K, bool kWholeOneKey>
__device__ __forceinline__ CodesOf<K> VectorCodes(const uint4& v, uint32_t count, uint64_t at,
                                                  const quant_math::GroupParams& p,
                                                  const portable::UniformDraws& draws,
                                                  uint32_t levels, uint32_t bits) {
  CodesOf<K> codes = 0;
  ACTPACK_UNROLL
  for (uint32_t e = 0; e < kValuesPerVector<K>; ++e) {
    if (!kWholeOneKey && e >= count) continue;
    const float x = VectorElement<K>(v, e);
    if (!portable::IsFinite(x)) continue;
    const float u = kWholeOneKey ? portable::UniformFromHashedKey(draws.hashed_key, at + e)
                                 : draws(at + e);
    codes |= CodesOf<K>{quant_math::Quantize(x, p, u, levels)} << (e * bits);
  }
  return codes;
}

template <int K>
__device__ __noinline__ CodesOf<K> VectorCodesAnyKey(uint4 v, uint32_t count, uint64_t at,
                                                     quant_math::GroupParams p,
                                                     portable::UniformDraws draws, uint32_t levels,
                                                     uint32_t bits) {
  return VectorCodes<K, false>(v, count, at, p, draws, levels, bits);
}

// The range of the finite values among a vector's first `count` (a tensor's last vector), and
// its count of the others. Out of line: a tensor has at most one.
struct Range {
  float lo, hi;
  uint32_t nonfinite;
};

template <int K>
__device__ __noinline__ Range PartialRange(uint4 v, uint32_t count, float lo, float hi) {
  uint32_t nonfinite = 0;
  for (uint32_t e = 0; e < kValuesPerVector<K>; ++e) {
    if (e >= count) continue;
    const float x = VectorElement<K>(v, e);
    if (!portable::IsFinite(x)) {
      ++nonfinite;
      continue;
    }
    lo = portable::Min(lo, x);
    hi = portable::Max(hi, x);
  }
  return Range{lo, hi, nonfinite};
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    QuantEncodeVectorKernel(const uint4* __restrict__ input, quant_math::Layout layout,
                            uint32_t* __restrict__ payload, LaunchClosing closing,
                            DeviceStatus* __restrict__ status) {
  constexpr uint32_t kPer = kValuesPerVector<K>;
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t vectors = layout.group_size / kPer;  // a group's
  const uint32_t levels = (1u << layout.bits) - 1;
  const uint32_t vector_bits = kPer * layout.bits;  // a vector's codes: 4 to 64 bits
  GroupCodeWords<K, kVectorsPerLane> words(vector_bits);
  portable::GroupDraws group_draws(layout.seed);
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;
  uint64_t overflow = 0;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock;
  for (uint64_t g = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; g < layout.groups;
       g += warp_stride) {
    const uint64_t first = g * layout.group_size;
    const uint64_t end = first + layout.group_size;
    const uint64_t last = end < layout.numel ? end : layout.numel;
    const uint4* group = input + g * vectors;
    uint4 v[kVectorsPerLane];
    uint32_t count[kVectorsPerLane];  // of a vector's values, those in the tensor
    ACTPACK_UNROLL
    for (uint32_t t = 0; t < kVectorsPerLane; ++t) {
      const uint32_t j = lane + 32 * t;
      const uint64_t at = first + uint64_t{j} * kPer;
      count[t] = j >= vectors || at >= last ? 0u
                 : last - at < kPer           ? static_cast<uint32_t>(last - at)
                                              : kPer;
      if (count[t] == kPer) {
        v[t] = group[j];
      } else if (count[t] > 0) {
        v[t] = LoadPartialVector<K>(input, at, last);
      } else {
        v[t] = make_uint4(0, 0, 0, 0);
      }
    }
    float lo = __int_as_float(0x7f800000);  // +inf
    float hi = -lo;
    ACTPACK_UNROLL
    for (uint32_t t = 0; t < kVectorsPerLane; ++t) {
      if (count[t] == kPer) {
        // Finite values have one minimum and maximum (but for the sign of a zero, which
        // MakeGroupParams makes no difference): fminf/fmaxf give the CPU's.
        const VectorRange range = RangeOf<K>(v[t], [](float x) { return x; });
        if (range.magnitude < 0x7f800000u) {
          lo = fminf(lo, range.lo);
          hi = fmaxf(hi, range.hi);
        } else {
          const Range partial = PartialRange<K>(v[t], kPer, lo, hi);
          lo = partial.lo;
          hi = partial.hi;
          nonfinite += partial.nonfinite;
        }
      } else if (count[t] > 0) {
        const Range partial = PartialRange<K>(v[t], count[t], lo, hi);
        lo = partial.lo;
        hi = partial.hi;
        nonfinite += partial.nonfinite;
      }
    }
    // No NaN reaches lo and hi (a lane without finite values holds +inf and -inf), so fminf
    // and fmaxf, one instruction each, agree with portable::Min and Max.
    for (int offset = 16; offset > 0; offset /= 2) {
      lo = fminf(lo, __shfl_xor_sync(kFullMask, lo, offset));
      hi = fmaxf(hi, __shfl_xor_sync(kFullMask, hi, offset));
    }
    const quant_math::GroupParams p = quant_math::MakeGroupParams(lo, hi, layout.bits);
    if (lane == 0) {
      payload[g] = p.packed;
      if (!p.ok) ++overflow;
    }
    const portable::UniformDraws draws = group_draws.Of(first, last);
    words.Start(layout.CodeWord(g, 0), vectors);
    ACTPACK_UNROLL
    for (uint32_t t = 0; t < kVectorsPerLane; ++t) {
      if (32 * t < vectors) {  // the same for every lane
        const uint64_t at = first + uint64_t{lane + 32 * t} * kPer;
        words.Put(t,
                  draws.one_key && count[t] == kPer
                      ? VectorCodes<K, true>(v[t], kPer, at, p, draws, levels, layout.bits)
                      : VectorCodesAnyKey<K>(v[t], count[t], at, p, draws, levels, layout.bits),
                  payload, &checksum);
      }
    }
    words.Sum(p.packed, g, &checksum);
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpSumToGlobal(nonfinite, &status->nonfinite);
  WarpSumToGlobal(overflow, &status->unrepresentable);
  CloseLaunch(closing, status);
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    QuantEncodeKernel(const void* __restrict__ input, quant_math::Layout layout,
                      uint32_t* __restrict__ payload, LaunchClosing closing,
                      DeviceStatus* __restrict__ status) {
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
  CloseLaunch(closing, status);
}

// The checksum terms of group g's words (its parameter word and its code words), a warp's lanes
// summing every 32nd.
__device__ __forceinline__ uint64_t GroupTerms(const uint32_t* __restrict__ payload,
                                               const quant_math::Layout& layout, uint64_t g,
                                               uint32_t lane) {
  uint64_t sum = lane == 0 ? portable::ChecksumTerm(payload[g], g) : 0;
  const uint64_t first_word = layout.CodeWord(g, 0);
  for (uint64_t w = lane; w < layout.words_per_group; w += 32) {
    sum += portable::ChecksumTerm(payload[first_word + w], first_word + w);
  }
  return sum;
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    QuantDecodeVectorKernel(const uint32_t* __restrict__ payload, quant_math::Layout layout,
                            uint4* __restrict__ output, LaunchClosing closing,
                            DeviceStatus* __restrict__ status) {
  constexpr uint32_t kPer = kValuesPerVector<K>;
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t vectors = layout.group_size / kPer;
  const uint32_t vector_bits = kPer * layout.bits;
  const uint32_t mask = (1u << layout.bits) - 1;
  uint64_t checksum = 0;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock;
  for (uint64_t g = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; g < layout.groups;
       g += warp_stride) {
    const uint64_t first = g * layout.group_size;
    const uint64_t left = layout.numel - first;
    const uint32_t n = left < layout.group_size ? static_cast<uint32_t>(left) : layout.group_size;
    const uint32_t packed = payload[g];
    if (lane == 0) checksum += portable::ChecksumTerm(packed, g);
    const quant_math::GroupParams p = quant_math::UnpackGroupParams(packed);
    const uint64_t first_word = layout.CodeWord(g, 0);
    // Every vector of the group, past the tensor's end too: each code word is summed once, by
    // the lane whose vector starts it (and the padding of a last group with them).
    for (uint32_t j = lane; j < vectors; j += 32) {
      const uint32_t bit = j * vector_bits;
      const uint32_t word = payload[first_word + (bit >> 5)];
      if ((bit & 31) == 0) checksum += portable::ChecksumTerm(word, first_word + (bit >> 5));
      CodesOf<K> codes = word >> (bit & 31);
      if constexpr (sizeof(CodesOf<K>) == 8) {
        if (vector_bits > 32) {
          const uint32_t next = payload[first_word + (bit >> 5) + 1];
          checksum += portable::ChecksumTerm(next, first_word + (bit >> 5) + 1);
          codes |= uint64_t{next} << 32;
        }
      }
      if (j * kPer >= n) continue;
      float values[kPer];
      for (uint32_t e = 0; e < kPer; ++e) {
        values[e] = quant_math::Dequantize(static_cast<uint32_t>(codes >> (e * layout.bits)) & mask,
                                           p);
      }
      if (j * kPer + kPer <= n) {
        output[g * vectors + j] = PackVector<K>(values);
      } else {  // the tensor's last values
        for (uint32_t e = 0; e < kPer; ++e) {
          if (j * kPer + e < n) elements::Store<K>(output, first + j * kPer + e, values[e]);
        }
      }
    }
  }
  WarpSumToGlobal(checksum, &status->decode_sum);
  CloseLaunch(closing, status);
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    QuantDecodeKernel(const uint32_t* __restrict__ payload, quant_math::Layout layout,
                      void* __restrict__ output, LaunchClosing closing,
                      DeviceStatus* __restrict__ status) {
  const uint32_t lane = threadIdx.x & 31;
  const uint32_t word_shift = WordShift(layout.bits);
  const uint32_t slot_mask = (1u << word_shift) - 1;
  const uint32_t mask = (1u << layout.bits) - 1;
  uint64_t checksum = 0;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock;
  for (uint64_t g = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; g < layout.groups;
       g += warp_stride) {
    const uint64_t first = g * layout.group_size;
    const uint64_t left = layout.numel - first;
    const uint32_t n = left < layout.group_size ? static_cast<uint32_t>(left) : layout.group_size;
    const quant_math::GroupParams p = quant_math::UnpackGroupParams(payload[g]);
    checksum += GroupTerms(payload, layout, g, lane);
    const uint32_t* __restrict__ words = payload + layout.CodeWord(g, 0);
    for (uint32_t k = lane; k < n; k += 32) {
      const uint32_t code = (words[k >> word_shift] >> ((k & slot_mask) * layout.bits)) & mask;
      elements::Store<K>(output, first + k, quant_math::Dequantize(code, p));
    }
  }
  WarpSumToGlobal(checksum, &status->decode_sum);
  CloseLaunch(closing, status);
}

// Whether the vector kernels take a tensor at `data` with this layout's groups.
bool Vectorizable(const void* data, const quant_math::Layout& layout, elements::Kind kind) {
  const uint32_t per_vector = kind == elements::kF32 ? 4 : 8;
  return reinterpret_cast<uintptr_t>(data) % 16 == 0 &&
         layout.group_size / per_vector <= 32 * kVectorsPerLane;
}

template <int K>
void LaunchEncode(const void* input, const quant_math::Layout& layout, uint32_t* words,
                  const LaunchClosing& closing, DeviceStatus* status, cudaStream_t s) {
  const int blocks = BlocksFor(layout.groups, kWarpsPerBlock);
  if (Vectorizable(input, layout, static_cast<elements::Kind>(K))) {
    ACTPACK_LAUNCH(QuantEncodeVectorKernel<K>, blocks, kWarpsPerBlock * 32, s)(
        static_cast<const uint4*>(input), layout, words, closing, status);
  } else {
    ACTPACK_LAUNCH(QuantEncodeKernel<K>, blocks, kWarpsPerBlock * 32, s)(input, layout, words,
                                                                        closing, status);
  }
}

template <int K>
void LaunchDecode(const uint32_t* words, const quant_math::Layout& layout, void* output,
                  const LaunchClosing& closing, DeviceStatus* status, cudaStream_t s) {
  const int blocks = BlocksFor(layout.groups, kWarpsPerBlock);
  if (Vectorizable(output, layout, static_cast<elements::Kind>(K))) {
    ACTPACK_LAUNCH(QuantDecodeVectorKernel<K>, blocks, kWarpsPerBlock * 32, s)(
        words, layout, static_cast<uint4*>(output), closing, status);
  } else {
    ACTPACK_LAUNCH(QuantDecodeKernel<K>, blocks, kWarpsPerBlock * 32, s)(words, layout, output,
                                                                        closing, status);
  }
}

}  // namespace

absl::Status QuantEncode(const void* input, const quant_math::Layout& layout,
                         elements::Kind kind, const HeaderWords& header, uint8_t* out,
                         DeviceStatus* status, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* words = reinterpret_cast<uint32_t*>(out + kHeaderWords * 4);
  const LaunchClosing closing = EncodeClosing(header, out);
  switch (kind) {  // coverage: every branch
    case elements::kF16: LaunchEncode<elements::kF16>(input, layout, words, closing, status, s); break;
    case elements::kBF16: LaunchEncode<elements::kBF16>(input, layout, words, closing, status, s); break;
    default: LaunchEncode<elements::kF32>(input, layout, words, closing, status, s);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status QuantDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                         uint32_t known, const quant_math::Layout& layout, elements::Kind kind,
                         void* output, DeviceStatus* status, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(buffer + kHeaderWords * 4);
  const LaunchClosing closing = DecodeClosing(buffer, capacity, expected, known);
  switch (kind) {  // coverage: every branch
    case elements::kF16: LaunchDecode<elements::kF16>(words, layout, output, closing, status, s); break;
    case elements::kBF16: LaunchDecode<elements::kBF16>(words, layout, output, closing, status, s); break;
    default: LaunchDecode<elements::kF32>(words, layout, output, closing, status, s);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

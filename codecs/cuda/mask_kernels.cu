// CUDA kernels of the `mask` codec. They write exactly the payload of the CPU reference
// (mask.cc): bit i % 32 of word i / 32 is set when element i is not all-zero bits.
//
// One launch each way. Encode: a thread per 16-byte vector of input (4, 8 or 16 elements;
// element by element where the input is not 16-byte aligned, and past the tensor's end), its
// bits ORed with its neighbours' into a payload word by shuffles, written by the word's first
// lane. The checksum, the largest nonzero element bits and the largest complement (for the
// smallest) are reduced per warp into the call's DeviceStatus; the launch's last block turns
// them into the value (MaskValue) and writes the header. Decode: a thread per kUnroll 16-byte
// vectors of output where it is 16-byte aligned (an element a thread elsewhere), the value
// read from the buffer's header; the thread whose elements start a payload word sums its
// checksum term, and the last block checks the buffer and the value (MaskParamFailures).
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
// Output vectors a decode thread takes a pass.
constexpr int kUnroll = 4;
constexpr unsigned kFullMask = 0xffffffffu;
// DeviceStatus::work words of the encode.
constexpr int kMaxBitsWord = 0;
constexpr int kMaxComplementWord = 1;
// The dtypes a mask takes, by their codes in the format (dtype.h, FORMAT.md).
constexpr int kFloat32 = 1, kFloat16 = 2, kBFloat16 = 3, kBool = 10;

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

// What the encode's last block decides from every block's reductions: the value (header
// parameter word 0), and whether the tensor was one of zeros and that value.
struct MaskValue {
  int dtype;
  __device__ uint64_t operator()(DeviceStatus* status) const {
    const uint32_t value = static_cast<uint32_t>(AtomicRead(&status->work[kMaxBitsWord]));
    const uint32_t smallest =
        value == 0 ? 0u : static_cast<uint32_t>(~AtomicRead(&status->work[kMaxComplementWord]));
    status->params[0] = value;
    if (smallest != value || !ValidValue(dtype, value)) status->unrepresentable = 1;
    return 0;
  }
};

// The decode's own checks of the buffer's header: the value is one its dtype holds, and the
// other parameter words are zero.
struct MaskParamFailures {
  const uint32_t* header;
  int dtype;
  __device__ uint64_t operator()(DeviceStatus*) const {
    bool ok = ValidValue(dtype, header[kParamsWord]);
    for (int j = 1; j < 6; ++j) ok = ok && header[kParamsWord + j] == 0;
    return ok ? 0 : kFailParams;
  }
};

// Element e's bits of a 16-byte vector of `Width`-byte elements.
template <int Width>
__device__ __forceinline__ uint32_t VectorBits(const uint4& v, uint32_t e) {
  const uint32_t j = e * Width / 4;
  const uint32_t word = j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
  if constexpr (Width == 4) return word;
  return (word >> (8 * (e * Width % 4))) & ((1u << (8 * Width)) - 1);
}

template <int Width>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    MaskEncodeKernel(const void* __restrict__ input, uint64_t numel, bool aligned,
                     uint32_t* __restrict__ payload, LaunchClosing closing, int dtype,
                     DeviceStatus* __restrict__ status) {
  constexpr uint32_t kPer = 16 / Width;              // elements a vector
  constexpr uint32_t kLanesPerWord = 32 / kPer;      // 8, 4 or 2
  const uint32_t lane = threadIdx.x & 31;
  const uint64_t words = (numel + 31) / 32;
  uint64_t checksum = 0;
  uint64_t max_bits = 0;
  uint64_t max_complement = 0;  // of the nonzero bits: the smallest nonzero is ~max_complement
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock * 32;
  // Whole words' vectors, in the same iterations for every lane of a warp (the shuffles).
  for (uint64_t base = (uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32) * 32;
       base < words * kLanesPerWord; base += warp_stride) {
    const uint64_t v = base + lane;
    const uint64_t at = v * kPer;
    uint32_t set = 0;  // bit e: element at + e is not zero
    uint4 x;
    const bool whole = aligned && at + kPer <= numel;
    if (whole) x = static_cast<const uint4*>(input)[v];
    ACTPACK_UNROLL
    for (uint32_t e = 0; e < kPer; ++e) {
      const uint32_t bits = whole                 ? VectorBits<Width>(x, e)
                            : at + e < numel ? elements::LoadBits<Width>(input, at + e)
                                             : 0u;
      if (bits != 0) {
        set |= 1u << e;
        max_bits = bits > max_bits ? bits : max_bits;
        const uint64_t complement = ~bits;
        max_complement = complement > max_complement ? complement : max_complement;
      }
    }
    uint32_t word = set << ((lane % kLanesPerWord) * kPer);
    for (uint32_t offset = 1; offset < kLanesPerWord; offset *= 2) {
      word |= __shfl_xor_sync(kFullMask, word, offset);
    }
    const uint64_t w = v / kLanesPerWord;
    if (lane % kLanesPerWord == 0 && w < words) {
      payload[w] = word;
      checksum += portable::ChecksumTerm(word, w);
    }
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpMaxToGlobal(max_bits, &status->work[kMaxBitsWord]);
  WarpMaxToGlobal(max_complement, &status->work[kMaxComplementWord]);
  CloseLaunch(closing, status, MaskValue{dtype});
}

// `count` copies of `value` or 0 (bit e of `set`) as Width-byte elements, packed into a 16-byte
// vector's words.
template <int Width>
__device__ __forceinline__ uint4 ExpandBits(uint32_t set, uint32_t value) {
  constexpr uint32_t kPer = 16 / Width;
  uint32_t w[4] = {0, 0, 0, 0};
  ACTPACK_UNROLL
  for (uint32_t e = 0; e < kPer; ++e) {
    if ((set >> e & 1u) != 0) w[e * Width / 4] |= value << (8 * (e * Width % 4));
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

template <int Width>
__global__ void __launch_bounds__(256)
    MaskDecodeKernel(const uint32_t* __restrict__ header, uint64_t numel, bool aligned,
                     void* __restrict__ output, LaunchClosing closing, int dtype,
                     DeviceStatus* __restrict__ status) {
  constexpr uint32_t kPer = 16 / Width;
  const uint32_t value = header[kParamsWord];
  const uint32_t* payload = header + kHeaderWords;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint64_t checksum = 0;
  uint64_t done = 0;  // the elements the vectors wrote
  if (aligned) {
    const uint64_t vectors = numel / kPer;
    uint64_t v = first;
    // kUnroll vectors a pass, their payload words loaded before any is expanded (independent
    // loads in flight), then the vectors left.
    for (; v + (kUnroll - 1) * stride < vectors; v += kUnroll * stride) {
      uint32_t words[kUnroll];
      ACTPACK_UNROLL
      for (int k = 0; k < kUnroll; ++k) words[k] = payload[(v + k * stride) * kPer / 32];
      ACTPACK_UNROLL
      for (int k = 0; k < kUnroll; ++k) {
        const uint64_t at = (v + k * stride) * kPer;
        if (at % 32 == 0) checksum += portable::ChecksumTerm(words[k], at / 32);
        static_cast<uint4*>(output)[v + k * stride] =
            ExpandBits<Width>(words[k] >> (at % 32), value);
      }
    }
    for (; v < vectors; v += stride) {
      const uint64_t at = v * kPer;
      const uint32_t word = payload[at / 32];
      if (at % 32 == 0) checksum += portable::ChecksumTerm(word, at / 32);
      static_cast<uint4*>(output)[v] = ExpandBits<Width>(word >> (at % 32), value);
    }
    done = vectors * kPer;
  }
  for (uint64_t i = done + first; i < numel; i += stride) {
    const uint32_t word = payload[i / 32];
    if (i % 32 == 0) checksum += portable::ChecksumTerm(word, i / 32);
    elements::StoreBits<Width>(output, i, (word >> (i % 32)) & 1u ? value : 0u);
  }
  WarpSumToGlobal(checksum, &status->decode_sum);
  CloseLaunch(closing, status, MaskParamFailures{header, dtype});
}

bool Aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <int Width>
void LaunchEncode(const void* input, uint64_t numel, uint32_t* payload,
                  const LaunchClosing& closing, int dtype, DeviceStatus* status, cudaStream_t s) {
  const uint64_t vectors = (numel + 31) / 32 * (32 / (16 / Width));
  ACTPACK_LAUNCH(MaskEncodeKernel<Width>, BlocksFor(vectors, kWarpsPerBlock * 32),
                 kWarpsPerBlock * 32, s)(input, numel, Aligned16(input), payload, closing, dtype,
                                         status);
}

template <int Width>
void LaunchDecode(const uint32_t* header, uint64_t numel, void* output,
                  const LaunchClosing& closing, int dtype, DeviceStatus* status, cudaStream_t s) {
  const bool aligned = Aligned16(output);
  const uint64_t threads = aligned ? numel / (16 / Width) / kUnroll : numel;
  ACTPACK_LAUNCH(MaskDecodeKernel<Width>, BlocksFor(threads, 256), 256, s)(
      header, numel, aligned, output, closing, dtype, status);
}

}  // namespace

absl::Status MaskEncode(const void* input, uint64_t numel, int dtype, const HeaderWords& header,
                        uint8_t* out, DeviceStatus* status, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* payload = reinterpret_cast<uint32_t*>(out + kHeaderWords * 4);
  const LaunchClosing closing = EncodeClosing(header, out);
  switch (dtype) {  // coverage: every branch (the element's bytes)
    case kFloat32: LaunchEncode<4>(input, numel, payload, closing, dtype, status, s); break;
    case kFloat16:
    case kBFloat16: LaunchEncode<2>(input, numel, payload, closing, dtype, status, s); break;
    default: LaunchEncode<1>(input, numel, payload, closing, dtype, status, s);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status MaskDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                        uint32_t known, uint64_t numel, int dtype, void* output,
                        DeviceStatus* status, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* header = reinterpret_cast<const uint32_t*>(buffer);
  const LaunchClosing closing = DecodeClosing(buffer, capacity, expected, known);
  switch (dtype) {  // coverage: every branch (the element's bytes)
    case kFloat32: LaunchDecode<4>(header, numel, output, closing, dtype, status, s); break;
    case kFloat16:
    case kBFloat16: LaunchDecode<2>(header, numel, output, closing, dtype, status, s); break;
    default: LaunchDecode<1>(header, numel, output, closing, dtype, status, s);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

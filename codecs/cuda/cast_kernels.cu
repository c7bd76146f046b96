// CUDA kernels of the `cast` codec. They write exactly the payload of the CPU reference
// (cast.cc): both compute each payload word with cast_math::EncodePair / EncodeWord.
//
// One launch each way. Encode: where the input is 16-byte aligned a thread turns 16-byte
// vectors of 4 floats into two payload words (one 8-byte store), kUnroll vectors loaded before
// any is converted (independent loads in flight); the words past the last vector, and every
// word of an unaligned input, one at a time. Decode: where payload and output are 16-byte
// aligned a thread turns 4 payload words (one 16-byte load) into 8 floats (two 16-byte
// stores). Both sum the payload's checksum terms (and the encode its overflow count) per warp
// into the call's DeviceStatus and close their launch (device_ops.cuh's CloseLaunch): the
// encode's last block writes the header, the decode's checks the buffer.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/cast_math.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

constexpr int kThreads = 256;
// Vectors a thread loads before it converts any.
constexpr int kUnroll = 4;

__device__ __forceinline__ uint32_t EncodeHalfVector(uint32_t a, uint32_t b, bool to_bf16,
                                                     uint64_t* overflow) {
  return cast_math::EncodePair(a | uint64_t{b} << 32, to_bf16, overflow);
}

__device__ __forceinline__ float DecodeHalf(uint32_t word, int half, bool from_bf16) {
  const uint16_t h = static_cast<uint16_t>(word >> (16 * half));
  return from_bf16 ? portable::Bf16ToFloat(h) : portable::HalfToFloat(h);
}

// The 8 floats of 4 payload words, as two 16-byte stores at `to`.
__device__ __forceinline__ void StoreDecoded(const uint32_t (&w)[4], bool from_bf16, uint4* to) {
  float f[8];
  ACTPACK_UNROLL
  for (int e = 0; e < 8; ++e) f[e] = DecodeHalf(w[e / 2], e % 2, from_bf16);
  to[0] = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                     __float_as_uint(f[3]));
  to[1] = make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]), __float_as_uint(f[6]),
                     __float_as_uint(f[7]));
}

__global__ void __launch_bounds__(kThreads)
    CastEncodeKernel(const float* __restrict__ input, uint64_t numel, bool to_bf16,
                     bool vectors_aligned, uint32_t* __restrict__ payload, LaunchClosing closing,
                     DeviceStatus* __restrict__ status) {
  const uint64_t words = (numel + 1) / 2;
  uint64_t checksum = 0;
  uint64_t overflow = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint64_t word = 0;  // the first word past the vectors
  if (vectors_aligned) {
    const uint4* src = reinterpret_cast<const uint4*>(input);
    uint2* dst = reinterpret_cast<uint2*>(payload);
    const uint64_t vectors = numel / 4;
    uint64_t i = first;
    for (; i + (kUnroll - 1) * stride < vectors; i += kUnroll * stride) {
      uint4 v[kUnroll];
      ACTPACK_UNROLL
      for (int k = 0; k < kUnroll; ++k) v[k] = src[i + k * stride];
      ACTPACK_UNROLL
      for (int k = 0; k < kUnroll; ++k) {
        const uint64_t at = i + k * stride;
        const uint2 out = make_uint2(EncodeHalfVector(v[k].x, v[k].y, to_bf16, &overflow),
                                     EncodeHalfVector(v[k].z, v[k].w, to_bf16, &overflow));
        dst[at] = out;
        checksum +=
            portable::ChecksumTerm(out.x, 2 * at) + portable::ChecksumTerm(out.y, 2 * at + 1);
      }
    }
    for (; i < vectors; i += stride) {
      const uint4 v = src[i];
      const uint2 out = make_uint2(EncodeHalfVector(v.x, v.y, to_bf16, &overflow),
                                   EncodeHalfVector(v.z, v.w, to_bf16, &overflow));
      dst[i] = out;
      checksum += portable::ChecksumTerm(out.x, 2 * i) + portable::ChecksumTerm(out.y, 2 * i + 1);
    }
    word = 2 * vectors;
  }
  for (uint64_t w = word + first; w < words; w += stride) {
    const uint32_t value = cast_math::EncodeWord(input, numel, to_bf16, w, &overflow);
    payload[w] = value;
    checksum += portable::ChecksumTerm(value, w);
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpSumToGlobal(overflow, &status->unrepresentable);
  CloseLaunch(closing, status);
}

__global__ void __launch_bounds__(kThreads)
    CastDecodeKernel(const uint32_t* __restrict__ payload, uint64_t numel, bool from_bf16,
                     bool vectors_aligned, float* __restrict__ output, LaunchClosing closing,
                     DeviceStatus* __restrict__ status) {
  const uint64_t words = (numel + 1) / 2;
  uint64_t checksum = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint64_t word = 0;  // the first word past the vectors
  if (vectors_aligned) {
    const uint4* src = reinterpret_cast<const uint4*>(payload);
    uint4* dst = reinterpret_cast<uint4*>(output);
    const uint64_t vectors = numel / 8;
    uint64_t i = first;
    for (; i + (kUnroll - 1) * stride < vectors; i += kUnroll * stride) {
      uint4 v[kUnroll];
      ACTPACK_UNROLL
      for (int k = 0; k < kUnroll; ++k) v[k] = src[i + k * stride];
      ACTPACK_UNROLL
      for (int k = 0; k < kUnroll; ++k) {
        const uint64_t at = i + k * stride;
        const uint32_t w[4] = {v[k].x, v[k].y, v[k].z, v[k].w};
        StoreDecoded(w, from_bf16, dst + 2 * at);
        ACTPACK_UNROLL
        for (int j = 0; j < 4; ++j) checksum += portable::ChecksumTerm(w[j], 4 * at + j);
      }
    }
    for (; i < vectors; i += stride) {
      const uint4 v = src[i];
      const uint32_t w[4] = {v.x, v.y, v.z, v.w};
      StoreDecoded(w, from_bf16, dst + 2 * i);
      for (int j = 0; j < 4; ++j) checksum += portable::ChecksumTerm(w[j], 4 * i + j);
    }
    word = 4 * vectors;
  }
  for (uint64_t w = word + first; w < words; w += stride) {
    const uint32_t value = payload[w];
    output[2 * w] = DecodeHalf(value, 0, from_bf16);
    if (2 * w + 1 < numel) output[2 * w + 1] = DecodeHalf(value, 1, from_bf16);
    checksum += portable::ChecksumTerm(value, w);
  }
  WarpSumToGlobal(checksum, &status->decode_sum);
  CloseLaunch(closing, status);
}

bool Aligned(const void* p, uintptr_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }

// Blocks for `per_thread` elements a thread a pass.
int Blocks(uint64_t numel, uint64_t per_thread) {
  return BlocksFor(numel / per_thread + 1, kThreads);
}

}  // namespace

absl::Status CastEncode(const float* input, uint64_t numel, int to_bf16,
                        const HeaderWords& header, uint8_t* out, DeviceStatus* status,
                        void* stream) {
  uint32_t* payload = reinterpret_cast<uint32_t*>(out + kHeaderWords * 4);
  const bool vectors = Aligned(input, 16) && Aligned(payload, 8);
  ACTPACK_LAUNCH(CastEncodeKernel, Blocks(numel, vectors ? 4 * kUnroll : 2), kThreads,
                 static_cast<cudaStream_t>(stream))(input, numel, to_bf16 != 0, vectors, payload,
                                                    EncodeClosing(header, out), status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status CastDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                        uint32_t known, uint64_t numel, int from_bf16, float* output,
                        DeviceStatus* status, void* stream) {
  const uint32_t* payload = reinterpret_cast<const uint32_t*>(buffer + kHeaderWords * 4);
  const bool vectors = Aligned(payload, 16) && Aligned(output, 16);
  ACTPACK_LAUNCH(CastDecodeKernel, Blocks(numel, vectors ? 8 * kUnroll : 2), kThreads,
                 static_cast<cudaStream_t>(stream))(
      payload, numel, from_bf16 != 0, vectors, output,
      DecodeClosing(buffer, capacity, expected, known), status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

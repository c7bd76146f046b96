// CUDA kernels of the `pool` codec. They write exactly the payload of the CPU reference
// (pool.cc): each mean a left-to-right correctly rounded sum over its window, divided by its
// count (pool_math.h), so no reassociation.
//
// One launch each way. Encode: a thread per payload word (one float32 mean, or two 16-bit
// ones). Where the windows tile the tensor (rows of whole windows), each a multiple of 4 values,
// and the input is 16-byte aligned, a word's 4 x window bytes are window / 4 16-byte vectors it
// loads (windows of 4: a word one vector, kUnroll words a thread a pass); elsewhere
// pool_math::EncodeWord reads value by value. Decode: where the windows tile
// the tensor as well and the output is 16-byte aligned, a thread writes a 16-byte vector of
// output (each 4 values of it one window's mean); elsewhere a value a thread. The decode sums a
// payload word's checksum term in the thread that writes the first value of the word's first
// window. Both close their launch (device_ops.cuh's CloseLaunch): the encode's last block
// writes the header, the decode's checks the buffer.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/elements.h"
#include "codecs/internal/pool_math.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

constexpr int kThreads = 256;

// Words a thread encodes a pass where a word is one 16-byte vector (windows of 4).
constexpr int kUnroll = 4;

// The sums of a payload word's one or two windows (float32: the first only), vector `v` of the
// word's window / 4 added to them left to right.
template <int K>
__device__ __forceinline__ void AddVector(const uint4& x, uint32_t v, uint32_t window,
                                          float* first, float* second) {
  constexpr uint32_t kPer = kValuesPerVector<K>;
  ACTPACK_UNROLL
  for (uint32_t e = 0; e < kPer; ++e) {
    const float value = VectorElement<K>(x, e);
    if (K != elements::kF32 && v * kPer + e >= window) {
      *second = portable::Add(*second, value);
    } else {
      *first = portable::Add(*first, value);
    }
  }
}

// The payload word of those sums; the same bits as pool_math::EncodeWord.
template <int K>
__device__ __forceinline__ uint32_t TiledWord(float first, float second, uint32_t window,
                                              uint64_t* nonfinite) {
  const float count = static_cast<float>(window);
  if constexpr (K == elements::kF32) {
    const float mean = portable::Div(first, count);
    if (!portable::IsFinite(mean)) ++*nonfinite;
    return portable::FloatBits(mean);
  } else {
    return pool_math::StoredHalf<K>(portable::Div(first, count), nonfinite) |
           pool_math::StoredHalf<K>(portable::Div(second, count), nonfinite) << 16;
  }
}

// Payload word w of a tensor whose windows tile it, from its window / 4 16-byte vectors (the
// 4 x window bytes of its one or two windows).
template <int K>
__device__ __forceinline__ uint32_t EncodeTiledWord(const uint4* __restrict__ input,
                                                    uint32_t window, uint64_t w,
                                                    uint64_t* nonfinite) {
  const uint32_t vectors = window / 4;
  const uint4* span = input + w * vectors;
  float first = 0.0f, second = 0.0f;
  for (uint32_t v = 0; v < vectors; ++v) AddVector<K>(span[v], v, window, &first, &second);
  return TiledWord<K>(first, second, window, nonfinite);
}

template <int K>
__global__ void __launch_bounds__(kThreads)
    PoolEncodeKernel(const void* __restrict__ input, pool_math::Shape shape, uint64_t words,
                     bool tiled, uint32_t* __restrict__ payload, LaunchClosing closing,
                     DeviceStatus* __restrict__ status) {
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  // The words of whole tiles: a 16-bit tensor's last word may hold one mean.
  const uint64_t tiled_words = !tiled ? 0 : K == elements::kF32 ? words : shape.means / 2;
  uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (shape.window == 4) {  // a word one vector: kUnroll of them loaded before any is summed
    const uint4* vectors = static_cast<const uint4*>(input);
    for (; w + (kUnroll - 1) * stride < tiled_words; w += kUnroll * stride) {
      uint4 x[kUnroll];
      ACTPACK_UNROLL
      for (int k = 0; k < kUnroll; ++k) x[k] = vectors[w + k * stride];
      ACTPACK_UNROLL
      for (int k = 0; k < kUnroll; ++k) {
        float first = 0.0f, second = 0.0f;
        AddVector<K>(x[k], 0, 4, &first, &second);
        const uint32_t word = TiledWord<K>(first, second, 4, &nonfinite);
        payload[w + k * stride] = word;
        checksum += portable::ChecksumTerm(word, w + k * stride);
      }
    }
  }
  for (; w < words; w += stride) {
    const uint32_t word =
        w < tiled_words
            ? EncodeTiledWord<K>(static_cast<const uint4*>(input), shape.window, w, &nonfinite)
            : pool_math::EncodeWord<K>(input, shape, w, &nonfinite);
    payload[w] = word;
    checksum += portable::ChecksumTerm(word, w);
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpSumToGlobal(nonfinite, &status->nonfinite);
  CloseLaunch(closing, status);
}

// The checksum term of the payload word that mean m starts (every float32 mean, every other
// 16-bit one), else 0.
template <int Width>
__device__ __forceinline__ uint64_t MeanTerm(const uint32_t* __restrict__ payload, uint64_t m) {
  if (Width == 2 && m % 2 != 0) return 0;
  const uint64_t w = Width == 4 ? m : m / 2;
  return portable::ChecksumTerm(payload[w], w);
}

template <int Width>
__global__ void __launch_bounds__(kThreads)
    PoolDecodeKernel(const uint32_t* __restrict__ payload, pool_math::Shape shape, bool tiled,
                     void* __restrict__ output, LaunchClosing closing,
                     DeviceStatus* __restrict__ status) {
  constexpr uint32_t kPer = 16 / Width;
  const uint64_t numel = shape.rows * shape.row_length;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint64_t checksum = 0;
  uint64_t done = 0;  // the values the vectors wrote
  if (tiled) {  // every window's values lie in whole groups of 4 of a vector
    const uint64_t vectors = numel / kPer;
    for (uint64_t i = first; i < vectors; i += stride) {
      uint32_t w[4];
      ACTPACK_UNROLL
      for (uint32_t q = 0; q < kPer / 4; ++q) {  // each 4 values of the vector
        const uint64_t e = i * kPer + 4 * q;
        const uint64_t m = e / shape.window;
        const uint32_t bits = elements::LoadBits<Width>(payload, m);
        if (e % shape.window == 0) checksum += MeanTerm<Width>(payload, m);
        if constexpr (Width == 4) {
          w[0] = w[1] = w[2] = w[3] = bits;
        } else {
          w[2 * q] = w[2 * q + 1] = bits | bits << 16;
        }
      }
      static_cast<uint4*>(output)[i] = make_uint4(w[0], w[1], w[2], w[3]);
    }
    done = vectors * kPer;
  }
  for (uint64_t i = done + first; i < numel; i += stride) {
    const uint64_t row = i / shape.row_length;
    const uint64_t column = i - row * shape.row_length;
    const uint64_t m = row * shape.means_per_row + column / shape.window;
    elements::StoreBits<Width>(output, i, elements::LoadBits<Width>(payload, m));
    if (column % shape.window == 0) checksum += MeanTerm<Width>(payload, m);
  }
  WarpSumToGlobal(checksum, &status->decode_sum);
  CloseLaunch(closing, status);
}

uint64_t PayloadWords(const pool_math::Shape& shape, int element_kind) {
  const uint64_t width = element_kind == elements::kF32 ? 4 : 2;
  return (shape.means * width + 3) / 4;
}

// Whether the windows tile a tensor at `data` in 16-byte vectors: rows of whole windows of a
// multiple of 4 values, 16-byte aligned.
bool Tiled(const void* data, const pool_math::Shape& shape) {
  return reinterpret_cast<uintptr_t>(data) % 16 == 0 && shape.window % 4 == 0 &&
         shape.row_length % shape.window == 0;
}

template <int K>
void LaunchEncode(const void* input, const pool_math::Shape& shape, uint64_t words,
                  uint32_t* payload, const LaunchClosing& closing, DeviceStatus* status,
                  cudaStream_t s) {
  const bool tiled = Tiled(input, shape);
  const uint64_t threads = tiled && shape.window == 4 ? words / kUnroll : words;
  ACTPACK_LAUNCH(PoolEncodeKernel<K>, BlocksFor(threads, kThreads), kThreads, s)(
      input, shape, words, tiled, payload, closing, status);
}

}  // namespace

absl::Status PoolEncode(const void* input, const PoolLayout& layout, const HeaderWords& header,
                        uint8_t* out, DeviceStatus* status, void* stream) {
  const pool_math::Shape shape =
      pool_math::MakeShape(layout.rows, layout.row_length, layout.window);
  const uint64_t words = PayloadWords(shape, layout.element_kind);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* payload = reinterpret_cast<uint32_t*>(out + kHeaderWords * 4);
  const LaunchClosing closing = EncodeClosing(header, out);
  switch (layout.element_kind) {  // coverage: every branch
    case elements::kF16:
      LaunchEncode<elements::kF16>(input, shape, words, payload, closing, status, s);
      break;
    case elements::kBF16:
      LaunchEncode<elements::kBF16>(input, shape, words, payload, closing, status, s);
      break;
    default:
      LaunchEncode<elements::kF32>(input, shape, words, payload, closing, status, s);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status PoolDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                        uint32_t known, const PoolLayout& layout, void* output,
                        DeviceStatus* status, void* stream) {
  const pool_math::Shape shape =
      pool_math::MakeShape(layout.rows, layout.row_length, layout.window);
  const uint64_t numel = shape.rows * shape.row_length;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* payload = reinterpret_cast<const uint32_t*>(buffer + kHeaderWords * 4);
  const LaunchClosing closing = DecodeClosing(buffer, capacity, expected, known);
  const bool tiled = Tiled(output, shape);
  if (layout.element_kind == elements::kF32) {  // coverage: every branch
    ACTPACK_LAUNCH(PoolDecodeKernel<4>, BlocksFor(tiled ? numel / 4 : numel, kThreads), kThreads,
                   s)(payload, shape, tiled, output, closing, status);
  } else {
    ACTPACK_LAUNCH(PoolDecodeKernel<2>, BlocksFor(tiled ? numel / 8 : numel, kThreads), kThreads,
                   s)(payload, shape, tiled, output, closing, status);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

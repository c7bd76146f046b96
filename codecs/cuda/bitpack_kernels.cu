// CUDA kernels of the `bitpack` codec. They write exactly the payload of the CPU reference
// (bitpack.cc), with the same functions (codecs/internal/bitpack_math.h).
//
// Range: a grid-stride pass over the elements; each thread keeps the largest value and the
// largest complement (for the smallest) of the elements as order-preserving unsigned numbers
// (v with its sign bit flipped), reduced per warp into the call's DeviceStatus, from which one
// thread derives base and b. Encode: a warp per 4 groups of 32 elements, a lane per element of
// each, in a grid-stride loop: the lanes' offsets are ORed into the groups' words in shared
// memory, which consecutive lanes then store with their checksum terms, summed per warp.
// Decode: one thread
// checks base and b in the buffer's header, then one thread per element reads the words
// holding its bits.
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/bitpack_math.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

namespace bm = bitpack_math;

constexpr int kThreads = 256;
constexpr uint64_t kSignBit = uint64_t{1} << 63;

// DeviceStatus::work words of the encode.
constexpr int kMaxKeyWord = 0;
constexpr int kMaxComplementWord = 1;

template <int K>
__global__ void __launch_bounds__(kThreads)
    BitpackRangeKernel(const void* __restrict__ input, uint64_t numel,
                       DeviceStatus* __restrict__ status) {
  uint64_t max_key = 0;         // of v ^ kSignBit: unsigned order is v's signed order
  uint64_t max_complement = 0;  // of ~(v ^ kSignBit): the smallest is ~max_complement
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const uint64_t key = static_cast<uint64_t>(bm::Load<K>(input, i)) ^ kSignBit;
    max_key = key > max_key ? key : max_key;
    max_complement = ~key > max_complement ? ~key : max_complement;
  }
  // Every thread of the block gets here: the collectives see whole warps.
  WarpMaxToGlobal(max_key, &status->work[kMaxKeyWord]);
  WarpMaxToGlobal(max_complement, &status->work[kMaxComplementWord]);
}

// One thread: base and b from the range (the header's parameters) and the payload's size.
__global__ void BitpackParamsKernel(uint64_t numel, int kind, DeviceStatus* __restrict__ status) {
  int64_t lo = 0, hi = 0;  // an empty tensor: base 0, b = 0, no payload
  if (numel > 0) {
    hi = static_cast<int64_t>(status->work[kMaxKeyWord] ^ kSignBit);
    lo = static_cast<int64_t>(~status->work[kMaxComplementWord] ^ kSignBit);
  }
  const bm::Params p = bm::MakeParams(lo, hi, kind);
  status->params[0] = static_cast<uint32_t>(p.base);
  status->params[1] = static_cast<uint32_t>(static_cast<uint64_t>(p.base) >> 32);
  status->params[2] = p.bits;
  status->payload_bytes = 4 * bm::PayloadWords(numel, p.bits);
}

__device__ __forceinline__ int64_t BaseOf(const uint32_t* params) {
  return static_cast<int64_t>(params[0] | static_cast<uint64_t>(params[1]) << 32);
}

// Groups a warp packs per pass: their elements are loaded first, all in flight together, and
// their words (consecutive in the payload) stored together. A warp makes about kPassesPerWarp
// passes (its shared words are zeroed once).
constexpr int kGroupsPerPass = 4;
constexpr int kPassesPerWarp = 8;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr uint32_t kPassWords = kGroupsPerPass * 64;  // groups of 32 elements of up to 64 bits

// A warp per kGroupsPerPass consecutive groups at a time, grid-stride. Lane j holds element j of
// each group (consecutive lanes load consecutive elements) and ORs its offset's bits into the
// pass's words in the warp's shared memory (the bits of different lanes never overlap, so the
// order of the ORs does not matter); then consecutive lanes store consecutive words, adding
// their checksum terms.
template <int K>
__global__ void __launch_bounds__(kThreads)
    BitpackEncodeKernel(const void* __restrict__ input, uint64_t numel,
                        uint32_t* __restrict__ payload, DeviceStatus* __restrict__ status) {
  __shared__ uint32_t staged[kWarpsPerBlock][kPassWords];
  const int64_t base = BaseOf(status->params);
  const uint32_t bits = status->params[2];
  const uint64_t groups = bits == 0 ? 0 : (numel + bm::kGroup - 1) / bm::kGroup;
  const uint32_t lane = threadIdx.x & 31;
  uint32_t* words = staged[threadIdx.x / 32];
  for (uint32_t t = lane; t < kPassWords; t += 32) words[t] = 0;
  __syncwarp();
  // Lane j's bits start at bit j * b of its group: the group's word `first`, bit `shift`.
  const uint32_t first = lane * bits / 32, shift = lane * bits % 32;
  uint64_t checksum = 0;
  const uint64_t warp = (uint64_t{blockIdx.x} * blockDim.x + threadIdx.x) / 32;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock * kGroupsPerPass;
  for (uint64_t g0 = warp * kGroupsPerPass; g0 < groups; g0 += warp_stride) {
    uint64_t offsets[kGroupsPerPass];
    for (int k = 0; k < kGroupsPerPass; ++k) {
      const uint64_t i = (g0 + k) * bm::kGroup + lane;
      offsets[k] = i < numel ? static_cast<uint64_t>(bm::Load<K>(input, i)) -
                                   static_cast<uint64_t>(base)
                             : 0;
    }
    for (int k = 0; k < kGroupsPerPass; ++k) {
      const uint64_t d = offsets[k];  // < 2^b; 0 past the tensor's end
      uint32_t* group = words + k * bits + first;
      if (d != 0) {
        atomicOr(&group[0], static_cast<uint32_t>(d << shift));
        const uint64_t high = d >> (32 - shift);  // the bits past the first word
        if (high != 0) atomicOr(&group[1], static_cast<uint32_t>(high));
        if ((high >> 32) != 0) atomicOr(&group[2], static_cast<uint32_t>(high >> 32));
      }
    }
    __syncwarp();
    const uint64_t rest = numel - g0 * bm::kGroup;  // elements from the pass's first on
    const uint32_t pass_words = static_cast<uint32_t>(
        rest >= kGroupsPerPass * bm::kGroup ? kGroupsPerPass * bits : bm::PayloadWords(rest, bits));
    for (uint32_t t = lane; t < pass_words; t += 32) {
      const uint32_t word = words[t];
      words[t] = 0;
      const uint64_t index = g0 * bits + t;
      payload[index] = word;
      checksum += portable::ChecksumTerm(word, index);
    }
    __syncwarp();
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
}

// One thread, before the decode: base and b are ones the kind holds, the other parameter bytes
// are zero and the payload's size is the one they give.
__global__ void BitpackCheckKernel(const uint32_t* __restrict__ header, uint64_t numel, int kind,
                                   uint32_t element_bytes, DeviceStatus* __restrict__ status) {
  const uint32_t* params = header + kParamsWord;
  const uint32_t bits = params[2];
  bool ok = bits <= 64 && bm::ValidParams(BaseOf(params), bits, kind, element_bytes) &&
            params[3] == 0 && params[4] == 0 && params[5] == 0;
  const uint64_t size = header[kPayloadSizeWord] |
                        static_cast<uint64_t>(header[kPayloadSizeWord + 1]) << 32;
  ok = ok && size == 4 * bm::PayloadWords(numel, bits);
  if (!ok && !PlacedNowhere(status)) status->failures |= kFailParams;
}

template <int K>
__global__ void BitpackDecodeKernel(const uint32_t* __restrict__ header, uint64_t numel,
                                    const DeviceStatus* __restrict__ status,
                                    void* __restrict__ output) {
  if (status->failures != 0) return;
  const int64_t base = BaseOf(header + kParamsWord);
  const uint32_t bits = header[kParamsWord + 2];
  const uint32_t* payload = header + kHeaderWords;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const uint64_t offset =
        bm::Extract(payload + i / bm::kGroup * bits, static_cast<uint32_t>(i % bm::kGroup), bits);
    bm::Store<K>(output, i, static_cast<int64_t>(static_cast<uint64_t>(base) + offset));
  }
}

// Calls fn(std::integral_constant<int, K>()) for the kind.
template <typename Fn>
void DispatchKind(int kind, Fn&& fn) {
  switch (kind) {  // coverage: every branch
    case bm::kU8: fn(std::integral_constant<int, bm::kU8>()); break;
    case bm::kI8: fn(std::integral_constant<int, bm::kI8>()); break;
    case bm::kI16: fn(std::integral_constant<int, bm::kI16>()); break;
    case bm::kI32: fn(std::integral_constant<int, bm::kI32>()); break;
    default: fn(std::integral_constant<int, bm::kI64>()); break;
  }
}

uint32_t BytesOf(int kind) {
  switch (kind) {
    case bm::kU8:
    case bm::kI8: return 1;
    case bm::kI16: return 2;
    case bm::kI32: return 4;
    default: return 8;
  }
}

}  // namespace

absl::Status BitpackEncode(const void* input, uint64_t numel, int kind, uint8_t* payload,
                           DeviceStatus* status, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* words = reinterpret_cast<uint32_t*>(payload);
  if (numel > 0) {
    DispatchKind(kind, [&](auto k) {
      ACTPACK_LAUNCH(BitpackRangeKernel<decltype(k)::value>, BlocksFor(numel, kThreads), kThreads,
                     s)(input, numel, status);
    });
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  ACTPACK_LAUNCH(BitpackParamsKernel, 1, 1, s)(numel, kind, status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  const uint64_t groups = (numel + bm::kGroup - 1) / bm::kGroup;
  if (groups > 0) {
    DispatchKind(kind, [&](auto k) {
      ACTPACK_LAUNCH(BitpackEncodeKernel<decltype(k)::value>,
                   BlocksFor(groups, kWarpsPerBlock * kGroupsPerPass * kPassesPerWarp), kThreads,
                   s)(input, numel, words, status);
    });
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

absl::Status BitpackDecode(const uint8_t* header, uint64_t numel, int kind, DeviceStatus* status,
                           void* output, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(header);
  ACTPACK_LAUNCH(BitpackCheckKernel, 1, 1, s)(words, numel, kind, BytesOf(kind), status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (numel == 0) return absl::OkStatus();
  DispatchKind(kind, [&](auto k) {
    ACTPACK_LAUNCH(BitpackDecodeKernel<decltype(k)::value>, BlocksFor(numel, kThreads), kThreads,
                   s)(words, numel, status, output);
  });
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

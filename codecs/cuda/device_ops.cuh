// Device helpers shared by actpack's kernels: warp reductions into global accumulators (a
// DeviceStatus's words) and grid sizing.
#ifndef ACTPACK_CODECS_CUDA_DEVICE_OPS_CUH_
#define ACTPACK_CODECS_CUDA_DEVICE_OPS_CUH_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "absl/status/status.h"
#include "codecs/internal/device_status.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"

// Unrolls the loop that follows fully under nvcc (its trip count a constant), so that arrays it
// indexes stay in registers; nothing in host C++.
#if defined(__CUDACC__)
#define ACTPACK_UNROLL _Pragma("unroll")
#else
#define ACTPACK_UNROLL
#endif

namespace actpack::codecs::cuda {

// Sums `value` over the warp and adds it to *target once per warp (mod 2^64).
__device__ __forceinline__ void WarpSumToGlobal(uint64_t value, unsigned long long* target) {
  for (int offset = 16; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xffffffffu, value, offset);
  }
  if ((threadIdx.x & 31) == 0 && value != 0) {
    atomicAdd(target, static_cast<unsigned long long>(value));
  }
}

// Takes the warp's maximum of `value` into *target once per warp.
__device__ __forceinline__ void WarpMaxToGlobal(uint64_t value, unsigned long long* target) {
  for (int offset = 16; offset > 0; offset /= 2) {
    const uint64_t other = __shfl_xor_sync(0xffffffffu, value, offset);
    value = other > value ? other : value;
  }
  if ((threadIdx.x & 31) == 0 && value != 0) {
    atomicMax(target, static_cast<unsigned long long>(value));
  }
}

// Whether PlaceDeferred placed the status's encoding nowhere (or its placement word is none it
// writes): the decode's buffer holds none of it, so the decode's check says that alone
// (kFailLost) and a codec's own checks of the buffer add nothing.
__device__ __forceinline__ bool PlacedNowhere(const DeviceStatus* status) {
  return (status->placement & kPlacementKindMask) > kPlacedInArena;
}

// Bits 32..63 of DeviceStatus::failures count the blocks of a launch that finished
// (LastBlockToFinish); 0 between launches, so the DecodeFailure bits read the same.
constexpr unsigned long long kBlockDone = 1ull << 32;
constexpr unsigned long long kFailureBits = kBlockDone - 1;

// A read of a word other blocks of this launch added to with atomics (an atomic read: a plain
// one may see a stale line of this SM's L1).
__device__ __forceinline__ unsigned long long AtomicRead(unsigned long long* word) {
  return atomicAdd(word, 0ull);
}
__device__ __forceinline__ uint32_t AtomicRead(uint32_t* word) { return atomicOr(word, 0u); }

// Called by every thread of every block at the end of a launch whose blocks summed into
// *status with atomics: true in the block that finished last (every other block's sums are in
// *status then), which resets the count. A __syncthreads, so no thread may have returned.
__device__ __forceinline__ bool LastBlockToFinish(DeviceStatus* status) {
  __shared__ bool last;
  __threadfence();  // this thread's sums and stores, before the block counts itself done
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned long long before = atomicAdd(&status->failures, kBlockDone);
    const uint64_t blocks = uint64_t{gridDim.x} * gridDim.y * gridDim.z;
    last = (before >> 32) == blocks - 1;
    if (last) atomicAnd(&status->failures, kFailureBits);
  }
  __syncthreads();
  return last;
}

__device__ __forceinline__ uint64_t Words64(const uint32_t* w) {
  return w[0] | static_cast<uint64_t>(w[1]) << 32;
}

// The header at `out` written from the host's `header`: its parameter words ORed with
// status->params, its payload size status->payload_bytes where `device_sized`, the
// unrepresentable flag where the status counts such values, and the checksum from
// status->payload_sum (FinalizeHeader in kernels.h). One thread, after every sum is in; with
// `atomic` reads of the status where other blocks of the same launch summed into it.
__device__ __forceinline__ void WriteFinalHeader(HeaderWords header, bool device_sized,
                                                 DeviceStatus* status, uint32_t* out, bool atomic) {
  auto read = [atomic](auto* word) { return atomic ? AtomicRead(word) : *word; };
  uint32_t* w = header.w;
  for (int j = 0; j < 6; ++j) w[kParamsWord + j] |= read(&status->params[j]);
  if (device_sized) {
    const uint64_t bytes = read(&status->payload_bytes);
    w[kPayloadSizeWord] = static_cast<uint32_t>(bytes);
    w[kPayloadSizeWord + 1] = static_cast<uint32_t>(bytes >> 32);
  }
  if (read(&status->nonfinite) != 0 || read(&status->unrepresentable) != 0) {
    w[kFlagsWord] |= kFlagUnrepresentable << 16;
  }
  const uint64_t checksum = portable::SplitMix64(HeaderWordsSum(w) + read(&status->payload_sum));
  w[kChecksumWord] = static_cast<uint32_t>(checksum);
  w[kChecksumWord + 1] = static_cast<uint32_t>(checksum >> 32);
  for (int j = 0; j < kHeaderWords; ++j) out[j] = w[j];
}

// The DecodeFailure bits of the buffer at `buffer` (`capacity` bytes) whose payload's checksum
// terms sum to `payload_sum`: its header words against `expected` where bit j of `known` is
// set, its flags, its payload size against the capacity, its checksum; kFailLost alone where
// status->placement says the encoding was placed nowhere (CheckBuffer in kernels.h).
__device__ __forceinline__ uint64_t BufferFailures(const uint32_t* buffer, uint64_t capacity,
                                                   const HeaderWords& expected, uint32_t known,
                                                   uint64_t payload_sum,
                                                   const DeviceStatus* status) {
  uint64_t failures = 0;
  uint32_t w[kHeaderWords];
  for (int j = 0; j < kHeaderWords; ++j) w[j] = buffer[j];
  for (int j = 0; j < kChecksumWord; ++j) {
    // The flags (the high half of word 2) are checked on their own below.
    const uint32_t mask = j == kFlagsWord ? 0xffffu : 0xffffffffu;
    if ((known >> j & 1u) != 0 && ((w[j] ^ expected.w[j]) & mask) != 0) failures |= kFailHeader;
  }
  const uint32_t flags = w[kFlagsWord] >> 16;
  if ((flags & ~kFlagUnrepresentable) != 0) failures |= kFailHeader;
  if ((flags & kFlagUnrepresentable) != 0) failures |= kFailUnrepresentable;
  if (Words64(w + kPayloadSizeWord) > capacity - kHeaderWords * 4) failures |= kFailHeader;
  const uint64_t checksum = portable::SplitMix64(HeaderWordsSum(w) + payload_sum);
  if (checksum != Words64(w + kChecksumWord)) failures |= kFailChecksum;
  // An encoding PlaceDeferred placed nowhere: the buffer holds no bytes of it, so what the
  // checks above found says nothing more.
  if (PlacedNowhere(status)) failures = kFailLost;
  return failures;
}

// What a launch that writes a whole buffer (an encode) or reads one (a decode) does in its last
// block, so that no other launch need: an encode writes the header at `header_at` from the
// host's `header` (WriteFinalHeader), a decode checks the buffer (BufferFailures against the
// words `header` expected where `known`, the payload's sum in status->decode_sum) and leaves the
// failures in status->failures.
struct LaunchClosing {
  HeaderWords header;
  uint32_t known;      // decode: the header words the host knows
  uint64_t capacity;   // decode: the buffer's bytes
  uint32_t* header_at; // the buffer's header
  bool decode;
};

// A codec's part in closing a launch: nothing.
struct NoCodecClosing {
  __device__ uint64_t operator()(DeviceStatus*) const { return 0; }
};

// Called by every thread of every block after the block's sums went into *status (the
// payload's checksum terms into payload_sum for an encode, decode_sum for a decode).
// `codec_closing(status)` runs first in the last block: an encode's decides what the codec
// takes from every block's sums (into status->params and the counts, before the header is
// written); a decode's returns the failures of the codec's own checks of the buffer.
template <typename CodecClosing = NoCodecClosing>
__device__ __forceinline__ void CloseLaunch(const LaunchClosing& closing, DeviceStatus* status,
                                            CodecClosing codec_closing = {}) {
  if (!LastBlockToFinish(status) || threadIdx.x != 0) return;
  const uint64_t own = codec_closing(status);
  if (closing.decode) {
    uint64_t failures =
        BufferFailures(closing.header_at, closing.capacity, closing.header, closing.known,
                       AtomicRead(&status->decode_sum), status);
    // A buffer that holds none of the encoding says nothing more (BufferFailures).
    if (!PlacedNowhere(status)) failures |= own;
    atomicExch(&status->failures, static_cast<unsigned long long>(failures));
    if ((closing.known & kKnownKeepsSum) == 0) {
      atomicExch(&status->decode_sum, 0ull);  // the next decode of the same buffer sums afresh
    }
  } else {
    WriteFinalHeader(closing.header, false, status, closing.header_at, true);
  }
}

// The closing of an encode whose header goes at `out`, and of a decode of `check`'s buffer.
inline LaunchClosing EncodeClosing(const HeaderWords& header, uint8_t* out) {
  return LaunchClosing{header, 0, 0, reinterpret_cast<uint32_t*>(out), false};
}
inline LaunchClosing DecodeClosing(const uint8_t* buffer, uint64_t capacity,
                                   const HeaderWords& expected, uint32_t known) {
  return LaunchClosing{expected, known, capacity,
                       reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(buffer)), true};
}

// log2(32 / bits) for codes of 1, 2, 4 or 8 bits: a code's word is its index >> this (a shift
// where 32 / bits, not a constant, would be a division).
__device__ __forceinline__ uint32_t WordShift(uint32_t bits) {
  return bits == 1 ? 5u : bits == 2 ? 4u : bits == 4 ? 3u : 2u;
}

// Values of kind K in a 16-byte vector: 4 float32, 8 float16 or bfloat16.
template <int K>
constexpr uint32_t kValuesPerVector = K == elements::kF32 ? 4 : 8;

// A vector's codes (at most 8 bits each): 32 bits for 4 float32 values, 64 for 8 16-bit ones.
template <int K>
using CodesOf = std::conditional_t<K == elements::kF32, uint32_t, uint64_t>;

// The code words of a group of vectors that kLanes lanes (a warp, or each half of one) hold,
// written coalesced and summed into the checksum: lane j's vector of row t (the group's vector
// j + kLanes t, of `vectors`) has `vector_bits` codes (4 to 64), its first at bit
// j * vector_bits of the group's codes from word `first_word` on. Made once per kernel,
// Start-ed per group. Below 32 bits a word holds the codes of lanes_per_word neighbouring lanes,
// ORed across them by shuffles and written by the first; their checksum terms and the group's
// parameter word's are then hashed at once, a word a lane (one 64-bit mix per lane, where each
// word and the parameter word took a round of the warp). From 32 bits on a lane writes and
// hashes its own. Every lane of the warp calls Put and Sum (their shuffles take the full warp).
template <int K, uint32_t kRows, uint32_t kLanes = 32>
class GroupCodeWords {
  static_assert(kLanes == 16 || kLanes == 32, "a warp or a half-warp a group");

 public:
  __device__ explicit GroupCodeWords(uint32_t vector_bits)
      : lane_(threadIdx.x & (kLanes - 1)),
        first_lane_(threadIdx.x & 31 & ~(kLanes - 1)),
        vector_bits_(vector_bits),
        lanes_per_word_(vector_bits < 32 ? 32 / vector_bits : 1) {}  // a power of two

  // A group of `vectors` (0: these lanes have none) whose first code word is payload word
  // `first_word`.
  __device__ void Start(uint64_t first_word, uint32_t vectors) {
    first_word_ = first_word;
    vectors_ = vectors;
    words_ = vector_bits_ < 32 ? (vectors * vector_bits_ + 31) >> 5 : kLanes;
  }

  // This lane's codes of row t (0 where its vector is past the group's); t is the same in
  // every lane.
  __device__ void Put(uint32_t t, CodesOf<K> codes, uint32_t* __restrict__ payload,
                      uint64_t* checksum) {
    const uint32_t j = lane_ + kLanes * t;
    const uint64_t index = first_word_ + ((uint64_t{j} * vector_bits_) >> 5);
    if (vector_bits_ >= 32) {
      if (j < vectors_) {  // whole words of this lane's own
        ACTPACK_UNROLL
        for (uint32_t q = 0; q < sizeof(CodesOf<K>) / 4; ++q) {
          if (32 * q < vector_bits_) {
            const uint32_t word = static_cast<uint32_t>(uint64_t{codes} >> (32 * q));
            payload[index + q] = word;
            *checksum += portable::ChecksumTerm(word, index + q);
          }
        }
      }
    } else {  // a word of lanes_per_word lanes
      uint32_t word = static_cast<uint32_t>(codes) << ((j & (lanes_per_word_ - 1)) * vector_bits_);
      for (uint32_t offset = 1; offset < lanes_per_word_; offset *= 2) {
        word |= __shfl_xor_sync(0xffffffffu, word, offset);
      }
      row_word_[t] = word;
      if (j < vectors_ && (j & (lanes_per_word_ - 1)) == 0) payload[index] = word;
    }
  }

  // After the last row: the shared words' terms and the parameter word's (`param`, at payload
  // word `param_index`), which takes the lane after the last word, or the group's first lane
  // apart where the words fill its lanes.
  __device__ void Sum(uint32_t param, uint64_t param_index, uint64_t* checksum) const {
    if (vector_bits_ < 32) {
      // Word m of the group is row (m * lanes_per_word) / kLanes's at lane
      // (m * lanes_per_word) mod kLanes, and lane m takes its term.
      const uint32_t from = lane_ * lanes_per_word_;
      uint32_t mine = param;
      ACTPACK_UNROLL
      for (uint32_t t = 0; t < kRows; ++t) {
        const uint32_t shared =
            __shfl_sync(0xffffffffu, row_word_[t], first_lane_ | (from & (kLanes - 1)));
        if (lane_ < words_ && from / kLanes == t) mine = shared;
      }
      if (vectors_ > 0 && lane_ <= words_) {
        *checksum += portable::ChecksumTerm(mine, lane_ < words_ ? first_word_ + lane_ : param_index);
      }
    }
    if (vectors_ > 0 && words_ == kLanes && lane_ == 0) {
      *checksum += portable::ChecksumTerm(param, param_index);
    }
  }

 private:
  uint32_t lane_, first_lane_, vector_bits_, lanes_per_word_;
  uint32_t vectors_ = 0, words_ = 0;
  uint64_t first_word_ = 0;
  uint32_t row_word_[kRows] = {};  // row t's word, as the lanes sharing it hold it (Put)
};

// Element e of a 16-byte vector of kind K as float.
template <int K>
__device__ __forceinline__ float VectorElement(const uint4& v, uint32_t e) {
  const uint32_t w = K == elements::kF32 ? e : e / 2;
  const uint32_t word = w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
  if constexpr (K == elements::kF32) {
    return portable::BitsToFloat(word);
  } else {
    const uint16_t half = static_cast<uint16_t>((e & 1) != 0 ? word >> 16 : word & 0xffffu);
    return K == elements::kF16 ? portable::HalfToFloat(half) : portable::Bf16ToFloat(half);
  }
}

// The range of a 16-byte vector's values as `of` maps them (fminf/fmaxf: one instruction each)
// and their largest magnitude's bits, a NaN's above an infinity's: below 0x7f800000 every one
// is finite and the range holds them all (so a vector with none else, nearly every one, needs
// no test of each value); at or above, the range is not to be used.
struct VectorRange {
  float lo, hi;
  uint32_t magnitude;
};

template <int K, typename Of>
__device__ __forceinline__ VectorRange RangeOf(const uint4& v, Of of) {
  const float first = of(VectorElement<K>(v, 0));
  VectorRange r{first, first, portable::FloatBits(first) & 0x7fffffffu};
  ACTPACK_UNROLL
  for (uint32_t e = 1; e < kValuesPerVector<K>; ++e) {
    const float x = of(VectorElement<K>(v, e));
    r.lo = fminf(r.lo, x);
    r.hi = fmaxf(r.hi, x);
    const uint32_t bits = portable::FloatBits(x) & 0x7fffffffu;
    r.magnitude = bits > r.magnitude ? bits : r.magnitude;
  }
  return r;
}

// The vector of kind K holding `values` (elements::Store's rounding).
template <int K>
__device__ __forceinline__ uint4 PackVector(const float* values) {
  uint32_t w[4];
  for (int j = 0; j < 4; ++j) {
    if constexpr (K == elements::kF32) {
      w[j] = portable::FloatBits(values[j]);
    } else if constexpr (K == elements::kF16) {
      w[j] = portable::FloatToHalf(values[2 * j]) |
             static_cast<uint32_t>(portable::FloatToHalf(values[2 * j + 1])) << 16;
    } else {
      w[j] = portable::FloatToBf16(values[2 * j]) |
             static_cast<uint32_t>(portable::FloatToBf16(values[2 * j + 1])) << 16;
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// The most blocks of a grid-stride launch: 2048, two to four waves of 256-thread blocks on an
// H100 (132 SMs, 4 to 8 resident each), so that each warp of a large launch takes several items
// and its fixed work (its sums into the status, the launch's closing) is shared among them.
// ACTPACK_CUDA_MAX_GRID_BLOCKS (an integer in [1, 2048]) lowers it: tests run every kernel's
// grid-stride wrap on small tensors with it.
int MaxGridBlocks();

// Blocks for a grid-stride loop over `work_items` items, `per_block` per block per pass.
inline int BlocksFor(uint64_t work_items, int per_block) {
  return static_cast<int>(std::max<uint64_t>(
      1, std::min<uint64_t>(MaxGridBlocks(), (work_items + per_block - 1) / per_block)));
}

}  // namespace actpack::codecs::cuda

#endif  // ACTPACK_CODECS_CUDA_DEVICE_OPS_CUH_

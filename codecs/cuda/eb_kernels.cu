// CUDA kernels of the `eb` codec. They write exactly the payload of the CPU reference (eb.cc):
// every code, predictor choice, header word and packed word comes from eb_math.h. Atomics sum
// counters and failure bits, carry the encode's look-back state, and OR a block's values into
// its packed words, whose bits no two values share (so the order of the ORs changes nothing).
//
// Encode, with nothing read back by the host: EbRangeKernel (relative mode) and
// EbQuantizerKernel put the quantizer in the call's DeviceStatus, then
//  1. EbEncodeKernel, one pass over the input, a thread block per chunk of 32 blocks: its four
//     warps quantize their blocks into shared memory (4 slots per lane), OR-reduce each
//     predictor's ZigZag residuals and choose (ChooseBlock); warp 0 finds where the chunk's
//     data starts by a decoupled look-back over the chunks before it (the scratch holds each
//     chunk's sums, then its prefix), writes the chunk index entry and the block headers; the
//     warps pack the chosen residuals (or the raw bits) there. The last chunk writes the totals.
//  2. EbOutlierKernel, a warp per chunk that has outliers (none, usually): its blocks quantized
//     again, their outliers listed in slot order (a warp scan of per-lane counts) once the
//     totals place the outlier section.
//  Then the checksum over the finished payload, whose size the last chunk left in the status.
// Decode: EbValidateKernel (warp per chunk: header words, block sizes against the chunk index)
// and EbValidateOutliersKernel (thread per outlier) set failure bits; only when none is set
// (nor one of the buffer's check before them), EbDecodeKernel (warp per chunk: unpack, inverse
// prediction as prefix sums, in registers and a warp scan for 1-D blocks, in shared memory for
// 2-D tiles, dequantize) and EbScatterKernel (thread per outlier) write the output. What the encode's data decided (the half-bin, the data words, the
// outliers) comes from the host's header, or, for an encoding the host has not resolved, from
// the encode's status on the device (ValuesOf): the grids are then sized from the shape, the
// outlier kernels loop over the count the status gives, and every kernel clamps that count
// and the payload's size to the most the shape allows, so a corrupt status reads nothing past
// the payload.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/eb_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::cuda {
namespace {

using eb_math::Layout;
using eb_math::Quantizer;
using eb_math::Tile;

// A loop nvcc unrolls whole (its trip count is a constant).
#if defined(__CUDACC__)
#define EB_UNROLL _Pragma("unroll")
#else
#define EB_UNROLL
#endif

constexpr int kWarps = 4;  // warps per thread block
constexpr unsigned kFullMask = 0xffffffffu;
constexpr uint32_t kSlotsPerLane = eb_math::kBlockValues / 32;

// Shared memory of one warp: a tile's codes in the padded layout (slot r * tile_cols + c),
// and the values to pack in the dense layout (value r * tile.cols + c).
struct WarpTile {
  int32_t k[eb_math::kBlockValues];
  uint32_t v[eb_math::kBlockValues];
};

__device__ __forceinline__ uint32_t WarpOr(uint32_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v |= __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ uint32_t WarpSum(uint32_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ int32_t WarpMin(int32_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v = min(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

__device__ __forceinline__ int32_t WarpMax(int32_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v = max(v, __shfl_xor_sync(kFullMask, v, offset));
  return v;
}

// Inclusive prefix sum over the warp's lanes (wrapping).
__device__ __forceinline__ uint32_t WarpInclusiveScan(uint32_t v, int lane) {
  for (int offset = 1; offset < 32; offset *= 2) {
    const uint32_t other = __shfl_up_sync(kFullMask, v, offset);
    if (lane >= offset) v += other;
  }
  return v;
}

__host__ __device__ __forceinline__ uint64_t Min64(uint64_t a, uint64_t b) { return a < b ? a : b; }

__device__ __forceinline__ uint64_t ReadU64(const uint32_t* words, uint64_t i) {
  return words[2 * i] | static_cast<uint64_t>(words[2 * i + 1]) << 32;
}

__device__ __forceinline__ void WriteU64(uint32_t* words, uint64_t i, uint64_t value) {
  words[2 * i] = static_cast<uint32_t>(value);
  words[2 * i + 1] = static_cast<uint32_t>(value >> 32);
}

// Slot `s` of the padded tile: its row and column, and whether it holds a value.
struct Slot {
  uint32_t r, c;
  bool real;
};

__device__ __forceinline__ Slot SlotOf(const Layout& l, const Tile& t, uint32_t s) {
  const uint32_t r = s / l.tile_cols;
  const uint32_t c = s - r * l.tile_cols;
  return Slot{r, c, r < t.rows && c < t.cols};
}

// What a warp knows about a quantized block.
struct BlockState {
  Tile tile;
  uint32_t outlier_bits;  // this lane's slots that are outliers (bit j: slot 4 * lane + j)
  eb_math::BlockChoice choice;
};

// Quantizes block b into the warp's tile (codes of padded slots are 0) and chooses its
// predictor as eb.cc does. Ends with the tile's codes visible to the whole warp.
template <int K>
__device__ BlockState PlanBlock(const void* __restrict__ input, const Layout& l,
                                const Quantizer& qz, uint64_t b, int32_t* __restrict__ k,
                                int lane) {
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  BlockState state;
  state.tile = eb_math::TileOf(l, b);
  const Tile& t = state.tile;
  state.outlier_bits = 0;
  int32_t lo = eb_math::kMaxCode, hi = -eb_math::kMaxCode;
  for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
    const uint32_t s = kSlotsPerLane * lane + j;
    const Slot slot = SlotOf(l, t, s);
    int32_t code = 0;
    if (slot.real) {
      const float x = elements::Load<K>(input, t.origin + slot.r * l.cols + slot.c);
      if (!eb_math::Quantize<K>(x, qz, &code)) state.outlier_bits |= 1u << j;
      lo = min(lo, code);
      hi = max(hi, code);
    }
    k[s] = code;
  }
  __syncwarp();
  lo = WarpMin(lo);
  hi = WarpMax(hi);
  const int32_t mid = eb_math::MidCode(lo, hi);
  const int32_t first = k[0];
  uint32_t or_offset = 0, or_row = 0, or_lorenzo = 0;
  for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
    const Slot slot = SlotOf(l, t, kSlotsPerLane * lane + j);
    if (!slot.real) continue;
    or_offset |= eb_math::ZigZag(
        eb_math::Residual(eb_math::kOffset, k, l.tile_cols, slot.r, slot.c, mid));
    or_row |= eb_math::ZigZag(
        eb_math::Residual(eb_math::kRow, k, l.tile_cols, slot.r, slot.c, first));
    or_lorenzo |= eb_math::ZigZag(
        eb_math::Residual(eb_math::kLorenzo, k, l.tile_cols, slot.r, slot.c, first));
  }
  const uint32_t outliers = WarpSum(__popc(state.outlier_bits));
  state.choice = eb_math::ChooseBlock(WarpOr(or_offset), WarpOr(or_row), WarpOr(or_lorenzo), mid,
                                      first, outliers, t.count, kBytes);
  return state;
}

// The value of 16 bits `bits` of element kind K.
template <int K>
__device__ __forceinline__ float HalfBitsToFloat(uint32_t bits) {
  if constexpr (K == elements::kF16) {
    return portable::HalfToFloat(static_cast<uint16_t>(bits));
  } else {
    return portable::Bf16ToFloat(static_cast<uint16_t>(bits));
  }
}

// Elements i .. i + 3 of the input, the first n of them (0 for the rest): one 16-byte load
// (float) or 8-byte load (16-bit kinds) when `aligned` (the input is aligned to that width and
// i is a multiple of 4) and n >= 4; else one element at a time.
template <int K>
__device__ __forceinline__ void LoadFour(const void* __restrict__ input, uint64_t i, uint32_t n,
                                         bool aligned, float* x) {
  if (aligned && n >= 4) {
    if constexpr (K == elements::kF32) {
      const float4 v = *reinterpret_cast<const float4*>(static_cast<const float*>(input) + i);
      x[0] = v.x;
      x[1] = v.y;
      x[2] = v.z;
      x[3] = v.w;
    } else {
      const uint2 v = *reinterpret_cast<const uint2*>(static_cast<const uint16_t*>(input) + i);
      x[0] = HalfBitsToFloat<K>(v.x & 0xffffu);
      x[1] = HalfBitsToFloat<K>(v.x >> 16);
      x[2] = HalfBitsToFloat<K>(v.y & 0xffffu);
      x[3] = HalfBitsToFloat<K>(v.y >> 16);
    }
    return;
  }
  for (uint32_t j = 0; j < 4; ++j) x[j] = j < n ? elements::Load<K>(input, i + j) : 0.0f;
}

// PlanBlock's choice for a 1-D block (a run of up to 128 consecutive values, tile_rows = 1),
// with the same codes in the tile: lane i holds values 4i .. 4i + 3, loaded at once (LoadFour),
// and the row predictor's left neighbour of its first comes from the lane before. In one row
// 2-D Lorenzo's residuals are the row predictor's, so its OR is the row's.
template <int K>
__device__ eb_math::BlockChoice PlanRun(const void* __restrict__ input, const Layout& l,
                                        const Quantizer& qz, uint64_t b, bool aligned,
                                        int32_t* __restrict__ k, int lane) {
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  const uint64_t origin = b * eb_math::kBlockValues;
  const uint32_t count = static_cast<uint32_t>(Min64(l.cols - origin, eb_math::kBlockValues));
  const uint32_t s0 = kSlotsPerLane * lane;
  float x[kSlotsPerLane];
  LoadFour<K>(input, origin + s0, count > s0 ? count - s0 : 0u, aligned, x);
  int32_t code[kSlotsPerLane];
  uint32_t outliers = 0;
  int32_t lo = eb_math::kMaxCode, hi = -eb_math::kMaxCode;
  EB_UNROLL
  for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
    code[j] = 0;
    if (s0 + j < count) {
      if (!eb_math::Quantize<K>(x[j], qz, &code[j])) ++outliers;
      lo = min(lo, code[j]);
      hi = max(hi, code[j]);
    }
    k[s0 + j] = code[j];
  }
  lo = WarpMin(lo);
  hi = WarpMax(hi);
  const int32_t mid = eb_math::MidCode(lo, hi);
  const int32_t before = __shfl_up_sync(kFullMask, code[kSlotsPerLane - 1], 1);
  uint32_t or_offset = 0, or_row = 0;
  EB_UNROLL
  for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
    const uint32_t here = static_cast<uint32_t>(code[j]);
    const uint32_t left = static_cast<uint32_t>(j > 0 ? code[j - 1] : before);
    if (s0 + j < count) {
      or_offset |= eb_math::ZigZag(static_cast<int32_t>(here - static_cast<uint32_t>(mid)));
      or_row |= eb_math::ZigZag(s0 + j > 0 ? static_cast<int32_t>(here - left) : 0);
    }
  }
  __syncwarp();  // the tile's codes, for the packing
  const int32_t first = __shfl_sync(kFullMask, code[0], 0);
  or_row = WarpOr(or_row);
  return eb_math::ChooseBlock(WarpOr(or_offset), or_row, or_row, mid, first, WarpSum(outliers),
                              count, kBytes);
}

// DeviceStatus::work words of the encode.
constexpr int kMaxKeyWord = 0;           // the range's largest ordered key
constexpr int kMaxInvertedKeyWord = 1;   // ... and its smallest (inverted)
constexpr int kFiniteWord = 2;           // the count of finite values
constexpr int kQuantizerWord = 3;        // half bin (low half) and bin (high half)
constexpr int kBoundWord = 4;            // the bound (low half)
constexpr int kDataWordsWord = 5;        // the payload's block data words

// The quantizer EbQuantizerKernel left in the status.
__device__ __forceinline__ Quantizer QuantizerOf(const DeviceStatus* status) {
  const unsigned long long q = status->work[kQuantizerWord];
  return Quantizer{portable::BitsToFloat(static_cast<uint32_t>(q)),
                   portable::BitsToFloat(static_cast<uint32_t>(q >> 32)),
                   portable::BitsToFloat(static_cast<uint32_t>(status->work[kBoundWord]))};
}

// The payload's sections once EbScanKernel has counted the data words and outliers.
__device__ __forceinline__ eb_math::Sections SectionsOf(const Layout& l,
                                                        const DeviceStatus* status) {
  const uint64_t outliers = status->params[4] | static_cast<uint64_t>(status->params[5]) << 32;
  return eb_math::SectionsOf(l, status->work[kDataWordsWord], outliers);
}

// ---- the encode's single pass ----
//
// A thread block per chunk (grid-stride): its warps plan the chunk's blocks (codes in shared
// memory), warp 0 sums their sizes and finds where the chunk starts by looking back at the
// chunks before it, then the warps pack the blocks there. Each chunk's look-back state is two
// words of the scratch, its data words and its outliers, each (value << 2) | flag: flag 0
// nothing yet, kAggregate the chunk's own sums, kPrefix the sums of the chunks up to it. The
// state is zeroed before the launch. A chunk's state is published as soon as its sums are known
// and its prefix as soon as its look-back ends, so the look-back usually stops at the chunk
// before it. A chunk whose state is still empty after kLookBackSpins reads is planned again by
// the looking warp (the same sums come out) and published for later look-backs: no block waits
// for one that is not running, so no order in which blocks run, nor how many are resident at
// once, can hang the scan.
constexpr unsigned long long kAggregate = 1;
constexpr unsigned long long kPrefix = 2;
constexpr int kLookBackSpins = 256;
constexpr uint32_t kBlocksPerWarp = eb_math::kBlocksPerChunk / kWarps;

struct ChunkSums {
  uint64_t words;
  uint64_t outliers;
};

// A word of the look-back state, read atomically (it is written by other blocks meanwhile).
__device__ __forceinline__ uint64_t LoadState(unsigned long long* word) {
  return atomicAdd(word, 0ull);
}

// The flag both words of a chunk's state carry (0 while they differ: one is being written).
__device__ __forceinline__ uint64_t FlagOf(uint64_t words_state, uint64_t outliers_state) {
  return (words_state & 3u) == (outliers_state & 3u) ? words_state & 3u : 0u;
}

__device__ __forceinline__ uint64_t WarpSum64(uint64_t v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// The sums of chunk c, planned by one warp with the tile `k` (what the chunk's own block
// computes).
template <int K>
__device__ ChunkSums PlanChunk(const void* __restrict__ input, const Layout& l,
                               const Quantizer& qz, uint64_t c, int32_t* __restrict__ k,
                               int lane) {
  ChunkSums sums{0, 0};
  const uint64_t first = c * eb_math::kBlocksPerChunk;
  const uint64_t last = Min64(l.blocks, first + eb_math::kBlocksPerChunk);
  for (uint64_t b = first; b < last; ++b) {
    const BlockState state = PlanBlock<K>(input, l, qz, b, k, lane);
    sums.words += state.choice.data_words;
    sums.outliers += state.choice.outliers;
    __syncwarp();  // the tile is rewritten by the next block
  }
  return sums;
}

// Warp 0 of chunk c's block: the sums of the chunks before c. Reads the states of up to 32
// chunks at once (lane i: chunk j - i) and adds them up to the nearest prefix; a chunk with no
// state yet is waited for kLookBackSpins reads, then planned here with the tile `k`.
template <int K>
__device__ ChunkSums LookBack(const void* __restrict__ input, const Layout& l,
                              const Quantizer& qz, uint64_t c,
                              unsigned long long* __restrict__ state, int32_t* __restrict__ k,
                              int lane) {
  ChunkSums before{0, 0};
  uint64_t j = c;  // the chunks [0, j) are still to add
  while (j > 0) {
    uint64_t words = kPrefix, outliers = kPrefix;  // before chunk 0: a prefix of 0
    if (static_cast<uint64_t>(lane) < j) {
      words = LoadState(&state[2 * (j - 1 - lane)]);
      outliers = LoadState(&state[2 * (j - 1 - lane) + 1]);
    }
    const uint64_t flag = FlagOf(words, outliers);
    const unsigned prefixes = __ballot_sync(kFullMask, flag == kPrefix);
    const unsigned missing = __ballot_sync(kFullMask, flag == 0);
    const int first_prefix = prefixes != 0 ? __ffs(prefixes) - 1 : 32;
    const int first_missing = missing != 0 ? __ffs(missing) - 1 : 32;
    // Lanes [0, take) are added: up to the first prefix, or the chunks before a missing one.
    const int take = first_prefix < first_missing ? first_prefix + 1 : first_missing;
    before.words += WarpSum64(lane < take ? words >> 2 : 0);
    before.outliers += WarpSum64(lane < take ? outliers >> 2 : 0);
    if (first_prefix < first_missing) break;
    j -= take;
    if (first_missing == 32) continue;  // 32 aggregates: the next window
    // Chunk j - 1 has no state yet: wait for it a while, then plan it. Lane 0 waits and the warp
    // takes what it saw: lanes reading the state themselves can see different values while the
    // chunk's block publishes it, and would part ways before the warp's next collective.
    const uint64_t m = j - 1;
    uint64_t flag_m = 0;
    if (lane == 0) {
      for (int spin = 0; spin < kLookBackSpins && flag_m == 0; ++spin) {
        words = LoadState(&state[2 * m]);
        outliers = LoadState(&state[2 * m + 1]);
        flag_m = FlagOf(words, outliers);
      }
    }
    words = __shfl_sync(kFullMask, words, 0);
    outliers = __shfl_sync(kFullMask, outliers, 0);
    flag_m = FlagOf(words, outliers);
    if (flag_m == 0) {
      const ChunkSums sums = PlanChunk<K>(input, l, qz, m, k, lane);
      words = sums.words << 2 | kAggregate;
      outliers = sums.outliers << 2 | kAggregate;
      if (lane == 0) {  // for later look-backs, unless its block has written it meanwhile
        atomicCAS(&state[2 * m], 0ull, static_cast<unsigned long long>(words));
        atomicCAS(&state[2 * m + 1], 0ull, static_cast<unsigned long long>(outliers));
      }
      flag_m = kAggregate;
    }
    before.words += words >> 2;
    before.outliers += outliers >> 2;
    j = m;
    if (flag_m == kPrefix) break;
  }
  return before;
}

// ORs `value` (< 2^width, width <= 32) into the words at bit `bit`.
__device__ __forceinline__ void OrBits(uint32_t* words, uint32_t value, uint32_t bit,
                                       uint32_t width) {
  if (value == 0) return;
  const uint32_t shift = bit % 32;
  atomicOr(&words[bit / 32], value << shift);
  if (shift + width > 32) atomicOr(&words[bit / 32 + 1], value >> (32 - shift));
}

template <int K>
__global__ void __launch_bounds__(kWarps * 32)
    EbEncodeKernel(const void* __restrict__ input, Layout l, bool aligned,
                   DeviceStatus* __restrict__ status, uint32_t* __restrict__ words,
                   unsigned long long* __restrict__ state) {
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  __shared__ int32_t codes[eb_math::kBlocksPerChunk][eb_math::kBlockValues];
  __shared__ uint32_t packed[kWarps][eb_math::kBlockValues];
  __shared__ int32_t spare[eb_math::kBlockValues];  // the look-back's tile
  __shared__ uint32_t headers[eb_math::kBlocksPerChunk];
  __shared__ uint32_t sizes[eb_math::kBlocksPerChunk];  // data words; then where each starts
  __shared__ uint32_t listed[eb_math::kBlocksPerChunk];  // outliers
  __shared__ uint64_t chunk_start;  // data words before the chunk
  const Quantizer qz = QuantizerOf(status);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  uint32_t* pack = packed[warp];
  for (uint32_t t = lane; t < eb_math::kBlockValues; t += 32) pack[t] = 0;
  uint32_t* index = words + eb_math::SectionsOf(l, 0, 0).index;
  uint32_t* data = words + eb_math::SectionsOf(l, 0, 0).data;
  for (uint64_t c = blockIdx.x; c < l.chunks; c += gridDim.x) {
    const uint64_t first = c * eb_math::kBlocksPerChunk;
    const uint32_t blocks = static_cast<uint32_t>(Min64(l.blocks - first, 32));
    // 1. Plan: each warp its blocks of the chunk, codes kept for the packing.
    for (uint32_t bi = warp * kBlocksPerWarp; bi < (warp + 1) * kBlocksPerWarp; ++bi) {
      if (bi >= blocks) break;
      const eb_math::BlockChoice choice =
          l.tile_rows == 1 ? PlanRun<K>(input, l, qz, first + bi, aligned, codes[bi], lane)
                           : PlanBlock<K>(input, l, qz, first + bi, codes[bi], lane).choice;
      if (lane == 0) {
        headers[bi] = choice.header;
        sizes[bi] = choice.data_words;
        listed[bi] = choice.outliers;
      }
    }
    __syncthreads();
    // 2. Warp 0: where the blocks start in the chunk, the chunk's sums published, the look-back,
    //    the chunk's prefix published, its index entry and block headers written.
    if (warp == 0) {
      const uint32_t size = static_cast<uint32_t>(lane) < blocks ? sizes[lane] : 0u;
      const uint32_t count = static_cast<uint32_t>(lane) < blocks ? listed[lane] : 0u;
      const uint32_t end = WarpInclusiveScan(size, lane);
      const uint32_t chunk_words = __shfl_sync(kFullMask, end, 31);
      const uint32_t chunk_outliers = WarpSum(count);
      if (lane == 0 && c > 0) {
        atomicExch(&state[2 * c], static_cast<unsigned long long>(chunk_words) << 2 | kAggregate);
        atomicExch(&state[2 * c + 1],
                   static_cast<unsigned long long>(chunk_outliers) << 2 | kAggregate);
      }
      const ChunkSums before = LookBack<K>(input, l, qz, c, state, spare, lane);
      if (lane == 0) {
        atomicExch(&state[2 * c],
                   static_cast<unsigned long long>((before.words + chunk_words) << 2 | kPrefix));
        atomicExch(&state[2 * c + 1], static_cast<unsigned long long>(
                                          (before.outliers + chunk_outliers) << 2 | kPrefix));
        WriteU64(index, c, before.words);
        chunk_start = before.words;
        if (c + 1 == l.chunks) {  // the totals
          const uint64_t total_words = before.words + chunk_words;
          const uint64_t total_outliers = before.outliers + chunk_outliers;
          status->work[kDataWordsWord] = total_words;
          status->params[4] = static_cast<uint32_t>(total_outliers);
          status->params[5] = static_cast<uint32_t>(total_outliers >> 32);
          status->payload_bytes = 4 * eb_math::SectionsOf(l, total_words, total_outliers).end;
        }
      }
      if (static_cast<uint32_t>(lane) < blocks) {
        words[first + lane] = headers[lane];
        sizes[lane] = end - size;
      }
    }
    __syncthreads();
    // 3. Pack: each warp its blocks, the residuals of the chosen predictor (or the raw bits) ORed
    //    into the warp's words, which consecutive lanes store.
    for (uint32_t bi = warp * kBlocksPerWarp; bi < (warp + 1) * kBlocksPerWarp; ++bi) {
      if (bi >= blocks) break;
      const uint64_t b = first + bi;
      const uint32_t h = headers[bi];
      const uint32_t mode = eb_math::HeaderMode(h);
      const int32_t anchor = eb_math::HeaderAnchor(h);
      const uint32_t width = mode == eb_math::kVerbatim ? 8 * kBytes : eb_math::HeaderWidth(h);
      uint32_t count;
      if (l.tile_rows == 1) {  // a run: value s of the block is slot s, lane i has 4i .. 4i + 3
        const uint64_t origin = b * eb_math::kBlockValues;
        count = static_cast<uint32_t>(Min64(l.cols - origin, eb_math::kBlockValues));
        const uint32_t s0 = kSlotsPerLane * lane;
        if (mode == eb_math::kVerbatim) {
          for (uint32_t s = s0; s < s0 + kSlotsPerLane && s < count; ++s) {
            OrBits(pack, elements::LoadBits<kBytes>(input, origin + s), s * width, width);
          }
        } else {
          EB_UNROLL
          for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
            if (s0 + j >= count) break;
            const uint32_t value = eb_math::ZigZag(
                eb_math::Residual(mode, codes[bi], eb_math::kBlockValues, 0, s0 + j, anchor));
            OrBits(pack, value, (s0 + j) * width, width);
          }
        }
      } else {
        const Tile t = eb_math::TileOf(l, b);
        count = t.count;
        for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
          const Slot slot = SlotOf(l, t, kSlotsPerLane * lane + j);
          if (!slot.real) continue;
          const uint32_t value =
              mode == eb_math::kVerbatim
                  ? elements::LoadBits<kBytes>(input, t.origin + slot.r * l.cols + slot.c)
                  : eb_math::ZigZag(
                        eb_math::Residual(mode, codes[bi], l.tile_cols, slot.r, slot.c, anchor));
          OrBits(pack, value, (slot.r * t.cols + slot.c) * width, width);
        }
      }
      __syncwarp();
      const uint32_t n = eb_math::DataWords(h, count, kBytes);
      uint32_t* out = data + chunk_start + sizes[bi];
      for (uint32_t w = lane; w < n; w += 32) {
        out[w] = pack[w];
        pack[w] = 0;
      }
      __syncwarp();
    }
    __syncthreads();  // the chunk's shared words are rewritten by the next
  }
}

// A warp per chunk that has outliers (grid-stride): plans its blocks again and lists their
// outliers in slot order (a warp scan of per-lane counts), after the chunks before it.
template <int K>
__global__ void __launch_bounds__(kWarps * 32)
    EbOutlierKernel(const void* __restrict__ input, Layout l,
                    const DeviceStatus* __restrict__ status, uint32_t* __restrict__ words,
                    const unsigned long long* __restrict__ state) {
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  const Quantizer qz = QuantizerOf(status);
  const eb_math::Sections sections = SectionsOf(l, status);
  __shared__ WarpTile tiles[kWarps];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  int32_t* k = tiles[warp].k;
  uint32_t* slots = words + sections.slots;
  uint32_t* raw = words + sections.raw;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarps;
  for (uint64_t c = uint64_t{blockIdx.x} * kWarps + warp; c < l.chunks; c += warp_stride) {
    // The state holds every chunk's prefix now.
    uint64_t outlier = c > 0 ? state[2 * c - 1] >> 2 : 0;
    if (state[2 * c + 1] >> 2 == outlier) continue;
    const uint64_t first = c * eb_math::kBlocksPerChunk;
    const uint64_t last = Min64(l.blocks, first + eb_math::kBlocksPerChunk);
    for (uint64_t b = first; b < last; ++b) {
      const BlockState s = PlanBlock<K>(input, l, qz, b, k, lane);
      if (s.choice.outliers > 0) {
        const Tile& t = s.tile;
        const uint32_t mine = __popc(s.outlier_bits);
        uint64_t position = outlier + WarpInclusiveScan(mine, lane) - mine;
        for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
          if ((s.outlier_bits >> j & 1u) == 0) continue;
          const Slot slot = SlotOf(l, t, kSlotsPerLane * lane + j);
          const uint32_t i = slot.r * t.cols + slot.c;
          WriteU64(slots, position, b * eb_math::kBlockValues + i);
          raw[position] = elements::LoadBits<kBytes>(input, t.origin + slot.r * l.cols + slot.c);
          ++position;
        }
      }
      outlier += s.choice.outliers;
      __syncwarp();
    }
  }
}

// Order-preserving keys of finite floats, so that min and max reduce with integer atomics.
__device__ __forceinline__ uint32_t OrderedKey(float f) {
  const uint32_t bits = portable::FloatBits(f);
  return bits >> 31 ? ~bits : bits | 0x80000000u;
}

__host__ __device__ __forceinline__ float FromOrderedKey(uint32_t key) {
  return portable::BitsToFloat(key >> 31 ? key & 0x7fffffffu : ~key);
}

// Elements a thread loads per pass of the range.
constexpr int kRangeLoads = 4;

template <int K>
__global__ void EbRangeKernel(const void* __restrict__ input, uint64_t numel,
                              DeviceStatus* __restrict__ status) {
  uint64_t max_key = 0, max_inverted_key = 0, finite = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel;
       i += kRangeLoads * stride) {
    float v[kRangeLoads];
    for (int u = 0; u < kRangeLoads; ++u) {  // the loads first, all in flight at once
      const uint64_t at = i + u * stride;
      v[u] = at < numel ? elements::Load<K>(input, at) : portable::BitsToFloat(0x7fc00000u);
    }
    for (int u = 0; u < kRangeLoads; ++u) {
      if (!portable::IsFinite(v[u])) continue;  // NaN past the end
      const uint32_t key = OrderedKey(v[u]);
      max_key = key > max_key ? key : max_key;
      max_inverted_key = ~key > max_inverted_key ? ~key : max_inverted_key;
      ++finite;
    }
  }
  WarpMaxToGlobal(max_key, &status->work[kMaxKeyWord]);
  WarpMaxToGlobal(max_inverted_key, &status->work[kMaxInvertedKeyWord]);
  WarpSumToGlobal(finite, &status->work[kFiniteWord]);
}

// One thread: the quantizer from the range (relative mode) or the bound alone (absolute), into
// the status's work words and the header's parameter words 1 (half bin) and 2 (bound).
__global__ void EbQuantizerKernel(int mode, double value, DeviceStatus* __restrict__ status) {
  const uint64_t finite = status->work[kFiniteWord];
  const float lo = finite > 0
                       ? FromOrderedKey(~static_cast<uint32_t>(status->work[kMaxInvertedKeyWord]))
                       : portable::BitsToFloat(0x7f800000u);
  const float hi = finite > 0 ? FromOrderedKey(static_cast<uint32_t>(status->work[kMaxKeyWord]))
                              : portable::BitsToFloat(0xff800000u);
  const Quantizer qz = eb_math::QuantizerFor(mode, value, lo, hi, finite > 0);
  const uint32_t half_bin = portable::FloatBits(qz.half_bin);
  const uint32_t bound = portable::FloatBits(qz.bound);
  status->work[kQuantizerWord] = half_bin | uint64_t{portable::FloatBits(qz.bin)} << 32;
  status->work[kBoundWord] = bound;
  status->params[1] = half_bin;
  status->params[2] = bound;
}

// ---- decode ----

// What a decode reads of what the encode's data decided, and the failures the values earn.
struct EbValues {
  float half_bin;
  uint64_t data_words;
  uint64_t outliers;
  uint64_t failures;  // DecodeFailure bits: then no data words and no outliers are read
};

// The host's values, or the status's (params words 1, 2, 4..5 and payload_bytes, as the
// encode left them) checked as eb.cc's ReadParams and DecodePayload check a header's: a normal
// half-bin up to 2^100, a finite bound >= 0, the unused words 0 (else kFailParams), at most
// `max_outliers` outliers (else kFailEbOutlier), a whole number of words up to `max_bytes` that
// holds the fixed sections (else kFailParams).
__device__ __forceinline__ EbValues ValuesOf(const Layout& l, const EbPayload& p,
                                             const DeviceStatus* status) {
  if (!p.from_status) return EbValues{p.half_bin, p.data_words, p.outliers, 0};
  const uint32_t* params = status->params;
  const float half_bin = portable::BitsToFloat(params[1]);
  const float bound = portable::BitsToFloat(params[2]);
  const uint64_t outliers = params[4] | static_cast<uint64_t>(params[5]) << 32;
  const uint64_t bytes = status->payload_bytes;
  uint64_t failures = 0;
  if (!(half_bin >= eb_math::kMinNormal && half_bin <= eb_math::kMaxHalfBin) ||
      !(bound >= 0.0f && portable::IsFinite(bound)) || params[0] != 0 || params[3] != 0) {
    failures |= kFailParams;
  }
  if (outliers > p.max_outliers) failures |= kFailEbOutlier;
  const uint64_t fixed =
      eb_math::SectionsOf(l, 0, outliers > p.max_outliers ? 0 : outliers).fixed_words;
  if (bytes % 4 != 0 || bytes > p.max_bytes || bytes / 4 < fixed) failures |= kFailParams;
  if (failures != 0) return EbValues{half_bin, 0, 0, failures};
  return EbValues{half_bin, bytes / 4 - fixed, outliers, 0};
}

// Whether the buffer's header (the words before the payload, which its checksum covers) holds
// the values the status gives.
__device__ __forceinline__ bool StatusIsTheHeaders(const uint32_t* header,
                                                   const DeviceStatus* status) {
  bool same = header[kPayloadSizeWord] == static_cast<uint32_t>(status->payload_bytes) &&
              header[kPayloadSizeWord + 1] == static_cast<uint32_t>(status->payload_bytes >> 32);
  for (int j = 1; j < 6; ++j) same = same && header[kParamsWord + j] == status->params[j];
  return same;
}

template <int K>
__global__ void __launch_bounds__(kWarps * 32)
    EbValidateKernel(const uint32_t* __restrict__ words, Layout l, EbPayload p,
                     DeviceStatus* __restrict__ status) {
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  if (PlacedNowhere(status)) return;
  const EbValues v = ValuesOf(l, p, status);
  if (p.from_status && blockIdx.x == 0 && threadIdx.x == 0) {
    uint64_t bad = v.failures;
    if (bad == 0 && !StatusIsTheHeaders(words - kHeaderWords, status)) bad = kFailHeader;
    if (bad != 0) atomicOr(&status->failures, static_cast<unsigned long long>(bad));
  }
  if (v.failures != 0) return;
  const uint64_t data_words = v.data_words;
  const int lane = threadIdx.x & 31;
  const uint32_t* index = words + eb_math::SectionsOf(l, 0, 0).index;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarps;
  for (uint64_t c = uint64_t{blockIdx.x} * kWarps + threadIdx.x / 32; c < l.chunks;
       c += warp_stride) {
    const uint64_t b = c * eb_math::kBlocksPerChunk + lane;
    uint32_t size = 0, bad = 0;
    if (b < l.blocks) {
      const uint32_t h = words[b];
      if (eb_math::ValidHeader(h)) {
        size = eb_math::DataWords(h, eb_math::TileOf(l, b).count, kBytes);
      } else {
        bad = kFailEbBlockHeader;
      }
    }
    bad = WarpOr(bad);
    const uint64_t chunk_size = WarpSum(size);
    if (lane == 0) {
      const uint64_t start = ReadU64(index, c);
      const uint64_t next = c + 1 < l.chunks ? ReadU64(index, c + 1) : data_words;
      if ((c == 0 && start != 0) || start + chunk_size != next) bad |= kFailEbChunkIndex;
      if (bad != 0) atomicOr(&status->failures, static_cast<unsigned long long>(bad));
    }
  }
}

__global__ void EbValidateOutliersKernel(const uint32_t* __restrict__ words, Layout l,
                                         EbPayload p, uint32_t element_bytes,
                                         DeviceStatus* __restrict__ status) {
  if (PlacedNowhere(status)) return;
  const EbValues v = ValuesOf(l, p, status);
  const eb_math::Sections sections = eb_math::SectionsOf(l, v.data_words, v.outliers);
  const uint32_t* slots = words + sections.slots;
  const uint32_t* raw = words + sections.raw;
  const uint64_t outliers = v.outliers;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t j = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < outliers; j += stride) {
    const uint64_t slot = ReadU64(slots, j);
    const uint64_t b = slot / eb_math::kBlockValues;
    bool ok = j + 1 >= outliers || ReadU64(slots, j + 1) > slot;
    ok = ok && b < l.blocks && slot % eb_math::kBlockValues < eb_math::TileOf(l, b).count &&
         eb_math::HeaderMode(words[b]) != eb_math::kVerbatim;
    ok = ok && (element_bytes == 4 || raw[j] <= 0xffffu);
    if (!ok) atomicOr(&status->failures, static_cast<unsigned long long>(kFailEbOutlier));
  }
}

// Stores y[0 .. n) at elements i .. i + n - 1 of the output: one 16-byte store (float) or
// 8-byte store (16-bit kinds) when `aligned` (the output is aligned to that width and i is a
// multiple of 4) and n >= 4; else one element at a time.
template <int K>
__device__ __forceinline__ void StoreFour(void* __restrict__ output, uint64_t i, uint32_t n,
                                          bool aligned, const float* y) {
  if (aligned && n >= 4) {
    if constexpr (K == elements::kF32) {
      *reinterpret_cast<float4*>(static_cast<float*>(output) + i) =
          make_float4(y[0], y[1], y[2], y[3]);
    } else {
      uint32_t half[4];
      for (int j = 0; j < 4; ++j) {
        half[j] = K == elements::kF16 ? portable::FloatToHalf(y[j]) : portable::FloatToBf16(y[j]);
      }
      *reinterpret_cast<uint2*>(static_cast<uint16_t*>(output) + i) =
          make_uint2(half[0] | half[1] << 16, half[2] | half[3] << 16);
    }
    return;
  }
  for (uint32_t j = 0; j < n && j < 4; ++j) elements::Store<K>(output, i + j, y[j]);
}

// Decodes 1-D block b (a run of up to 128 values, tile_rows = 1) with header h and data words
// `data`, without shared memory: lane i unpacks values 4i .. 4i + 3, the row predictor's prefix
// sum (2-D Lorenzo's too, in one row) runs over its four and then over the lanes' totals (a
// warp scan), and the four are stored at once where the output allows (StoreFour).
template <int K>
__device__ __forceinline__ void DecodeRun(const uint32_t* __restrict__ data, uint32_t h,
                                          const Layout& l, uint64_t b, float half_bin,
                                          bool aligned, void* __restrict__ output, int lane) {
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  const uint64_t origin = b * eb_math::kBlockValues;
  const uint32_t count = static_cast<uint32_t>(Min64(l.cols - origin, eb_math::kBlockValues));
  const uint32_t s0 = kSlotsPerLane * lane;
  const uint32_t mine = count > s0 ? count - s0 : 0u;  // this lane's values
  const uint32_t mode = eb_math::HeaderMode(h);
  if (mode == eb_math::kVerbatim) {
    for (uint32_t s = s0; s < s0 + kSlotsPerLane && s < count; ++s) {
      const uint32_t bits = kBytes == 4 ? data[s] : (data[s / 2] >> (16 * (s % 2))) & 0xffffu;
      elements::StoreBits<kBytes>(output, origin + s, bits);
    }
    return;
  }
  const uint32_t width = eb_math::HeaderWidth(h);
  uint32_t v[kSlotsPerLane];
  EB_UNROLL
  for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
    v[j] = j < mine ? static_cast<uint32_t>(
                          eb_math::UnZigZag(eb_math::UnpackValue(data, s0 + j, width)))
                    : 0u;
  }
  if (mode != eb_math::kOffset) {  // coverage: every branch
    EB_UNROLL
    for (uint32_t j = 1; j < kSlotsPerLane; ++j) v[j] += v[j - 1];
    const uint32_t total = v[kSlotsPerLane - 1];
    const uint32_t carry = WarpInclusiveScan(total, lane) - total;
    EB_UNROLL
    for (uint32_t j = 0; j < kSlotsPerLane; ++j) v[j] += carry;
  }
  const uint32_t anchor = static_cast<uint32_t>(eb_math::HeaderAnchor(h));
  float y[kSlotsPerLane];
  EB_UNROLL
  for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
    y[j] = eb_math::Dequantize(static_cast<int32_t>(v[j] + anchor), half_bin);
  }
  StoreFour<K>(output, origin + s0, mine, aligned, y);
}

template <int K>
__global__ void __launch_bounds__(kWarps * 32)
    EbDecodeKernel(const uint32_t* __restrict__ words, Layout l, EbPayload p,
                   uint64_t data_start, bool aligned, const DeviceStatus* __restrict__ status,
                   void* __restrict__ output) {
  if (status->failures != 0) return;
  // EbValidateKernel has checked the status's half-bin (a failure there returned above).
  const float half_bin = p.from_status ? portable::BitsToFloat(status->params[1]) : p.half_bin;
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  __shared__ WarpTile tiles[kWarps];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  uint32_t* k = reinterpret_cast<uint32_t*>(tiles[warp].k);
  const uint32_t* index = words + eb_math::SectionsOf(l, 0, 0).index;
  const uint32_t tc = l.tile_cols;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarps;
  for (uint64_t c = uint64_t{blockIdx.x} * kWarps + warp; c < l.chunks; c += warp_stride) {
    // Each lane sizes one block of the chunk; a warp scan places them.
    const uint64_t first = c * eb_math::kBlocksPerChunk;
    const uint64_t mine = first + lane;
    const uint32_t header = mine < l.blocks ? words[mine] : 0u;
    const uint32_t size =
        mine < l.blocks ? eb_math::DataWords(header, eb_math::TileOf(l, mine).count, kBytes) : 0u;
    const uint32_t before = WarpInclusiveScan(size, lane) - size;
    const uint32_t* chunk_data = words + data_start + ReadU64(index, c);
    const uint32_t blocks = static_cast<uint32_t>(Min64(l.blocks - first, 32));
    for (uint32_t bi = 0; bi < blocks; ++bi) {
      const uint64_t b = first + bi;
      const uint32_t* data = chunk_data + __shfl_sync(kFullMask, before, bi);
      const uint32_t h = __shfl_sync(kFullMask, header, bi);
      if (l.tile_rows == 1) {
        DecodeRun<K>(data, h, l, b, half_bin, aligned, output, lane);
        continue;
      }
      const Tile t = eb_math::TileOf(l, b);
      const uint32_t mode = eb_math::HeaderMode(h);
      if (mode == eb_math::kVerbatim) {  // coverage: every branch
        for (uint32_t i = lane; i < t.count; i += 32) {
          const uint32_t bits = kBytes == 4 ? data[i] : (data[i / 2] >> (16 * (i % 2))) & 0xffffu;
          elements::StoreBits<kBytes>(output, eb_math::ElementOf(l, t, i), bits);
        }
        continue;
      }
      const uint32_t width = eb_math::HeaderWidth(h);
      for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
        const uint32_t s = kSlotsPerLane * lane + j;
        const Slot slot = SlotOf(l, t, s);
        k[s] = slot.real ? static_cast<uint32_t>(eb_math::UnZigZag(
                               eb_math::UnpackValue(data, slot.r * t.cols + slot.c, width)))
                         : 0u;
      }
      __syncwarp();
      // Inverse prediction on k' = k - anchor (padded slots hold 0 and come after every real
      // slot of their row and column, so they change nothing real): row mode is a prefix sum
      // down the first column, then along the rows; 2-D Lorenzo is a 2-D prefix sum.
      if (mode == eb_math::kRow) {  // coverage: every branch
        if (lane == 0) {
          for (uint32_t r = 1; r < l.tile_rows; ++r) k[r * tc] += k[(r - 1) * tc];
        }
        __syncwarp();
      }
      if (mode != eb_math::kOffset) {  // coverage: every branch
        if (static_cast<uint32_t>(lane) < l.tile_rows) {
          uint32_t* row = k + lane * tc;
          for (uint32_t col = 1; col < tc; ++col) row[col] += row[col - 1];
        }
        __syncwarp();
      }
      if (mode == eb_math::kLorenzo) {  // coverage: every branch
        if (static_cast<uint32_t>(lane) < tc) {
          for (uint32_t r = 1; r < l.tile_rows; ++r) k[r * tc + lane] += k[(r - 1) * tc + lane];
        }
        __syncwarp();
      }
      const uint32_t anchor = static_cast<uint32_t>(eb_math::HeaderAnchor(h));
      for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
        const uint32_t s = kSlotsPerLane * lane + j;
        const Slot slot = SlotOf(l, t, s);
        if (!slot.real) continue;
        elements::Store<K>(output, t.origin + slot.r * l.cols + slot.c,
                           eb_math::Dequantize(static_cast<int32_t>(k[s] + anchor), half_bin));
      }
      __syncwarp();
    }
  }
}

template <int Width>
__global__ void EbScatterKernel(const uint32_t* __restrict__ words, Layout l, EbPayload p,
                                const DeviceStatus* __restrict__ status,
                                void* __restrict__ output) {
  if (status->failures != 0) return;
  const EbValues v = ValuesOf(l, p, status);
  const eb_math::Sections sections = eb_math::SectionsOf(l, v.data_words, v.outliers);
  const uint32_t* slots = words + sections.slots;
  const uint32_t* raw = words + sections.raw;
  const uint64_t outliers = v.outliers;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t j = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; j < outliers; j += stride) {
    const uint64_t slot = ReadU64(slots, j);
    const uint64_t b = slot / eb_math::kBlockValues;
    const uint32_t i = static_cast<uint32_t>(slot % eb_math::kBlockValues);
    elements::StoreBits<Width>(output, eb_math::ElementOf(l, eb_math::TileOf(l, b), i), raw[j]);
  }
}

Layout LayoutOf(const EbShape& shape) {
  return eb_math::MakeLayout(shape.dims, shape.planes, shape.rows, shape.cols);
}

// Calls fn(std::integral_constant<int, K>()) for the element kind.
template <typename Fn>
void DispatchKind(int element_kind, Fn&& fn) {
  switch (element_kind) {  // coverage: every branch
    case elements::kF16: fn(std::integral_constant<int, elements::kF16>()); break;
    case elements::kBF16: fn(std::integral_constant<int, elements::kBF16>()); break;
    default: fn(std::integral_constant<int, elements::kF32>()); break;
  }
}

}  // namespace

absl::Status EbEncode(const void* input, const EbShape& shape, int mode, double value,
                      uint8_t* payload, uint8_t* scratch, DeviceStatus* status, void* stream) {
  const Layout l = LayoutOf(shape);
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint64_t numel = shape.planes * shape.rows * shape.cols;
  if (mode == eb_math::kRelative && numel > 0) {
    DispatchKind(shape.element_kind, [&](auto kind) {
      ACTPACK_LAUNCH(EbRangeKernel<decltype(kind)::value>, BlocksFor(numel, 256 * 8), 256, s)(
          input, numel, status);
    });
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  ACTPACK_LAUNCH(EbQuantizerKernel, 1, 1, s)(mode, value, status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  uint32_t* words = reinterpret_cast<uint32_t*>(payload);
  unsigned long long* state = reinterpret_cast<unsigned long long*>(scratch);
  if (l.blocks > 0) {
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(state, 0, 16 * l.chunks, s));
    DispatchKind(shape.element_kind, [&](auto kind) {
      // 1-D blocks load 4 elements at once where the input allows.
      const uintptr_t width = shape.element_kind == elements::kF32 ? 16 : 8;
      const bool aligned = reinterpret_cast<uintptr_t>(input) % width == 0;
      ACTPACK_LAUNCH(EbEncodeKernel<decltype(kind)::value>, BlocksFor(l.chunks, 1), kWarps * 32,
                     s)(input, l, aligned, status, words, state);
    });
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
    DispatchKind(shape.element_kind, [&](auto kind) {
      ACTPACK_LAUNCH(EbOutlierKernel<decltype(kind)::value>, BlocksFor(l.chunks, kWarps),
                     kWarps * 32, s)(input, l, status, words, state);
    });
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  // The payload's size is decided on the device: the checksum reads it there, bounded by the
  // largest payload this shape can have (where the scratch begins).
  const uint64_t bound = static_cast<uint64_t>(scratch - payload);
  return Checksum(payload, bound, reinterpret_cast<const uint32_t*>(&status->payload_bytes),
                  &status->payload_sum, stream);
}

absl::Status EbDecode(const uint8_t* payload, const EbShape& shape, const EbPayload& values,
                      DeviceStatus* status, void* output, void* stream) {
  const Layout l = LayoutOf(shape);
  const uint32_t element_bytes = shape.element_kind == elements::kF32 ? 4 : 2;
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  const uint64_t data_start = eb_math::SectionsOf(l, 0, 0).data;
  const int blocks = BlocksFor(l.chunks, kWarps);
  // Threads for the outliers: one each where the host knows their count; where only the device
  // does, at most as many as the decode's own, looping over the rest.
  const uint64_t outlier_threads =
      values.from_status ? std::min<uint64_t>(values.max_outliers, uint64_t{256} * blocks)
                         : values.outliers;
  // From the status, the check of its values runs whatever the shape (no blocks: one warp).
  if (l.blocks > 0 || values.from_status) {
    DispatchKind(shape.element_kind, [&](auto kind) {
      ACTPACK_LAUNCH(EbValidateKernel<decltype(kind)::value>, blocks, kWarps * 32, s)(
          words, l, values, status);
    });
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (outlier_threads > 0) {
    ACTPACK_LAUNCH(EbValidateOutliersKernel, BlocksFor(outlier_threads, 256), 256, s)(
        words, l, values, element_bytes, status);
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  // The kernels below write nothing when a check above (or the buffer's) failed.
  if (l.blocks > 0) {
    DispatchKind(shape.element_kind, [&](auto kind) {
      // 1-D blocks store 4 elements at once where the output allows.
      const bool aligned = reinterpret_cast<uintptr_t>(output) % (4 * element_bytes) == 0;
      ACTPACK_LAUNCH(EbDecodeKernel<decltype(kind)::value>, blocks, kWarps * 32, s)(
          words, l, values, data_start, aligned, status, output);
    });
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  if (outlier_threads > 0) {
    // After the blocks (same stream): an outlier overwrites its block's placeholder value.
    if (element_bytes == 4) {  // coverage: every branch
      ACTPACK_LAUNCH(EbScatterKernel<4>, BlocksFor(outlier_threads, 256), 256, s)(
          words, l, values, status, output);
    } else {
      ACTPACK_LAUNCH(EbScatterKernel<2>, BlocksFor(outlier_threads, 256), 256, s)(
          words, l, values, status, output);
    }
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

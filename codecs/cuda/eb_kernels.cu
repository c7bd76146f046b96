// CUDA kernels of the `eb` codec. They write exactly the payload of the CPU reference (eb.cc):
// every code, predictor choice, header word and packed word comes from eb_math.h, and no
// atomic operation decides a byte of output (atomics only sum counters and failure bits).
//
// Encode, with nothing read back by the host: EbRangeKernel (relative mode) and
// EbQuantizerKernel put the quantizer in the call's DeviceStatus, then
//  1. EbPlanKernel, one warp per chunk of 32 blocks, block after block: quantize the tile into
//     shared memory (4 slots per lane), OR-reduce each predictor's ZigZag residuals, choose
//     (ChooseBlock), write the header word; per chunk, its data words and outliers to scratch.
//  2. EbScanKernel, one thread block: exclusive prefix sums of the chunk sums, giving the chunk
//     index (into the payload) and each chunk's first outlier (scratch), and the totals.
//  3. EbWriteKernel, one warp per chunk again: re-quantize each tile (the same choice comes
//     out), pack the chosen residuals one word per lane (PackWord) or copy the raw bits, and
//     list the outliers in slot order (a warp scan of per-lane counts).
//  Then the checksum over the finished payload, whose size the scan left in the status.
// Decode: EbValidateKernel (warp per chunk: header words, block sizes against the chunk index)
// and EbValidateOutliersKernel (thread per outlier) set failure bits; only when none is set
// (nor one of the buffer's check before them), EbDecodeKernel (warp per chunk: unpack, inverse
// prediction as prefix sums in shared memory, dequantize) and EbScatterKernel (thread per
// outlier) write the output. What the encode's data decided (the half-bin, the data words, the
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

constexpr int kWarps = 4;  // warps per thread block, each on its own chunk
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
                                const Quantizer& qz, uint64_t b, WarpTile& w, int lane) {
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
    w.k[s] = code;
  }
  __syncwarp();
  lo = WarpMin(lo);
  hi = WarpMax(hi);
  const int32_t mid = eb_math::MidCode(lo, hi);
  const int32_t first = w.k[0];
  uint32_t or_offset = 0, or_row = 0, or_lorenzo = 0;
  for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
    const Slot slot = SlotOf(l, t, kSlotsPerLane * lane + j);
    if (!slot.real) continue;
    or_offset |= eb_math::ZigZag(
        eb_math::Residual(eb_math::kOffset, w.k, l.tile_cols, slot.r, slot.c, mid));
    or_row |= eb_math::ZigZag(
        eb_math::Residual(eb_math::kRow, w.k, l.tile_cols, slot.r, slot.c, first));
    or_lorenzo |= eb_math::ZigZag(
        eb_math::Residual(eb_math::kLorenzo, w.k, l.tile_cols, slot.r, slot.c, first));
  }
  const uint32_t outliers = WarpSum(__popc(state.outlier_bits));
  state.choice = eb_math::ChooseBlock(WarpOr(or_offset), WarpOr(or_row), WarpOr(or_lorenzo), mid,
                                      first, outliers, t.count, kBytes);
  return state;
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

template <int K>
__global__ void __launch_bounds__(kWarps * 32)
    EbPlanKernel(const void* __restrict__ input, Layout l, const DeviceStatus* __restrict__ status,
                 uint32_t* __restrict__ headers, uint64_t* __restrict__ chunk_words,
                 uint64_t* __restrict__ chunk_outliers) {
  __shared__ WarpTile tiles[kWarps];
  const Quantizer qz = QuantizerOf(status);
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  WarpTile& w = tiles[warp];
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarps;
  for (uint64_t c = uint64_t{blockIdx.x} * kWarps + warp; c < l.chunks; c += warp_stride) {
    uint64_t words = 0, outliers = 0;
    const uint64_t first = c * eb_math::kBlocksPerChunk;
    const uint64_t last = Min64(l.blocks, first + eb_math::kBlocksPerChunk);
    for (uint64_t b = first; b < last; ++b) {
      const BlockState state = PlanBlock<K>(input, l, qz, b, w, lane);
      if (lane == 0) headers[b] = state.choice.header;
      words += state.choice.data_words;
      outliers += state.choice.outliers;
      __syncwarp();  // the tile is rewritten by the next block
    }
    if (lane == 0) {
      chunk_words[c] = words;
      chunk_outliers[c] = outliers;
    }
  }
}

// One thread block of kScanThreads: exclusive prefix sums of the chunk sums. Writes the chunk
// index, turns chunk_outliers into each chunk's first outlier, and puts the totals in the
// status: the data words, the outlier count (header parameter words 4..5) and the payload's
// size.
constexpr int kScanThreads = 1024;

__global__ void __launch_bounds__(kScanThreads)
    EbScanKernel(const uint64_t* __restrict__ chunk_words, uint64_t* __restrict__ chunk_outliers,
                 Layout l, uint32_t* __restrict__ index, DeviceStatus* __restrict__ status) {
  const uint64_t chunks = l.chunks;
  __shared__ uint64_t words_sum[kScanThreads];
  __shared__ uint64_t outliers_sum[kScanThreads];
  const uint64_t per_thread = (chunks + kScanThreads - 1) / kScanThreads;
  const uint64_t begin = Min64(chunks, threadIdx.x * per_thread);
  const uint64_t end = Min64(chunks, begin + per_thread);
  uint64_t words = 0, outliers = 0;
  for (uint64_t c = begin; c < end; ++c) {
    words += chunk_words[c];
    outliers += chunk_outliers[c];
  }
  words_sum[threadIdx.x] = words;
  outliers_sum[threadIdx.x] = outliers;
  __syncthreads();
  // Hillis-Steele inclusive scan over the threads' sums.
  for (int offset = 1; offset < kScanThreads; offset *= 2) {
    const uint64_t w = threadIdx.x >= offset ? words_sum[threadIdx.x - offset] : 0;
    const uint64_t o = threadIdx.x >= offset ? outliers_sum[threadIdx.x - offset] : 0;
    __syncthreads();
    words_sum[threadIdx.x] += w;
    outliers_sum[threadIdx.x] += o;
    __syncthreads();
  }
  uint64_t word_offset = words_sum[threadIdx.x] - words;
  uint64_t outlier_offset = outliers_sum[threadIdx.x] - outliers;
  for (uint64_t c = begin; c < end; ++c) {
    const uint64_t chunk_outlier_count = chunk_outliers[c];
    WriteU64(index, c, word_offset);
    chunk_outliers[c] = outlier_offset;
    word_offset += chunk_words[c];
    outlier_offset += chunk_outlier_count;
  }
  if (threadIdx.x == kScanThreads - 1) {
    const uint64_t total_words = words_sum[threadIdx.x];
    const uint64_t total_outliers = outliers_sum[threadIdx.x];
    status->work[kDataWordsWord] = total_words;
    status->params[4] = static_cast<uint32_t>(total_outliers);
    status->params[5] = static_cast<uint32_t>(total_outliers >> 32);
    status->payload_bytes = 4 * eb_math::SectionsOf(l, total_words, total_outliers).end;
  }
}

template <int K>
__global__ void __launch_bounds__(kWarps * 32)
    EbWriteKernel(const void* __restrict__ input, Layout l,
                  const DeviceStatus* __restrict__ status, uint32_t* __restrict__ words,
                  const uint64_t* __restrict__ chunk_first_outlier) {
  constexpr uint32_t kBytes = K == elements::kF32 ? 4 : 2;
  const Quantizer qz = QuantizerOf(status);
  const eb_math::Sections sections = SectionsOf(l, status);
  __shared__ WarpTile tiles[kWarps];
  const int warp = threadIdx.x / 32;
  const int lane = threadIdx.x & 31;
  WarpTile& w = tiles[warp];
  const uint32_t* index = words + eb_math::SectionsOf(l, 0, 0).index;
  uint32_t* data = words + sections.data;
  uint32_t* slots = words + sections.slots;
  uint32_t* raw = words + sections.raw;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarps;
  for (uint64_t c = uint64_t{blockIdx.x} * kWarps + warp; c < l.chunks; c += warp_stride) {
    uint64_t offset = ReadU64(index, c);
    uint64_t outlier = chunk_first_outlier[c];
    const uint64_t first = c * eb_math::kBlocksPerChunk;
    const uint64_t last = Min64(l.blocks, first + eb_math::kBlocksPerChunk);
    for (uint64_t b = first; b < last; ++b) {
      const BlockState state = PlanBlock<K>(input, l, qz, b, w, lane);
      const Tile& t = state.tile;
      const uint32_t mode = eb_math::HeaderMode(state.choice.header);
      const int32_t anchor = eb_math::HeaderAnchor(state.choice.header);
      // The values to pack, in the dense order.
      for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
        const Slot slot = SlotOf(l, t, kSlotsPerLane * lane + j);
        if (!slot.real) continue;
        const uint32_t i = slot.r * t.cols + slot.c;
        w.v[i] = mode == eb_math::kVerbatim
                     ? elements::LoadBits<kBytes>(input, t.origin + slot.r * l.cols + slot.c)
                     : eb_math::ZigZag(
                           eb_math::Residual(mode, w.k, l.tile_cols, slot.r, slot.c, anchor));
      }
      __syncwarp();
      const uint32_t width = eb_math::HeaderWidth(state.choice.header);
      for (uint32_t word = lane; word < state.choice.data_words; word += 32) {
        uint32_t value;
        if (mode != eb_math::kVerbatim) {  // coverage: every branch
          value = eb_math::PackWord(w.v, t.count, width, word);
        } else if (kBytes == 4) {
          value = w.v[word];
        } else {
          value = w.v[2 * word] | (2 * word + 1 < t.count ? w.v[2 * word + 1] << 16 : 0u);
        }
        data[offset + word] = value;
      }
      if (state.choice.outliers > 0) {
        const uint32_t mine = __popc(state.outlier_bits);
        uint64_t position = outlier + WarpInclusiveScan(mine, lane) - mine;
        for (uint32_t j = 0; j < kSlotsPerLane; ++j) {
          if ((state.outlier_bits >> j & 1u) == 0) continue;
          const Slot slot = SlotOf(l, t, kSlotsPerLane * lane + j);
          const uint32_t i = slot.r * t.cols + slot.c;
          WriteU64(slots, position, b * eb_math::kBlockValues + i);
          raw[position] = elements::LoadBits<kBytes>(input, t.origin + slot.r * l.cols + slot.c);
          ++position;
        }
      }
      offset += state.choice.data_words;
      outlier += state.choice.outliers;
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

template <int K>
__global__ void EbRangeKernel(const void* __restrict__ input, uint64_t numel,
                              DeviceStatus* __restrict__ status) {
  uint64_t max_key = 0, max_inverted_key = 0, finite = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t i = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < numel; i += stride) {
    const float v = elements::Load<K>(input, i);
    if (!portable::IsFinite(v)) continue;
    const uint32_t key = OrderedKey(v);
    max_key = key > max_key ? key : max_key;
    max_inverted_key = ~key > max_inverted_key ? ~key : max_inverted_key;
    ++finite;
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

template <int K>
__global__ void __launch_bounds__(kWarps * 32)
    EbDecodeKernel(const uint32_t* __restrict__ words, Layout l, EbPayload p,
                   uint64_t data_start, const DeviceStatus* __restrict__ status,
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
    const uint32_t size =
        mine < l.blocks ? eb_math::DataWords(words[mine], eb_math::TileOf(l, mine).count, kBytes)
                        : 0u;
    const uint32_t before = WarpInclusiveScan(size, lane) - size;
    const uint32_t* chunk_data = words + data_start + ReadU64(index, c);
    const uint32_t blocks = static_cast<uint32_t>(Min64(l.blocks - first, 32));
    for (uint32_t bi = 0; bi < blocks; ++bi) {
      const uint64_t b = first + bi;
      const uint32_t* data = chunk_data + __shfl_sync(kFullMask, before, bi);
      const uint32_t h = words[b];
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
      if (mode == eb_math::kRow && l.tile_rows > 1) {  // coverage: every branch
        if (lane == 0) {
          for (uint32_t r = 1; r < l.tile_rows; ++r) k[r * tc] += k[(r - 1) * tc];
        }
        __syncwarp();
      }
      if (mode != eb_math::kOffset) {  // coverage: every branch
        if (l.tile_rows == 1) {
          // One row of 128: each lane scans its 4 slots, then the lanes' totals.
          uint32_t* mine4 = k + kSlotsPerLane * lane;
          for (uint32_t j = 1; j < kSlotsPerLane; ++j) mine4[j] += mine4[j - 1];
          const uint32_t total = mine4[kSlotsPerLane - 1];
          const uint32_t carry = WarpInclusiveScan(total, lane) - total;
          for (uint32_t j = 0; j < kSlotsPerLane; ++j) mine4[j] += carry;
        } else if (static_cast<uint32_t>(lane) < l.tile_rows) {
          uint32_t* row = k + lane * tc;
          for (uint32_t col = 1; col < tc; ++col) row[col] += row[col - 1];
        }
        __syncwarp();
      }
      // (Not marked for coverage: a 1-D block's Lorenzo residuals are its row residuals, so
      // ChooseBlock never picks Lorenzo there and that pair of branches cannot run.)
      if (mode == eb_math::kLorenzo && l.tile_rows > 1) {
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
  uint64_t* chunk_words = reinterpret_cast<uint64_t*>(scratch);
  uint64_t* chunk_outliers = chunk_words + l.chunks;
  const int blocks = BlocksFor(l.chunks, kWarps);
  if (l.blocks > 0) {
    DispatchKind(shape.element_kind, [&](auto kind) {
      ACTPACK_LAUNCH(EbPlanKernel<decltype(kind)::value>, blocks, kWarps * 32, s)(
          input, l, status, words, chunk_words, chunk_outliers);
    });
    ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  }
  // Also with no blocks: it writes the totals (zero) and the payload's size.
  ACTPACK_LAUNCH(EbScanKernel, 1, kScanThreads, s)(chunk_words, chunk_outliers, l,
                                                   words + eb_math::SectionsOf(l, 0, 0).index,
                                                   status);
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  if (l.blocks > 0) {
    DispatchKind(shape.element_kind, [&](auto kind) {
      ACTPACK_LAUNCH(EbWriteKernel<decltype(kind)::value>, blocks, kWarps * 32, s)(
          input, l, status, words, chunk_outliers);
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
      ACTPACK_LAUNCH(EbDecodeKernel<decltype(kind)::value>, blocks, kWarps * 32, s)(
          words, l, values, data_start, status, output);
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

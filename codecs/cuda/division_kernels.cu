// CUDA kernels of the `division` and `division_dct` codecs. `division`'s write exactly the payload
// of the CPU reference (division.cc): the same window sums (division_math::LfcWord, a left-to-right
// correctly rounded sum per window), the same residuals, group parameters and counter-based draws
// (division_math.h, quant_math.h).
//
// Encode, two kernels on one stream: (1) one thread per LFC word (two windows; for C > 1 the
// warp reads contiguous columns of the same rows), its block 0 zeroing the call's DeviceStatus,
// which nothing else in (1) touches; (2) one warp per residual group, as
// quant's kernel: a shuffle reduction of the group's residual min/max, then each lane
// quantizes one value per 32 and the codes of 32/bits neighbouring lanes are ORed into one
// word, written coalesced; where the input is aligned and a 16-byte vector's values share a
// window (ResidualVectorizable), a half-warp per group, a lane loads its vectors and their
// means once and holds them in registers for both passes (one pass over the input). The LFC means that (2) subtracts are
// read back from the payload (1) wrote. (2) sums the whole payload's checksum and counts per
// warp into the status (the LFC words' too, each thread a share of them after its groups), and
// its last block writes the header (device_ops.cuh's CloseLaunch).
// Decode, one launch: a thread per 16-byte vector of output where planes hold whole vectors
// and the output is 16-byte aligned (a value a thread elsewhere). Each value's thread sums the
// checksum terms of the payload words it is the first reader of (its code word, its group's
// parameter word, its window's LFC word), and the last block checks the buffer.
// A value's plane, group and window come from divisions by the layout's sizes: in a tensor of
// at most 2^32 - 1 values, multiplications made once per launch (division_math::MeanDivisors).
//
// `division_dct` (layout.kept_rows > 0) writes exactly the CPU's payload too: its sums run in
// the order FORMAT.md gives, each a correctly rounded float operation, the cosines from
// dct_math.h's polynomial (a block's tables in shared memory where they fit). Encode, two
// launches: (1) DctMeanKernel (one kept frequency) or DctForwardKernel, a block item a few
// planes' chunk of channels, zeroing the status in block 0; (2) the residual kernels above
// (DctResidualVectorKernel where a vector's values share one approximation, else
// DctMeanResidualKernel or DctResidualKernel), the approximations the inverse transform of the
// coefficients (1) wrote (CosineLfc). Decode, one launch (DctMeanDecodeKernel or
// DctDecodeKernel): the decode above, the LFC words' checksum terms summed apart.
// The transform is direct (about R multiply-adds a value forward and R x V back at R x V kept
// frequencies: one each at the default keep), not an FFT: FORMAT.md says why.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/cuda_check.h"
#include "codecs/cuda/device_ops.cuh"
#include "codecs/cuda/kernels.h"
#include "codecs/cuda/launch.cuh"
#include "codecs/internal/dct_math.h"
#include "codecs/internal/division_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"

namespace actpack::codecs::cuda {
namespace {

using division_math::Layout;
using division_math::MeanDivisors;

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = 8;
constexpr unsigned kFullMask = 0xffffffffu;
constexpr int kLfcOverflowWord = 0;  // DeviceStatus::work, kernels.h
// The vector residual kernel's lanes a group (half a warp) and 16-byte vectors a lane holds of
// it: they cover the default group of 128 values (256 of a 16-bit tensor); larger groups take
// the scalar kernel.
constexpr uint32_t kGroupLanes = 16;
constexpr uint32_t kVectorsPerLane = 2;

// Zeroes the call's status in block 0 of an encode's first launch (codec.h's
// EncodeZeroesStatus): no thread of that launch sums into it.
__device__ __forceinline__ void ZeroStatusInFirstBlock(DeviceStatus* __restrict__ status) {
  if (blockIdx.x == 0 && threadIdx.x < sizeof(DeviceStatus) / 8) {
    reinterpret_cast<unsigned long long*>(status)[threadIdx.x] = 0;
  }
}

// The encode's first launch: the LFC words, a thread each; the residual launch sums their terms.
template <int K>
__global__ void __launch_bounds__(kThreads)
    DivisionLfcKernel(const void* __restrict__ input, Layout layout,
                      uint32_t* __restrict__ payload, DeviceStatus* __restrict__ status) {
  ZeroStatusInFirstBlock(status);
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < layout.lfc_words;
       w += stride) {
    uint64_t nonfinite = 0;  // counted from the words by the residual launch
    payload[w] = division_math::LfcWord<K>(input, layout, w, &nonfinite);
  }
}

// A window row's 16-byte vectors (1 or 2) where rows are whole aligned vectors, else 0.
uint32_t LfcRowVectors(const void* input, const Layout& l, uint32_t per) {
  const bool whole = reinterpret_cast<uintptr_t>(input) % 16 == 0 && l.inner == 1 &&
                     l.block_w % per == 0 && l.width % l.block_w == 0;
  const uint32_t vectors = l.block_w / per;
  return whole && vectors <= 2 ? vectors : 0;
}

// DivisionLfcKernel where a window's rows are one or two whole 16-byte vectors (`two`), as a
// convolution's [N, C, H, W] activations with W a multiple of the window's are: the same sums
// in the same order (WindowMean's), a row's values loaded as vectors, several rows' loads at
// once.
template <int K>
__global__ void __launch_bounds__(kThreads)
    DivisionLfcVectorKernel(const uint4* __restrict__ input, Layout layout, bool two,
                            uint32_t* __restrict__ payload, DeviceStatus* __restrict__ status) {
  constexpr uint32_t kPer = kValuesPerVector<K>;
  ZeroStatusInFirstBlock(status);
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < layout.lfc_words;
       w += stride) {
    uint64_t nonfinite = 0;  // counted from the words by the residual launch
    payload[w] = division_math::LfcWordOf(layout, w, &nonfinite, [&](uint64_t m) {
      const division_math::Window win = division_math::WindowOf(layout, m);
      const uint4* first = input + win.first / kPer;
      const uint64_t row_vectors = layout.width / kPer;
      float sum = 0.0f;
      ACTPACK_UNROLL_4
      for (uint64_t h = 0; h < win.rows; ++h) {
        const uint4 a = first[h * row_vectors];
        const uint4 b = two ? first[h * row_vectors + 1] : uint4{};
        ACTPACK_UNROLL
        for (uint32_t e = 0; e < kPer; ++e) sum = portable::Add(sum, VectorElement<K>(a, e));
        if (two) {
          ACTPACK_UNROLL
          for (uint32_t e = 0; e < kPer; ++e) sum = portable::Add(sum, VectorElement<K>(b, e));
        }
      }
      return portable::Div(sum, static_cast<float>(win.rows * win.cols));
    });
  }
}

// The end of a residual launch: the thread's share of the LFC words (their checksum terms and
// non-finite means, counted apart for the message), then every sum into the status, and the
// closing. An LFC word holds two 8 x 8 means at the default window, one per 128 values: each
// thread a few.
__device__ __forceinline__ void CloseResidualLaunch(const uint32_t* __restrict__ payload,
                                                    const Layout& l, uint64_t checksum,
                                                    uint64_t nonfinite, uint64_t overflow_groups,
                                                    const LaunchClosing& closing,
                                                    DeviceStatus* __restrict__ status) {
  uint64_t lfc_nonfinite = 0;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < l.lfc_words;
       w += stride) {
    const uint32_t word = payload[w];
    checksum += portable::ChecksumTerm(word, w);
    lfc_nonfinite += division_math::NonFiniteMeans(word);
  }
  WarpSumToGlobal(checksum, &status->payload_sum);
  WarpSumToGlobal(nonfinite, &status->nonfinite);
  // LFC means not finite in bfloat16: out of reach, and counted apart for the message.
  WarpSumToGlobal(overflow_groups + lfc_nonfinite, &status->unrepresentable);
  WarpSumToGlobal(lfc_nonfinite, &status->work[kLfcOverflowWord]);
  CloseLaunch(closing, status);
}

// The LFC mean value j of plane p upsamples from (division_math::MeanOf), and whether the value
// is its window's first.
__device__ __forceinline__ uint64_t MeanIndex(const Layout& l, const MeanDivisors& d,
                                              uint64_t p, uint64_t j, bool* starts = nullptr) {
  return d.narrow ? division_math::MeanOfNarrow(l, d, p, static_cast<uint32_t>(j), starts)
                  : division_math::MeanOf(l, p, j, starts);
}

// MeanIndex in a layout of rows (OneWindow's).
__device__ __forceinline__ uint64_t RowMeanIndex(const Layout& l, const MeanDivisors& d,
                                                 uint64_t p, uint64_t j) {
  return d.narrow ? division_math::MeanOfRowsNarrow(l, d, p, static_cast<uint32_t>(j))
                  : division_math::MeanOf(l, p, j);
}

// Whether every `per` values of a plane from a multiple of `per` on lie in one window: a plane
// of rows (no inner channels) whose rows and window columns are whole multiples of them, as a
// convolution's [N, C, H, W] activations with H and W divisible by 4 are.
__host__ __device__ inline bool OneWindow(const Layout& l, uint32_t per) {
  return l.inner == 1 && l.width % per == 0 && l.block_w % per == 0;
}

// j / l.group_length.
__device__ __forceinline__ uint64_t GroupOf(const Layout& l, const MeanDivisors& d, uint64_t j) {
  return d.narrow ? portable::Divide(static_cast<uint32_t>(j), d.group_length)
                  : j / l.group_length;
}

// i / l.plane.
__device__ __forceinline__ uint64_t PlaneOf(const Layout& l, const MeanDivisors& d, uint64_t i) {
  return d.narrow ? portable::Divide(static_cast<uint32_t>(i), d.plane)
                  : i / l.plane;
}

// a / b in a tensor of 2^32 values or more: out of line, off the narrow tensors' path.
__device__ __noinline__ uint64_t WideQuotient(uint64_t a, uint64_t b) { return a / b; }

// Residual group g: its plane, its first value in the plane and its values.
struct GroupPlace {
  uint64_t p, j0, n;
};
__device__ __forceinline__ GroupPlace PlaceOfGroup(const Layout& l, const MeanDivisors& d,
                                                   uint64_t g) {
  const uint64_t p = d.narrow
                         ? portable::Divide(static_cast<uint32_t>(g), d.groups_per_plane)
                         : WideQuotient(g, l.groups_per_plane);
  const uint64_t q = g - p * l.groups_per_plane;
  return GroupPlace{p, q * l.group_length, division_math::GroupSize(l, q)};
}

// The LFC as the residual and decode kernels see it (PooledLfc, CosineLfc below):
//   Prepare(l)             block-wide, before any other call (a kernel's first statement);
//   At(l, d, p, j)         the approximation of value j of plane p;
//   VectorAt(l, d, p, j)   At where a 16-byte vector's values from j share it
//                          (VectorsShareApproximation);
//   AtSumming(l, d, p, j, checksum)  At, adding the checksum terms of the LFC words whose first
//                          reader value j is;
//   SumOtherWords(l, checksum)  the decode thread's share of the LFC words no value reads first.
// Both read the LFC section the encode's first launch (or the encoder) wrote: `payload`.

// `division`'s: a value's approximation is the mean of its window.
struct PooledLfc {
  const uint32_t* payload;

  __device__ __forceinline__ void Prepare(const Layout&) {}
  __device__ __forceinline__ float Mean(uint64_t m) const {
    return portable::Bf16ToFloat(reinterpret_cast<const uint16_t*>(payload)[m]);
  }
  __device__ __forceinline__ float At(const Layout& l, const MeanDivisors& d, uint64_t p,
                                      uint64_t j) const {
    return Mean(MeanIndex(l, d, p, j));
  }
  __device__ __forceinline__ float VectorAt(const Layout& l, const MeanDivisors& d, uint64_t p,
                                            uint64_t j) const {
    return Mean(RowMeanIndex(l, d, p, j));
  }
  // The first reader of an LFC word: the top-left value of the word's first window.
  __device__ __forceinline__ float AtSumming(const Layout& l, const MeanDivisors& d, uint64_t p,
                                             uint64_t j, uint64_t* checksum) const {
    bool starts = false;
    const uint64_t m = MeanIndex(l, d, p, j, &starts);
    if (starts && m % 2 == 0) *checksum += portable::ChecksumTerm(payload[m / 2], m / 2);
    return Mean(m);
  }
  __device__ __forceinline__ void SumOtherWords(const Layout&, uint64_t*) const {}
};

// ---- division_dct's cosine-transform LFC ----

// Cosines an axis' table holds in shared memory (frequencies 1.. of the axis' samples); a longer
// axis' are computed where they are needed, as on the CPU.
constexpr uint64_t kMaxCosines = 2048;

// The cosine of frequency f at sample m of an axis of n: frequency 0's is 1 (TurnCos(0, .)
// exactly), the others from `table` ([f - 1][m]) or computed (no table).
__device__ __forceinline__ float CosineAt(const float* table, uint64_t f, uint64_t m, uint64_t n) {
  if (f == 0) return 1.0f;
  return table != nullptr ? table[(f - 1) * n + m] : dct_math::Basis(m, f, n);
}

// Fills `table` with the cosines of frequencies 1..kept-1 of an axis of n samples where they fit,
// block-wide (the caller syncs), and returns it; nullptr where they do not fit or there are none.
__device__ __forceinline__ const float* FillCosines(float* table, uint64_t kept, uint64_t n) {
  const uint64_t entries = (kept - 1) * n;
  if (entries == 0 || entries > kMaxCosines) return nullptr;
  for (uint64_t i = threadIdx.x; i < entries; i += blockDim.x) {
    table[i] = dct_math::Basis(i % n, 1 + i / n, n);
  }
  return table;
}

// h, w and c of value j of a plane.
struct PlanePosition {
  uint64_t h, w, c;
};
__device__ __forceinline__ PlanePosition PositionOf(const Layout& l, const MeanDivisors& d,
                                                    uint64_t j) {
  if (d.narrow) {
    const uint32_t j32 = static_cast<uint32_t>(j);
    const uint32_t t = portable::Divide(j32, d.inner);
    const uint32_t h = portable::Divide(t, d.width);
    return PlanePosition{h, t - h * static_cast<uint32_t>(l.width),
                         j32 - t * static_cast<uint32_t>(l.inner)};
  }
  const uint64_t t = j / l.inner;
  return PlanePosition{t / l.width, t % l.width, j % l.inner};
}

// `division_dct`'s: a value's approximation is the inverse transform of its plane's stored
// coefficients at its place, summed in the CPU's order (division.cc's PlaneDct::Inverse: along
// h over u ascending, then along w over v ascending). Prepare fills the block's cosine tables
// (shared memory). A coefficient has many readers: the decode sums the LFC words apart.
// `kMean`: one kept frequency (keep 1, the default), where every cosine is 1 and the sums
// reduce to the (plane, channel)'s one coefficient: no tables, no loops, fewer registers.
template <bool kMean>
struct CosineLfc {
  const uint32_t* payload;
  const float* row_cosines = nullptr;
  const float* column_cosines = nullptr;

  __device__ __forceinline__ void Prepare(const Layout& l) {
    if (kMean) return;
    __shared__ float rows[kMean ? 1 : kMaxCosines];
    __shared__ float columns[kMean ? 1 : kMaxCosines];
    row_cosines = FillCosines(rows, l.kept_rows, l.height);
    column_cosines = FillCosines(columns, l.kept_columns, l.width);
    __syncthreads();
  }

  __device__ __forceinline__ float At(const Layout& l, const MeanDivisors& d, uint64_t p,
                                      uint64_t j) const {
    const uint16_t* coefficients = reinterpret_cast<const uint16_t*>(payload);
    if (kMean) {  // the same operations as below with R = V = 1 and cosines of 1
      const uint64_t c = d.narrow ? static_cast<uint32_t>(j) -
                                        portable::Divide(static_cast<uint32_t>(j), d.inner) *
                                            static_cast<uint32_t>(l.inner)
                                  : j % l.inner;
      const float x =
          portable::Bf16ToFloat(coefficients[division_math::CoefficientIndex(l, p, 0, 0, c)]);
      return portable::Add(0.0f, portable::Mul(portable::Add(0.0f, portable::Mul(x, 1.0f)), 1.0f));
    }
    const PlanePosition at = PositionOf(l, d, j);
    const uint16_t* x = coefficients + division_math::CoefficientIndex(l, p, 0, 0, at.c);
    float approximation = 0.0f;
    for (uint64_t v = 0; v < l.kept_columns; ++v) {
      float y = 0.0f;
      for (uint64_t u = 0; u < l.kept_rows; ++u) {
        const float cosine = CosineAt(row_cosines, u, at.h, l.height);
        const float coefficient = portable::Bf16ToFloat(x[(u * l.kept_columns + v) * l.inner]);
        y = portable::Add(y, portable::Mul(coefficient, cosine));
      }
      approximation = portable::Add(approximation,
                                    portable::Mul(y, CosineAt(column_cosines, v, at.w, l.width)));
    }
    return approximation;
  }
  __device__ __forceinline__ float VectorAt(const Layout& l, const MeanDivisors& d, uint64_t p,
                                            uint64_t j) const {
    return At(l, d, p, j);
  }
  __device__ __forceinline__ float AtSumming(const Layout& l, const MeanDivisors& d, uint64_t p,
                                             uint64_t j, uint64_t*) const {
    return At(l, d, p, j);
  }
  __device__ __forceinline__ void SumOtherWords(const Layout& l, uint64_t* checksum) const {
    const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
    for (uint64_t w = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x; w < l.lfc_words;
         w += stride) {
      *checksum += portable::ChecksumTerm(payload[w], w);
    }
  }
};

// Whether a division_dct layout keeps one frequency (CosineLfc<true>).
__host__ __device__ inline bool OneFrequency(const Layout& l) {
  return l.kept_rows == 1 && l.kept_columns == 1;
}

// Whether the values of a 16-byte vector (`per` of them from a multiple of `per` in a plane)
// share one LFC approximation: a window's (OneWindow) or, in division_dct at one kept
// frequency without inner channels, the plane's.
__host__ __device__ inline bool VectorsShareApproximation(const Layout& l, uint32_t per) {
  if (l.kept_rows > 0) return OneFrequency(l) && l.inner == 1;
  return OneWindow(l, per);
}

// How the forward kernel cuts the work: a block item is `planes` planes' chunk of `channels`
// channels (several planes where a plane's W x C values fill less than a block, one plane and
// `chunks` chunks of it otherwise), a tile `columns` of its columns; a thread sums one
// (plane, column, channel) along h per tile.
struct ForwardTiling {
  uint32_t planes, channels, columns;
  uint64_t chunks;  // channel chunks a plane
  uint64_t items;   // block items in all
};

// The forward kernel's shared memory: the pass along h's sums ([u][lane]) and the
// coefficients' ([plane][u][v][channel]) at most, and the cosine tables; a single kept
// frequency (keep 1, the default) needs a sum a thread and no tables.
constexpr uint32_t kForwardSums = 4096;
constexpr uint32_t kForwardCoefficients = 2048;

ForwardTiling TilingOf(const Layout& l) {
  if (l.planes == 0) return ForwardTiling{1, 1, 1, 0, 0};
  const uint64_t per_channel = l.kept_rows * l.kept_columns;  // at most 32 x 32
  const uint64_t lanes = std::min<uint64_t>(kThreads, kForwardSums / l.kept_rows);
  const uint64_t coefficients = std::min<uint64_t>(lanes, kForwardCoefficients / per_channel);
  const uint64_t channels = std::min<uint64_t>(l.inner, coefficients);
  const uint64_t columns = std::min<uint64_t>(l.width, lanes / channels);
  const bool whole = channels == l.inner && columns == l.width;
  const uint64_t planes =
      whole ? std::max<uint64_t>(1, std::min({lanes / (l.width * l.inner),
                                              coefficients / l.inner, l.planes}))
            : 1;
  const uint64_t chunks = (l.inner + channels - 1) / channels;
  return ForwardTiling{static_cast<uint32_t>(planes), static_cast<uint32_t>(channels),
                       static_cast<uint32_t>(columns), chunks,
                       (l.planes + planes - 1) / planes * chunks};
}

// The work of the encode's first launch for `division_dct`: the kept coefficients of each (plane,
// channel), the sums in the CPU's order (division.cc's PlaneDct::Forward: along h, h ascending, for
// each (u, w, c); then along w, w ascending, for each (u, v, c)), each rounded to bfloat16 into the
// LFC section. Per block item and tile of columns, each thread sums one (plane, column, channel)
// along h for every u into shared memory; then each coefficient's sum along w goes on over the
// tile's columns. `kMean`: one kept frequency (the plane's mean; cosines all 1), with the shared
// memory that needs. Block 0 zeroes the status and the pad half of an odd LFC.
template <int K, bool kMean>
__device__ __forceinline__ void ForwardItems(const void* __restrict__ input, const Layout& l,
                                             const ForwardTiling& t, uint16_t* __restrict__ lfc,
                                             DeviceStatus* __restrict__ status) {
  __shared__ float sums[kMean ? kThreads : kForwardSums];
  __shared__ float coefficients[kMean ? kThreads : kForwardCoefficients];
  __shared__ float rows[kMean ? 1 : kMaxCosines];
  __shared__ float columns[kMean ? 1 : kMaxCosines];
  ZeroStatusInFirstBlock(status);
  const uint64_t R = kMean ? 1 : l.kept_rows, V = kMean ? 1 : l.kept_columns;
  const uint64_t H = l.height, W = l.width, C = l.inner;
  if (blockIdx.x == 0 && threadIdx.x == 0 && R * V * C * l.planes % 2 != 0) {
    lfc[2 * l.lfc_words - 1] = 0;
  }
  const float* row_cosines = kMean ? nullptr : FillCosines(rows, R, H);
  const float* column_cosines = kMean ? nullptr : FillCosines(columns, V, W);
  __syncthreads();
  const uint32_t plane_lanes = t.channels * t.columns;
  const uint32_t lanes = t.planes * plane_lanes;
  const uint64_t per_plane = R * V * t.channels;  // a plane's coefficients in an item
  const uint64_t items = t.planes * per_plane;
  const uint32_t lane = threadIdx.x;
  for (uint64_t b = blockIdx.x; b < t.items; b += gridDim.x) {
    const uint64_t first_plane = b / t.chunks * t.planes;
    const uint64_t c0 = (b % t.chunks) * t.channels;
    const uint64_t channels = division_math::MinU(t.channels, C - c0);
    const uint64_t planes = division_math::MinU(t.planes, l.planes - first_plane);
    for (uint64_t i = threadIdx.x; i < items; i += blockDim.x) coefficients[i] = 0.0f;
    for (uint64_t w0 = 0; w0 < W; w0 += t.columns) {
      const uint64_t pp = lane / plane_lanes, in_plane = lane % plane_lanes;
      const uint64_t w = w0 + in_plane / t.channels, c = in_plane % t.channels;
      if (lane < lanes && pp < planes && w < W && c < channels) {  // along h
        const uint64_t first = (first_plane + pp) * l.plane + w * C + c0 + c;
        if (kMean) {
          float g = 0.0f;
          ACTPACK_UNROLL_4
          for (uint64_t h = 0; h < H; ++h) {
            g = portable::Add(g, portable::Mul(elements::Load<K>(input, first + h * W * C), 1.0f));
          }
          sums[lane] = g;
        } else {
          for (uint64_t u = 0; u < R; ++u) sums[u * lanes + lane] = 0.0f;
          for (uint64_t h = 0; h < H; ++h) {
            const float x = elements::Load<K>(input, first + h * W * C);
            for (uint64_t u = 0; u < R; ++u) {
              float& g = sums[u * lanes + lane];
              g = portable::Add(g, portable::Mul(x, CosineAt(row_cosines, u, h, H)));
            }
          }
        }
      }
      __syncthreads();
      const uint64_t tile = division_math::MinU(t.columns, W - w0);
      for (uint64_t i = threadIdx.x; i < items; i += blockDim.x) {  // along w
        const uint64_t pp = i / per_plane, c = i % t.channels;
        const uint64_t u = i % per_plane / t.channels / V, v = i % per_plane / t.channels % V;
        if (pp >= planes || c >= channels) continue;
        float acc = coefficients[i];
        const float* g = sums + u * lanes + pp * plane_lanes + c;
        for (uint64_t k = 0; k < tile; ++k) {
          const float cosine = kMean ? 1.0f : CosineAt(column_cosines, v, w0 + k, W);
          acc = portable::Add(acc, portable::Mul(g[k * t.channels], cosine));
        }
        coefficients[i] = acc;
      }
      __syncthreads();
    }
    for (uint64_t i = threadIdx.x; i < items; i += blockDim.x) {
      const uint64_t pp = i / per_plane, c = i % t.channels;
      const uint64_t u = i % per_plane / t.channels / V, v = i % per_plane / t.channels % V;
      if (pp >= planes || c >= channels) continue;
      uint64_t nonfinite = 0;  // counted from the words by the residual launch
      lfc[division_math::CoefficientIndex(l, first_plane + pp, u, v, c0 + c)] =
          division_math::StoredMean(dct_math::Coefficient(coefficients[i], u, v, H, W),
                                    &nonfinite);
    }
    __syncthreads();  // the next item's zeroing after every read of these
  }
}

template <int K>
__global__ void __launch_bounds__(kThreads)
    DctForwardKernel(const void* __restrict__ input, Layout l, ForwardTiling t,
                     uint16_t* __restrict__ lfc, DeviceStatus* __restrict__ status) {
  ForwardItems<K, false>(input, l, t, lfc, status);
}

// DctForwardKernel at one kept frequency (keep 1, the default: each (plane, channel)'s mean).
template <int K>
__global__ void __launch_bounds__(kThreads)
    DctMeanKernel(const void* __restrict__ input, Layout l, ForwardTiling t,
                  uint16_t* __restrict__ lfc, DeviceStatus* __restrict__ status) {
  ForwardItems<K, true>(input, l, t, lfc, status);
}

// The residual of value j of plane p against its LFC approximation.
template <int K, typename Lfc>
__device__ __forceinline__ float ResidualAt(const void* __restrict__ input, const Lfc& lfc,
                                            const Layout& l, const MeanDivisors& d, uint64_t p,
                                            uint64_t j, float* x) {
  *x = elements::Load<K>(input, p * l.plane + j);
  return division_math::Residual(*x, lfc.At(l, d, p, j));
}

// The residual launch's work in either codec (`division` where its vector kernel does not
// apply): one warp a group, the LFC's approximations from `lfc` (which reads the payload the
// first launch wrote).
template <int K, typename Lfc>
__device__ __forceinline__ void ResidualGroups(const void* __restrict__ input, const Layout& l,
                                               const MeanDivisors& d, Lfc& lfc,
                                               uint32_t* __restrict__ payload,
                                               const LaunchClosing& closing,
                                               DeviceStatus* __restrict__ status) {
  lfc.Prepare(l);
  const int lane = threadIdx.x & 31;
  const uint32_t word_shift = WordShift(l.bits);
  const uint32_t per_word = 1u << word_shift;  // 32 / bits
  const uint32_t levels = (1u << l.bits) - 1;
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;
  uint64_t overflow_groups = 0;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock;
  for (uint64_t g = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; g < l.groups;
       g += warp_stride) {
    const auto [p, j0, n] = PlaceOfGroup(l, d, g);
    float lo = __int_as_float(0x7f800000);  // +inf
    float hi = -lo;
    int overflow = 0;
    for (uint64_t k = lane; k < n; k += 32) {
      float x;
      const float r = ResidualAt<K>(input, lfc, l, d, p, j0 + k, &x);
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
    const uint64_t first_word = division_math::PlaneCodeWord(l, p) + (j0 >> word_shift);
    const uint64_t n_words = (n + per_word - 1) >> word_shift;
    for (uint64_t base = 0; base < n; base += 32) {
      const uint64_t k = base + lane;
      uint32_t code = 0;
      if (k < n) {
        float x;
        const float r = ResidualAt<K>(input, lfc, l, d, p, j0 + k, &x);
        if (portable::IsFinite(r)) {
          code = quant_math::Quantize(r, gp, draws(first_element + k), levels);
        }
      }
      uint32_t word = code << ((lane & (per_word - 1)) * l.bits);
      for (uint32_t offset = 1; offset < per_word; offset *= 2) {
        word |= __shfl_xor_sync(kFullMask, word, offset);
      }
      const uint64_t index = k >> word_shift;
      if ((lane & (per_word - 1)) == 0 && index < n_words) {
        payload[first_word + index] = word;
        checksum += portable::ChecksumTerm(word, first_word + index);
      }
    }
  }
  CloseResidualLaunch(payload, l, checksum, nonfinite, overflow_groups, closing, status);
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    DivisionResidualKernel(const void* __restrict__ input, Layout l, MeanDivisors d,
                           uint32_t* __restrict__ payload, LaunchClosing closing,
                           DeviceStatus* __restrict__ status) {
  PooledLfc lfc{payload};
  ResidualGroups<K>(input, l, d, lfc, payload, closing, status);
}

// division_dct's residual launch, and at one kept frequency.
template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    DctResidualKernel(const void* __restrict__ input, Layout l, MeanDivisors d,
                      uint32_t* __restrict__ payload, LaunchClosing closing,
                      DeviceStatus* __restrict__ status) {
  CosineLfc<false> lfc{payload};
  ResidualGroups<K>(input, l, d, lfc, payload, closing, status);
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    DctMeanResidualKernel(const void* __restrict__ input, Layout l, MeanDivisors d,
                          uint32_t* __restrict__ payload, LaunchClosing closing,
                          DeviceStatus* __restrict__ status) {
  CosineLfc<true> lfc{payload};
  ResidualGroups<K>(input, l, d, lfc, payload, closing, status);
}

// The range of a vector's finite residuals, with the count of its non-finite values and whether
// a finite value's residual overflows. Out of line: a vector with a non-finite residual is rare.
struct ResidualRange {
  float lo, hi;
  uint32_t nonfinite;
  int overflow;
};

template <int K>
__device__ __noinline__ ResidualRange NonFiniteRange(uint4 v, float mean, float lo, float hi) {
  ResidualRange range{lo, hi, 0, 0};
  for (uint32_t e = 0; e < kValuesPerVector<K>; ++e) {
    const float x = VectorElement<K>(v, e);
    const float r = division_math::Residual(x, mean);
    if (!portable::IsFinite(x)) {
      ++range.nonfinite;
    } else if (!portable::IsFinite(r)) {
      range.overflow = 1;
    } else {
      range.lo = fminf(range.lo, r);
      range.hi = fmaxf(range.hi, r);
    }
  }
  return range;
}

// A lane's vectors of its group and the means they upsample from (0 past the group's vectors).
template <int K>
struct LaneVectors {
  uint4 v[kVectorsPerLane];
  float mean[kVectorsPerLane];
};

template <int K, typename Lfc>
__device__ __forceinline__ LaneVectors<K> LoadLaneVectors(const uint4* __restrict__ group,
                                                          const Lfc& lfc, const Layout& l,
                                                          const MeanDivisors& d, uint64_t p,
                                                          uint64_t j0, uint32_t lane,
                                                          uint32_t vectors) {
  LaneVectors<K> lv = {};
  ACTPACK_UNROLL
  for (uint32_t t = 0; t < kVectorsPerLane; ++t) {
    const uint32_t j = lane + kGroupLanes * t;
    if (j < vectors) {
      lv.v[t] = group[j];
      lv.mean[t] = lfc.VectorAt(l, d, p, j0 + j * kValuesPerVector<K>);
    }
  }
  return lv;
}

template <int K, typename Lfc>
__device__ __noinline__ LaneVectors<K> LoadLaneVectorsOfPart(const uint4* group, Lfc lfc,
                                                            Layout l, MeanDivisors d, uint64_t p,
                                                            uint64_t j0, uint32_t lane,
                                                            uint32_t vectors) {
  return LoadLaneVectors<K>(group, lfc, l, d, p, j0, lane, vectors);
}

// The residual kernel where ResidualVectorizable holds: one pass over the input, two groups a
// warp, a half-warp each (the default group of 128 values is 32 vectors: 2 a lane), so that
// the work a lane does once per group (the range's reduction, the parameters, the checksum's
// hashes, the group's place) is shared by twice the values. Each lane loads its vectors of the
// group first (independent loads in flight) and the one mean a vector's values share, and
// holds both in registers, taking each residual from them for the group's range and again for
// its codes (a subtraction, not a reload); the codes of 32 / (bits x a vector's values)
// neighbouring lanes are ORed into a word with shuffles (at 8 bits of float32 a lane's word is
// its own), as quant's vector kernel does.
template <int K, typename Lfc>
__device__ __forceinline__ void ResidualVectorGroups(const uint4* __restrict__ input,
                                                     const Layout& l, const MeanDivisors& d,
                                                     Lfc& lfc, uint32_t* __restrict__ payload,
                                                     const LaunchClosing& closing,
                                                     DeviceStatus* __restrict__ status) {
  lfc.Prepare(l);
  constexpr uint32_t kPer = kValuesPerVector<K>;
  const uint32_t lane = threadIdx.x & (kGroupLanes - 1);  // in the group's half-warp
  const uint32_t half = (threadIdx.x & 31) / kGroupLanes;
  const unsigned half_mask = 0xffffu << (kGroupLanes * half);
  const uint32_t levels = (1u << l.bits) - 1;
  const uint32_t vector_bits = kPer * l.bits;  // a vector's codes: 4 to 64 bits
  GroupCodeWords<K, kVectorsPerLane, kGroupLanes> words(vector_bits);
  portable::GroupDraws group_draws(l.seed);
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;
  uint64_t overflow_groups = 0;
  const uint64_t pairs = (l.groups + 1) / 2;
  const uint64_t warp_stride = uint64_t{gridDim.x} * kWarpsPerBlock;
  for (uint64_t w = uint64_t{blockIdx.x} * kWarpsPerBlock + threadIdx.x / 32; w < pairs;
       w += warp_stride) {
    const uint64_t g = 2 * w + half;
    const bool in = g < l.groups;  // the second half of the last pair may have no group
    const auto [p, j0, n] = PlaceOfGroup(l, d, in ? g : 0);  // n: whole vectors, as the plane's
    const uint32_t vectors = in ? static_cast<uint32_t>(n / kPer) : 0;
    const uint64_t first_element = p * l.plane + j0;
    const uint4* group = input + first_element / kPer;
    // Every lane's vectors of a whole group inline; a plane's short last group (or none, in
    // the second half of the last pair) out of line.
    const LaneVectors<K> lv = vectors == kGroupLanes * kVectorsPerLane
                                  ? LoadLaneVectors<K>(group, lfc, l, d, p, j0, lane, vectors)
                                  : LoadLaneVectorsOfPart<K>(group, lfc, l, d, p, j0, lane, vectors);
    const uint4* v = lv.v;
    const float* mean = lv.mean;
    float lo = __int_as_float(0x7f800000);  // +inf
    float hi = -lo;
    int overflow = 0;
    ACTPACK_UNROLL
    for (uint32_t t = 0; t < kVectorsPerLane; ++t) {
      if (lane + kGroupLanes * t >= vectors) continue;
      // Finite residuals have one minimum and maximum but for the sign of a zero, which
      // MakeGroupParams makes no difference: fminf and fmaxf give the CPU's parameters. Where
      // every residual is finite (so is every value) no value needs a test of its own.
      const float m = mean[t];
      const VectorRange range =
          RangeOf<K>(v[t], [m](float x) { return division_math::Residual(x, m); });
      if (range.magnitude < 0x7f800000u) {
        lo = fminf(lo, range.lo);
        hi = fmaxf(hi, range.hi);
      } else {
        const ResidualRange range = NonFiniteRange<K>(v[t], mean[t], lo, hi);
        lo = range.lo;
        hi = range.hi;
        nonfinite += range.nonfinite;
        overflow |= range.overflow;
      }
    }
    for (uint32_t offset = kGroupLanes / 2; offset > 0; offset /= 2) {  // within the half
      lo = fminf(lo, __shfl_xor_sync(kFullMask, lo, offset));
      hi = fmaxf(hi, __shfl_xor_sync(kFullMask, hi, offset));
    }
    const bool any_overflow = (__ballot_sync(kFullMask, overflow) & half_mask) != 0;
    const quant_math::GroupParams gp = quant_math::MakeGroupParams(lo, hi, l.bits);
    const uint64_t param_word = division_math::ParamWord(l, g);
    if (lane == 0 && in) {
      payload[param_word] = gp.packed;
      if (!gp.ok || any_overflow) ++overflow_groups;
    }
    const portable::UniformDraws draws = group_draws.Of(first_element, first_element + n);
    words.Start(division_math::PlaneCodeWord(l, p) + (j0 >> WordShift(l.bits)), vectors);
    ACTPACK_UNROLL
    for (uint32_t t = 0; t < kVectorsPerLane; ++t) {  // every lane: Put shuffles
      const uint32_t j = lane + kGroupLanes * t;
      CodesOf<K> codes = 0;
      if (j < vectors) {
        const uint64_t at = first_element + uint64_t{j} * kPer;
        ACTPACK_UNROLL
        for (uint32_t e = 0; e < kPer; ++e) {
          const float r = division_math::Residual(VectorElement<K>(v[t], e), mean[t]);
          if (!portable::IsFinite(r)) continue;
          // The draws' key hashed once for the group where its values share it (nearly always).
          const float u = draws.one_key ? portable::UniformFromHashedKey(draws.hashed_key, at + e)
                                        : draws(at + e);
          codes |= CodesOf<K>{quant_math::Quantize(r, gp, u, levels)} << (e * l.bits);
        }
      }
      words.Put(t, codes, payload, &checksum);
    }
    words.Sum(gp.packed, param_word, &checksum);
  }
  CloseResidualLaunch(payload, l, checksum, nonfinite, overflow_groups, closing, status);
}

template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    DivisionResidualVectorKernel(const uint4* __restrict__ input, Layout l, MeanDivisors d,
                                 uint32_t* __restrict__ payload, LaunchClosing closing,
                                 DeviceStatus* __restrict__ status) {
  PooledLfc lfc{payload};
  ResidualVectorGroups<K>(input, l, d, lfc, payload, closing, status);
}

// division_dct's where its planes' values share one approximation (one kept frequency, no
// inner channels: a convolution's activations at the default keep).
template <int K>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    DctResidualVectorKernel(const uint4* __restrict__ input, Layout l, MeanDivisors d,
                            uint32_t* __restrict__ payload, LaunchClosing closing,
                            DeviceStatus* __restrict__ status) {
  CosineLfc<true> lfc{payload};  // VectorsShareApproximation: one kept frequency
  ResidualVectorGroups<K>(input, l, d, lfc, payload, closing, status);
}

// Value j of plane p's code and its group's parameters; adds to *checksum the terms of the
// payload words whose first reader it is among its code word (the word's first value) and its
// group's parameter word (the group's first value).
struct StoredResidual {
  uint32_t code;
  quant_math::GroupParams params;
};
__device__ __forceinline__ StoredResidual StoredResidualAt(const uint32_t* __restrict__ payload,
                                                           const Layout& l, const MeanDivisors& d,
                                                           uint64_t p, uint64_t j,
                                                           uint64_t* checksum) {
  const uint32_t word_shift = WordShift(l.bits);
  const uint32_t in_word = static_cast<uint32_t>(j) & ((1u << word_shift) - 1);  // j % (32 / bits)
  const uint64_t q = GroupOf(l, d, j);
  const uint64_t param_at = division_math::ParamWord(l, p * l.groups_per_plane + q);
  const uint32_t packed = payload[param_at];
  const uint64_t word_at = division_math::PlaneCodeWord(l, p) + (j >> word_shift);
  const uint32_t word = payload[word_at];
  if (in_word == 0) *checksum += portable::ChecksumTerm(word, word_at);
  if (j == q * l.group_length) *checksum += portable::ChecksumTerm(packed, param_at);
  return StoredResidual{(word >> (in_word * l.bits)) & ((1u << l.bits) - 1),
                        quant_math::UnpackGroupParams(packed)};
}

// Value j of plane p decoded; adds to *checksum the terms of the payload words whose first
// reader it is (StoredResidualAt's, the LFC's AtSumming's).
template <typename Lfc>
__device__ __forceinline__ float DecodeAt(const uint32_t* __restrict__ payload, const Lfc& lfc,
                                          const Layout& l, const MeanDivisors& d, uint64_t p,
                                          uint64_t j, uint64_t* checksum) {
  const StoredResidual stored = StoredResidualAt(payload, l, d, p, j, checksum);
  return division_math::Reconstruct(lfc.AtSumming(l, d, p, j, checksum), stored.code,
                                    stored.params);
}

// The 16-byte vector of values j0.. of plane p (j0 a multiple of the vector's values, so they
// share a group and one or two code words), with DecodeAt's checksum terms. `shared`: the
// vector's values share one approximation (VectorsShareApproximation).
template <int K, typename Lfc>
__device__ __forceinline__ uint4 DecodeVector(const uint32_t* __restrict__ payload,
                                              const Lfc& lfc, const Layout& l,
                                              const MeanDivisors& d, bool shared, uint64_t p,
                                              uint64_t j0, uint64_t* checksum) {
  constexpr uint32_t kPer = kValuesPerVector<K>;
  const uint32_t word_shift = WordShift(l.bits);
  const uint32_t per_word = 1u << word_shift;  // 32 / bits
  const uint32_t mask = (1u << l.bits) - 1;
  const uint64_t q = GroupOf(l, d, j0);
  const uint64_t param_at = division_math::ParamWord(l, p * l.groups_per_plane + q);
  const uint32_t packed = payload[param_at];
  if (j0 == q * l.group_length) *checksum += portable::ChecksumTerm(packed, param_at);
  const quant_math::GroupParams gp = quant_math::UnpackGroupParams(packed);
  // kPer * bits <= 64 and j0 % kPer == 0: the codes lie in word_at and, at 8 bits of a 16-bit
  // tensor, word_at + 1, each starting in this vector where it starts a word.
  const uint64_t word_at = division_math::PlaneCodeWord(l, p) + (j0 >> word_shift);
  const uint32_t word = payload[word_at];
  const bool two = kPer > per_word;
  const uint32_t next = two ? payload[word_at + 1] : 0u;
  const uint32_t in_word = static_cast<uint32_t>(j0) & (per_word - 1);
  if (in_word == 0) *checksum += portable::ChecksumTerm(word, word_at);
  if (two) *checksum += portable::ChecksumTerm(next, word_at + 1);
  const uint32_t shift = in_word * l.bits;
  float values[kPer];
  if (shared) {  // one approximation, and only the first value may be an LFC word's first reader
    const float approximation = lfc.AtSumming(l, d, p, j0, checksum);
    ACTPACK_UNROLL
    for (uint32_t e = 0; e < kPer; ++e) {
      const uint32_t bit = shift + e * l.bits;
      const uint32_t code = ((bit < 32 ? word >> bit : next >> (bit - 32))) & mask;
      values[e] = division_math::Reconstruct(approximation, code, gp);
    }
    return PackVector<K>(values);
  }
  ACTPACK_UNROLL
  for (uint32_t e = 0; e < kPer; ++e) {
    const uint32_t bit = shift + e * l.bits;
    const uint32_t code = ((bit < 32 ? word >> bit : next >> (bit - 32))) & mask;
    values[e] = division_math::Reconstruct(lfc.AtSumming(l, d, p, j0 + e, checksum), code, gp);
  }
  return PackVector<K>(values);
}

// The decode launch's work in either codec: a thread per 16-byte vector of output where
// `vectors_fit`, a value a thread elsewhere; the last block checks the buffer.
template <int K, typename Lfc>
__device__ __forceinline__ void DecodeValues(const uint32_t* __restrict__ payload, Lfc& lfc,
                                             const Layout& l, const MeanDivisors& d,
                                             bool vectors_fit, void* __restrict__ output,
                                             const LaunchClosing& closing,
                                             DeviceStatus* __restrict__ status) {
  lfc.Prepare(l);
  constexpr uint32_t kPer = kValuesPerVector<K>;
  const uint64_t numel = l.planes * l.plane;
  const uint64_t stride = uint64_t{gridDim.x} * blockDim.x;
  const uint64_t first = uint64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  uint64_t checksum = 0;
  uint64_t done = 0;  // the values the vectors wrote
  if (vectors_fit) {  // a vector's values lie in one plane
    const uint64_t vectors = numel / kPer;
    const bool shared = VectorsShareApproximation(l, kPer);
    for (uint64_t v = first; v < vectors; v += stride) {
      const uint64_t p = PlaneOf(l, d, v * kPer);
      const uint64_t j0 = v * kPer - p * l.plane;
      static_cast<uint4*>(output)[v] =
          DecodeVector<K>(payload, lfc, l, d, shared, p, j0, &checksum);
    }
    done = vectors * kPer;
  }
  for (uint64_t i = done + first; i < numel; i += stride) {
    const uint64_t p = PlaneOf(l, d, i);
    elements::Store<K>(output, i, DecodeAt(payload, lfc, l, d, p, i - p * l.plane, &checksum));
  }
  lfc.SumOtherWords(l, &checksum);
  WarpSumToGlobal(checksum, &status->decode_sum);
  CloseLaunch(closing, status);
}

template <int K>
__global__ void __launch_bounds__(kThreads)
    DivisionDecodeKernel(const uint32_t* __restrict__ payload, Layout l, MeanDivisors d,
                         bool vectors_fit, void* __restrict__ output, LaunchClosing closing,
                         DeviceStatus* __restrict__ status) {
  PooledLfc lfc{payload};
  DecodeValues<K>(payload, lfc, l, d, vectors_fit, output, closing, status);
}

template <int K>
__global__ void __launch_bounds__(kThreads)
    DctDecodeKernel(const uint32_t* __restrict__ payload, Layout l, MeanDivisors d,
                    bool vectors_fit, void* __restrict__ output, LaunchClosing closing,
                    DeviceStatus* __restrict__ status) {
  CosineLfc<false> lfc{payload};
  DecodeValues<K>(payload, lfc, l, d, vectors_fit, output, closing, status);
}

template <int K>
__global__ void __launch_bounds__(kThreads)
    DctMeanDecodeKernel(const uint32_t* __restrict__ payload, Layout l, MeanDivisors d,
                        bool vectors_fit, void* __restrict__ output, LaunchClosing closing,
                        DeviceStatus* __restrict__ status) {
  CosineLfc<true> lfc{payload};
  DecodeValues<K>(payload, lfc, l, d, vectors_fit, output, closing, status);
}

// Whether the vector residual kernels take `input`: 16-byte aligned, planes (so groups) of
// whole vectors, a vector's values sharing one approximation, a group in kVectorsPerLane vectors
// a lane.
bool ResidualVectorizable(const void* input, const Layout& l, uint32_t per) {
  return reinterpret_cast<uintptr_t>(input) % 16 == 0 && l.plane % per == 0 &&
         VectorsShareApproximation(l, per) &&
         l.group_length <= uint64_t{kGroupLanes} * kVectorsPerLane * per;
}

template <int K>
void LaunchEncode(const void* input, const Layout& layout, uint32_t* words,
                  const LaunchClosing& closing, DeviceStatus* status, cudaStream_t s) {
  const MeanDivisors divisors = division_math::MakeMeanDivisors(layout);
  const bool dct = layout.kept_rows > 0 || layout.planes == 0;  // (no values: either pair)
  // The LFC, launched where there are no values too: it zeroes the status.
  if (dct) {
    const ForwardTiling tiling = TilingOf(layout);
    const int blocks = BlocksFor(tiling.items, 1);
    uint16_t* halves = reinterpret_cast<uint16_t*>(words);
    if (layout.kept_rows <= 1 && layout.kept_columns <= 1) {  // one kept frequency, or no values
      ACTPACK_LAUNCH(DctMeanKernel<K>, blocks, kThreads, s)(input, layout, tiling, halves, status);
    } else {
      ACTPACK_LAUNCH(DctForwardKernel<K>, blocks, kThreads, s)(input, layout, tiling, halves,
                                                                status);
    }
  } else if (const uint32_t row_vectors = LfcRowVectors(input, layout, kValuesPerVector<K>)) {
    ACTPACK_LAUNCH(DivisionLfcVectorKernel<K>, BlocksFor(layout.lfc_words, kThreads), kThreads, s)(
        static_cast<const uint4*>(input), layout, row_vectors == 2, words, status);
  } else {
    ACTPACK_LAUNCH(DivisionLfcKernel<K>, BlocksFor(layout.lfc_words, kThreads), kThreads, s)(
        input, layout, words, status);
  }
  // The residual.
  if (ResidualVectorizable(input, layout, kValuesPerVector<K>)) {
    const int blocks = BlocksFor((layout.groups + 1) / 2, kWarpsPerBlock);  // two groups a warp
    const uint4* vectors = static_cast<const uint4*>(input);
    if (dct) {
      ACTPACK_LAUNCH(DctResidualVectorKernel<K>, blocks, kWarpsPerBlock * 32, s)(
          vectors, layout, divisors, words, closing, status);
    } else {
      ACTPACK_LAUNCH(DivisionResidualVectorKernel<K>, blocks, kWarpsPerBlock * 32, s)(
          vectors, layout, divisors, words, closing, status);
    }
  } else {
    const int blocks = BlocksFor(layout.groups, kWarpsPerBlock);
    if (dct && OneFrequency(layout)) {
      ACTPACK_LAUNCH(DctMeanResidualKernel<K>, blocks, kWarpsPerBlock * 32, s)(
          input, layout, divisors, words, closing, status);
    } else if (dct) {
      ACTPACK_LAUNCH(DctResidualKernel<K>, blocks, kWarpsPerBlock * 32, s)(
          input, layout, divisors, words, closing, status);
    } else {
      ACTPACK_LAUNCH(DivisionResidualKernel<K>, blocks, kWarpsPerBlock * 32, s)(
          input, layout, divisors, words, closing, status);
    }
  }
}

template <int K>
void LaunchDecode(const uint32_t* words, const Layout& layout, void* output,
                  const LaunchClosing& closing, DeviceStatus* status, cudaStream_t s) {
  const uint64_t numel = layout.planes * layout.plane;
  constexpr uint32_t kPer = kValuesPerVector<K>;
  const bool vectors_fit =
      reinterpret_cast<uintptr_t>(output) % 16 == 0 && layout.plane % kPer == 0;
  const int blocks = BlocksFor(vectors_fit ? numel / kPer : numel, kThreads);
  const MeanDivisors divisors = division_math::MakeMeanDivisors(layout);
  if (OneFrequency(layout)) {
    ACTPACK_LAUNCH(DctMeanDecodeKernel<K>, blocks, kThreads, s)(
        words, layout, divisors, vectors_fit, output, closing, status);
  } else if (layout.kept_rows > 0) {
    ACTPACK_LAUNCH(DctDecodeKernel<K>, blocks, kThreads, s)(words, layout, divisors, vectors_fit,
                                                            output, closing, status);
  } else {
    ACTPACK_LAUNCH(DivisionDecodeKernel<K>, blocks, kThreads, s)(
        words, layout, divisors, vectors_fit, output, closing, status);
  }
}

}  // namespace

absl::Status DivisionEncode(const void* input, const division_math::Layout& layout,
                            int element_kind, const HeaderWords& header, uint8_t* out,
                            DeviceStatus* status, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  uint32_t* words = reinterpret_cast<uint32_t*>(out + kHeaderWords * 4);
  const LaunchClosing closing = EncodeClosing(header, out);
  switch (element_kind) {  // coverage: every branch
    case elements::kF16: LaunchEncode<elements::kF16>(input, layout, words, closing, status, s); break;
    case elements::kBF16: LaunchEncode<elements::kBF16>(input, layout, words, closing, status, s); break;
    default: LaunchEncode<elements::kF32>(input, layout, words, closing, status, s);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

absl::Status DivisionDecode(const uint8_t* buffer, uint64_t capacity, const HeaderWords& expected,
                            uint32_t known, const division_math::Layout& layout,
                            int element_kind, void* output, DeviceStatus* status, void* stream) {
  const cudaStream_t s = static_cast<cudaStream_t>(stream);
  const uint32_t* words = reinterpret_cast<const uint32_t*>(buffer + kHeaderWords * 4);
  const LaunchClosing closing = DecodeClosing(buffer, capacity, expected, known);
  switch (element_kind) {  // coverage: every branch
    case elements::kF16: LaunchDecode<elements::kF16>(words, layout, output, closing, status, s); break;
    case elements::kBF16: LaunchDecode<elements::kBF16>(words, layout, output, closing, status, s); break;
    default: LaunchDecode<elements::kF32>(words, layout, output, closing, status, s);
  }
  ACTPACK_CUDA_RETURN_IF_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace actpack::codecs::cuda

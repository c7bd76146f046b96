// The vector kernels of `eb` (declared in simd.h): the block encoder and decoder and the value
// range of the relative bound. They compute what eb.cc's scalar reference computes, block by
// block, with the same arithmetic (eb_math.h): the first-pass quantizer per lane (the few values
// it misses go through eb_math::Quantize itself), residuals of all three predictors from a
// padded copy of the tile's codes, prefix sums for the inverse prediction, and bit packing
// unrolled per residual width.
//
// The kernels use vectors of at most 8 lanes on every target, so that AVX-512 runs the very
// lane arithmetic AVX2 runs (simd_test checks both where the CPU has them): a tile row of 16
// values is two vectors.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "codecs/internal/simd.h"

#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "codecs/internal/simd_eb.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// Must follow highway.h: it is compiled per target too.
#include "codecs/internal/simd-inl.h"

#include "codecs/internal/eb_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"

HWY_BEFORE_NAMESPACE();
namespace actpack::codecs::simd {
namespace HWY_NAMESPACE {

#if HWY_TARGET == HWY_SCALAR
// The scalar target never runs these (the codecs take the reference when not vectorized).
uint64_t EbEncodeBlocksVector(int, const void*, const eb_math::Layout&, const eb_math::Quantizer&,
                              uint64_t, uint64_t, uint32_t*, uint32_t*, uint64_t*, uint32_t*,
                              uint64_t*) {
  std::abort();
}
void EbDecodeBlocksVector(int, const uint32_t*, const uint32_t*, const eb_math::Layout&, float,
                          uint64_t, uint64_t, void*) {
  std::abort();
}
void EbRangeVector(int, const void*, uint64_t, uint64_t, EbRangeTotals*) { std::abort(); }
#else

using EF = hn::CappedTag<float, 8>;
using EI = hn::RebindToSigned<EF>;
using EU = hn::RebindToUnsigned<EF>;
using VF = hn::Vec<EF>;
using VI = hn::Vec<EI>;
using VU = hn::Vec<EU>;

constexpr uint32_t kValues = eb_math::kBlockValues;
// Room past a block's arrays for the lanes of a whole vector that run past its last value.
constexpr uint32_t kSpill = 8;
// A tile's codes with a border of anchors above and to the left: (rows + 1) x (cols + 1), at
// most 2 x 129 (runs of 128) or 9 x 17 (8 x 16 tiles).
constexpr uint32_t kGridValues = 2 * (kValues + 1) + kSpill;

// ---- bit packing, unrolled per width: value i at bits [i·W, (i + 1)·W) ----

// eb_math::PackValues with W known: 32 values fill W words, so each group of 32 is straight-
// line shifts; the last partial group takes PackValues itself.
template <uint32_t W>
void PackFixed(const uint32_t* v, uint32_t count, uint32_t* out) {
  if constexpr (W > 0) {
    uint32_t g = 0;
    for (; g + 32 <= count; g += 32) {
      uint32_t words[W] = {};
#pragma GCC unroll 32
      for (uint32_t j = 0; j < 32; ++j) {
        const uint32_t bit = j * W, word = bit >> 5, shift = bit & 31u;
        words[word] |= v[g + j] << shift;
        if (shift + W > 32) words[word + 1] |= v[g + j] >> (32 - shift);
      }
      std::memcpy(out + g / 32 * W, words, sizeof(words));
    }
    if (g < count) eb_math::PackValues(v + g, count - g, W, out + g / 32 * W);
  }
}

// eb_math::UnpackValues with W known; reads the same PackedWords(count, W) words.
template <uint32_t W>
void UnpackFixed(const uint32_t* in, uint32_t count, uint32_t* v) {
  if constexpr (W == 0) {
    std::memset(v, 0, 4 * count);
  } else {
    constexpr uint32_t kMask = W == 32 ? ~0u : (1u << W) - 1u;
    uint32_t g = 0;
    for (; g + 32 <= count; g += 32) {
      const uint32_t* src = in + g / 32 * W;
#pragma GCC unroll 32
      for (uint32_t j = 0; j < 32; ++j) {
        const uint32_t bit = j * W, word = bit >> 5, shift = bit & 31u;
        uint32_t x = src[word] >> shift;
        if (shift + W > 32) x |= src[word + 1] << (32 - shift);
        v[g + j] = x & kMask;
      }
    }
    if (g < count) eb_math::UnpackValues(in + g / 32 * W, count - g, W, v + g);
  }
}

using PackFn = void (*)(const uint32_t*, uint32_t, uint32_t*);

template <size_t... W>
constexpr std::array<PackFn, sizeof...(W)> PackTable(std::index_sequence<W...>) {
  return {&PackFixed<W>...};
}
template <size_t... W>
constexpr std::array<PackFn, sizeof...(W)> UnpackTable(std::index_sequence<W...>) {
  return {&UnpackFixed<W>...};
}

constexpr std::array<PackFn, eb_math::kMaxWidth + 1> kPack =
    PackTable(std::make_index_sequence<eb_math::kMaxWidth + 1>());
constexpr std::array<PackFn, eb_math::kMaxWidth + 1> kUnpack =
    UnpackTable(std::make_index_sequence<eb_math::kMaxWidth + 1>());

// ---- lanes ----

HWY_INLINE VU ZigZag(VI r) {
  const EU du;
  return hn::Xor(hn::ShiftLeft<1>(hn::BitCast(du, r)), hn::BitCast(du, hn::ShiftRight<31>(r)));
}

HWY_INLINE VI UnZigZag(VU z) {
  const EI di;
  const EU du;
  const VU low = hn::And(z, hn::Set(du, 1u));
  return hn::BitCast(di, hn::Xor(hn::ShiftRight<1>(z), hn::BitCast(du, hn::Neg(hn::BitCast(di, low)))));
}

// Inclusive prefix sums of the lanes (wrapping).
HWY_INLINE VI PrefixSum(VI v) {
  const EI di;
  v = hn::Add(v, hn::ShiftLeftLanes<1>(di, v));
  v = hn::Add(v, hn::ShiftLeftLanes<2>(di, v));
  if constexpr (hn::MaxLanes(EI()) > 4) {
    // ShiftLeftLanes stays within 128-bit blocks: add the lower block's total to the upper one.
    v = hn::Add(v, hn::ConcatLowerLower(di, hn::Broadcast<3>(v), hn::Zero(di)));
  }
  return v;
}

// The last lane in every lane.
HWY_INLINE VI BroadcastLast(VI v) {
  const EI di;
  if constexpr (hn::MaxLanes(EI()) > 4) {
    const VI upper = hn::Broadcast<3>(v);  // per 128-bit block
    return hn::ConcatUpperUpper(di, upper, upper);
  } else {
    return hn::Broadcast<hn::MaxLanes(EI()) - 1>(v);
  }
}

// eb_math::Dequantize per lane.
HWY_INLINE VF Dequantize(VI k, VF half_bin) {
  const EF df;
  const EI di;
  const EU du;
  const VU u = hn::BitCast(du, k);
  const VU m = hn::IfThenElse(hn::RebindMask(du, hn::Lt(k, hn::Zero(di))), hn::BitCast(du, hn::Neg(k)), u);
  const VF v = hn::Mul(
      hn::ConvertTo(df, hn::BitCast(di, hn::Sub(hn::Add(m, m), hn::Set(du, 1u)))), half_bin);
  const VU sign = hn::And(u, hn::Set(du, 0x80000000u));
  const VU bits = hn::IfThenZeroElse(hn::Eq(m, hn::Zero(du)), hn::Or(hn::BitCast(du, v), sign));
  return hn::BitCast(df, bits);
}

// Float to int32 by truncation for lanes known to be in range (Highway's ConvertTo also fixes
// up lanes out of range, which costs four more instructions on x86).
HWY_INLINE VI TruncateInRange(VF v) {
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
  static_assert(sizeof(v.raw) == 32, "8 lanes of 32 bits");
  return VI{_mm256_cvttps_epi32(v.raw)};
#else
  return hn::ConvertTo(EI(), v);
#endif
}

// The quantizer's constants as lanes.
struct QuantizerLanes {
  VF bin, half_bin;
  VI top, bound;
};

// eb.cc's first pass per lane (eb_math::FirstBin and BinFits, with comparisons of non-negative
// floats made on their bits): the code of each lane, and in *done whether it is final (coded or
// zero); a lane not done goes through eb_math::Quantize.
template <int K>
HWY_INLINE VI FirstPassCodes(VF x, const QuantizerLanes& q, hn::Mask<EI>* done) {
  const EF df;
  const EI di;
  const EU du;
  const VU bits = hn::BitCast(du, x);
  const VU abs_bits = hn::And(bits, hn::Set(du, 0x7fffffffu));
  const VF a = hn::BitCast(df, abs_bits);
  // a / 2q is >= 0 or a positive NaN: its bits compare as signed integers.
  const VI bin = hn::BitCast(di, hn::Div(a, q.bin));
  const hn::Mask<EI> in_range = hn::Not(hn::Gt(bin, q.top));
  const VI clamped_bits = hn::Min(bin, q.top);
  const VF clamped = hn::BitCast(df, clamped_bits);
  const VI one = hn::Set(di, 1);
  VI m = TruncateInRange(clamped);
  m = hn::Add(m, hn::IfThenElseZero(hn::Lt(hn::BitCast(di, hn::ConvertTo(df, m)), clamped_bits), one));
  m = hn::Max(m, one);
  const VF decoded = RoundToElement<K>(df, hn::Mul(hn::ConvertTo(df, hn::Sub(hn::Add(m, m), one)), q.half_bin));
  const VI decoded_bits = hn::BitCast(di, decoded);
  const VI error = hn::BitCast(di, hn::And(hn::BitCast(du, hn::Sub(a, decoded)), hn::Set(du, 0x7fffffffu)));
  const hn::Mask<EI> fit =
      hn::And(hn::And(in_range, hn::Not(hn::Eq(decoded_bits, hn::Zero(di)))),
              hn::And(hn::Lt(decoded_bits, hn::Set(di, 0x7f800000)), hn::Not(hn::Gt(error, q.bound))));
  const hn::Mask<EI> zero = hn::RebindMask(di, hn::Eq(abs_bits, hn::Zero(du)));
  *done = hn::Or(fit, zero);
  const hn::Mask<EI> negative = hn::Lt(hn::BitCast(di, bits), hn::Zero(di));
  const VI signed_m = hn::IfThenElse(negative, hn::Neg(m), m);
  return hn::IfThenElseZero(hn::AndNot(zero, fit), signed_m);
}

// Steps through the tiles of a layout in block order (eb_math::TileOf without its divisions).
class Tiles {
 public:
  Tiles(const eb_math::Layout& l, uint64_t block) : l_(l) {
    const uint64_t per_plane = l.tiles_down * l.tiles_across;
    plane_ = block / per_plane;
    const uint64_t rest = block - plane_ * per_plane;
    down_ = rest / l.tiles_across;
    across_ = rest - down_ * l.tiles_across;
  }

  eb_math::Tile Get() const {
    const uint64_t first_row = down_ * l_.tile_rows;
    const uint64_t first_col = across_ * l_.tile_cols;
    eb_math::Tile t;
    t.rows = static_cast<uint32_t>(std::min<uint64_t>(l_.rows - first_row, l_.tile_rows));
    t.cols = static_cast<uint32_t>(std::min<uint64_t>(l_.cols - first_col, l_.tile_cols));
    t.count = t.rows * t.cols;
    t.origin = (plane_ * l_.rows + first_row) * l_.cols + first_col;
    return t;
  }

  void Next() {
    if (++across_ < l_.tiles_across) return;
    across_ = 0;
    if (++down_ < l_.tiles_down) return;
    down_ = 0;
    ++plane_;
  }

 private:
  const eb_math::Layout& l_;
  uint64_t plane_, down_, across_;
};

template <int K>
constexpr uint32_t BytesOf() {
  return K == elements::kF32 ? 4 : 2;
}

// A tile's raw element bits as a verbatim block's words (two 16-bit elements a word, the last
// high half 0).
template <int K>
void CopyVerbatim(const void* input, const eb_math::Layout& l, const eb_math::Tile& t,
                  uint32_t* data) {
  constexpr uint32_t kBytes = BytesOf<K>();
  const uint8_t* in = static_cast<const uint8_t*>(input);
  uint8_t* out = reinterpret_cast<uint8_t*>(data);
  for (uint32_t r = 0; r < t.rows; ++r) {
    std::memcpy(out + kBytes * r * t.cols, in + kBytes * (t.origin + r * l.cols), kBytes * t.cols);
  }
  if (kBytes == 2 && t.count % 2 != 0) std::memset(out + 2 * t.count, 0, 2);
}

// One block, as eb.cc's EncodeBlock<K>: returns its header word; writes its data words (and
// their count to *data_words) and its outliers (in block order) to slots and raw.
template <int K>
uint32_t EncodeBlock(const void* input, const eb_math::Layout& l, const eb_math::Tile& t,
                     const eb_math::Quantizer& qz, const QuantizerLanes& ql, uint64_t b,
                     uint32_t* data, uint32_t* data_words, uint64_t* slots, uint32_t* raw,
                     uint32_t* outliers) {
  constexpr uint32_t kBytes = BytesOf<K>();
  const EF df;
  const EI di;
  const EU du;
  const uint32_t lanes = static_cast<uint32_t>(hn::Lanes(df));
  const uint32_t stride = t.cols + 1;
  alignas(HWY_MAX_BYTES) int32_t grid[kGridValues];
  alignas(HWY_MAX_BYTES) int32_t done_lanes[hn::MaxLanes(EI())];
  uint8_t outlier_at[kValues];
  uint32_t missed = 0;
  VI lo = hn::Set(di, INT32_MAX), hi = hn::Set(di, INT32_MIN);
  // The codes, into the grid below its border row and right of its border column. kWhole: all
  // lanes are values of the row (else the first n).
  const auto quantize = [&]<bool kWhole>(uint32_t r, uint32_t c, uint32_t n) {
    const uint64_t at = t.origin + r * l.cols + c;
    int32_t* codes = grid + (r + 1) * stride + 1 + c;
    const VF x = kWhole ? LoadElements<K>(df, input, at) : LoadElementsN<K>(df, input, at, n);
    hn::Mask<EI> done;
    VI k = FirstPassCodes<K>(x, ql, &done);
    hn::StoreU(k, di, codes);
    if (!kWhole) done = hn::Or(done, hn::Not(hn::FirstN(di, n)));
    if (HWY_UNLIKELY(!hn::AllTrue(di, done))) {
      hn::StoreU(hn::VecFromMask(di, done), di, done_lanes);
      for (uint32_t j = 0; j < n; ++j) {
        if (done_lanes[j] != 0) continue;
        if (!eb_math::Quantize<K>(elements::Load<K>(input, at + j), qz, &codes[j])) {
          outlier_at[missed++] = static_cast<uint8_t>(r * t.cols + c + j);
        }
      }
      k = hn::LoadU(di, codes);
    }
    if (kWhole) {
      lo = hn::Min(lo, k);
      hi = hn::Max(hi, k);
    } else {
      const hn::Mask<EI> valid = hn::FirstN(di, n);
      lo = hn::Min(lo, hn::IfThenElse(valid, k, hn::Set(di, INT32_MAX)));
      hi = hn::Max(hi, hn::IfThenElse(valid, k, hn::Set(di, INT32_MIN)));
    }
  };
  for (uint32_t r = 0; r < t.rows; ++r) {
    uint32_t c = 0;
    for (; c + lanes <= t.cols; c += lanes) quantize.template operator()<true>(r, c, lanes);
    if (c < t.cols) quantize.template operator()<false>(r, c, t.cols - c);
  }
  // Codes outside the tile count as the anchor, its first code.
  const int32_t anchor = grid[stride + 1];
  for (uint32_t c = 0; c < stride; ++c) grid[c] = anchor;
  for (uint32_t r = 1; r <= t.rows; ++r) grid[r * stride] = anchor;
  const int32_t lo_code = hn::GetLane(hn::MinOfLanes(di, lo));
  const int32_t hi_code = hn::GetLane(hn::MaxOfLanes(di, hi));
  const int32_t mid = eb_math::MidCode(lo_code, hi_code);
  // ZigZag residuals of the row and 2-D Lorenzo predictors, and the largest of each (its bit
  // width is that of the OR eb.cc takes). The offset predictor's largest residual is that of
  // the lowest or the highest code (ZigZag grows with |r|); its residuals are computed only if
  // it is chosen.
  alignas(HWY_MAX_BYTES) uint32_t zz[3][kValues + kSpill];
  VU max_row = hn::Zero(du), max_lorenzo = hn::Zero(du);
  const hn::Mask<EI> first_lane = hn::FirstN(di, 1);
  const auto residuals = [&]<bool kWhole>(uint32_t r, uint32_t c, uint32_t n) {
    const int32_t* at = grid + (r + 1) * stride + 1 + c;
    const VI here = hn::LoadU(di, at);
    const VI left = hn::LoadU(di, at - 1);
    const VI up = hn::LoadU(di, at - stride);
    const VI up_left = hn::LoadU(di, at - stride - 1);
    // Row prediction: the left neighbour, the one above in the first column.
    const VI row_prediction = c == 0 ? hn::IfThenElse(first_lane, up, left) : left;
    VU z1 = ZigZag(hn::Sub(here, row_prediction));
    VU z2 = ZigZag(hn::Add(hn::Sub(hn::Sub(here, left), up), up_left));
    // Lanes past the row land where the next row's values go, which overwrite them.
    const uint32_t i = r * t.cols + c;
    hn::StoreU(z1, du, zz[1] + i);
    hn::StoreU(z2, du, zz[2] + i);
    if (!kWhole) {
      const hn::Mask<EU> valid = hn::FirstN(du, n);
      z1 = hn::IfThenElseZero(valid, z1);
      z2 = hn::IfThenElseZero(valid, z2);
    }
    max_row = hn::Max(max_row, z1);
    max_lorenzo = hn::Max(max_lorenzo, z2);
  };
  for (uint32_t r = 0; r < t.rows; ++r) {
    uint32_t c = 0;
    for (; c + lanes <= t.cols; c += lanes) residuals.template operator()<true>(r, c, lanes);
    if (c < t.cols) residuals.template operator()<false>(r, c, t.cols - c);
  }
  const auto zigzag_from_mid = [&](int32_t code) {
    return eb_math::ZigZag(
        static_cast<int32_t>(static_cast<uint32_t>(code) - static_cast<uint32_t>(mid)));
  };
  const uint32_t max_offset = std::max(zigzag_from_mid(lo_code), zigzag_from_mid(hi_code));
  const eb_math::BlockChoice choice = eb_math::ChooseBlock(
      max_offset, hn::GetLane(hn::MaxOfLanes(du, max_row)),
      hn::GetLane(hn::MaxOfLanes(du, max_lorenzo)), mid, anchor, missed, t.count, kBytes);
  const uint32_t mode = eb_math::HeaderMode(choice.header);
  *data_words = choice.data_words;
  *outliers = choice.outliers;
  if (mode == eb_math::kVerbatim) {
    CopyVerbatim<K>(input, l, t, data);
    return choice.header;
  }
  if (mode == eb_math::kOffset) {
    // Tile values are row after row in zz; the grid's rows are a border column apart.
    const VI mid_lanes = hn::Set(di, mid);
    for (uint32_t r = 0; r < t.rows; ++r) {
      for (uint32_t c = 0; c < t.cols; c += lanes) {
        const VI here = hn::LoadU(di, grid + (r + 1) * stride + 1 + c);
        hn::StoreU(ZigZag(hn::Sub(here, mid_lanes)), du, zz[0] + r * t.cols + c);
      }
    }
  }
  kPack[eb_math::HeaderWidth(choice.header)](zz[mode - 1], t.count, data);
  for (uint32_t j = 0; j < missed; ++j) {
    slots[j] = b * kValues + outlier_at[j];
    raw[j] = elements::LoadBits<kBytes>(input, eb_math::ElementOf(l, t, outlier_at[j]));
  }
  return choice.header;
}

template <int K>
uint64_t EncodeBlocks(const void* input, const eb_math::Layout& l, const eb_math::Quantizer& qz,
                      uint64_t first, uint64_t last, uint32_t* headers, uint32_t* data,
                      uint64_t* slots, uint32_t* raw, uint64_t* outliers) {
  const EF df;
  const EI di;
  QuantizerLanes ql;
  ql.bin = hn::Set(df, qz.bin);
  ql.half_bin = hn::Set(df, qz.half_bin);
  ql.top = hn::Set(di, static_cast<int32_t>(portable::FloatBits(static_cast<float>(eb_math::kMaxCode))));
  ql.bound = hn::Set(di, static_cast<int32_t>(portable::FloatBits(qz.bound)));
  uint64_t words = 0, listed = 0;
  Tiles tiles(l, first);
  for (uint64_t b = first; b < last; ++b, tiles.Next()) {
    uint32_t block_words = 0, block_outliers = 0;
    headers[b - first] = EncodeBlock<K>(input, l, tiles.Get(), qz, ql, b, data + words,
                                        &block_words, slots + listed, raw + listed,
                                        &block_outliers);
    words += block_words;
    listed += block_outliers;
  }
  *outliers = listed;
  return words;
}

uint64_t EbEncodeBlocksVector(int kind, const void* input, const eb_math::Layout& l,
                              const eb_math::Quantizer& qz, uint64_t first, uint64_t last,
                              uint32_t* headers, uint32_t* data, uint64_t* slots, uint32_t* raw,
                              uint64_t* outliers) {
  return WithKind(kind, [&](auto k) {
    return EncodeBlocks<decltype(k)::value>(input, l, qz, first, last, headers, data, slots, raw,
                                            outliers);
  });
}

// One (validated) block, as eb.cc's DecodeBlock<K>.
template <int K>
void DecodeBlock(const uint32_t* data, uint32_t h, const eb_math::Layout& l,
                 const eb_math::Tile& t, VF half_bin, void* output) {
  constexpr uint32_t kBytes = BytesOf<K>();
  const EF df;
  const EI di;
  const EU du;
  const uint32_t lanes = static_cast<uint32_t>(hn::Lanes(df));
  const uint32_t mode = eb_math::HeaderMode(h);
  if (mode == eb_math::kVerbatim) {
    const uint8_t* in = reinterpret_cast<const uint8_t*>(data);
    uint8_t* out = static_cast<uint8_t*>(output);
    for (uint32_t r = 0; r < t.rows; ++r) {
      std::memcpy(out + kBytes * (t.origin + r * l.cols), in + kBytes * r * t.cols,
                  kBytes * t.cols);
    }
    return;
  }
  alignas(HWY_MAX_BYTES) uint32_t z[kValues + kSpill];
  kUnpack[eb_math::HeaderWidth(h)](data, t.count, z);
  // k' = k - anchor per value (wrapping), row by row: row prediction adds the row's running sum
  // to the first column's value above; 2-D Lorenzo adds it to the row above.
  alignas(HWY_MAX_BYTES) int32_t previous[kValues + kSpill];  // k' of the row above
  const VI anchor = hn::Set(di, eb_math::HeaderAnchor(h));
  for (uint32_t r = 0; r < t.rows; ++r) {
    const uint64_t row = t.origin + r * l.cols;
    // The running sum along the row, in every lane: from the first column's k' above (row
    // prediction) or 0. Only a whole vector passes it on (the last of a row may be partial).
    VI carry = hn::Set(di, mode == eb_math::kRow && r > 0 ? previous[0] : 0);
    for (uint32_t c = 0; c < t.cols; c += lanes) {
      const uint32_t n = std::min(lanes, t.cols - c);
      VI k = UnZigZag(hn::LoadU(du, z + r * t.cols + c));
      if (mode != eb_math::kOffset) {
        k = hn::Add(PrefixSum(k), carry);
        carry = BroadcastLast(k);
        if (mode == eb_math::kLorenzo && r > 0) k = hn::Add(k, hn::LoadU(di, previous + c));
        // In place: this row's lanes past its end land where no row reads.
        hn::StoreU(k, di, previous + c);
      }
      const VF v = Dequantize(hn::Add(k, anchor), half_bin);
      if (n == lanes) {
        StoreElements<K>(df, v, output, row + c);
      } else {
        StoreElementsN<K>(df, v, output, row + c, n);
      }
    }
  }
}

template <int K>
void DecodeBlocks(const uint32_t* headers, const uint32_t* data, const eb_math::Layout& l,
                  float half_bin, uint64_t first, uint64_t last, void* output) {
  const VF q = hn::Set(EF(), half_bin);
  Tiles tiles(l, first);
  for (uint64_t b = first; b < last; ++b, tiles.Next()) {
    const eb_math::Tile t = tiles.Get();
    const uint32_t h = headers[b - first];
    DecodeBlock<K>(data, h, l, t, q, output);
    data += eb_math::DataWords(h, t.count, BytesOf<K>());
  }
}

void EbDecodeBlocksVector(int kind, const uint32_t* headers, const uint32_t* data,
                          const eb_math::Layout& l, float half_bin, uint64_t first, uint64_t last,
                          void* output) {
  return WithKind(kind, [&](auto k) {
    DecodeBlocks<decltype(k)::value>(headers, data, l, half_bin, first, last, output);
  });
}

// ---- the relative bound's range ----

// eb.cc's RangeOf: the smallest and largest finite value and the finite count. (Which zero a
// range ends on may differ from the reference's: the bound uses only hi - lo and |lo|, |hi|.)
template <int K>
void Range(const void* input, uint64_t begin, uint64_t end, EbRangeTotals* totals) {
  const EF df;
  const EI di;
  const uint64_t lanes = hn::Lanes(df);
  VF lo = hn::Set(df, portable::BitsToFloat(0x7f800000u));
  VF hi = hn::Neg(lo);
  VI finite = hn::Zero(di);
  const VI one = hn::Set(di, 1);
  const auto add = [&](VF v, hn::Mask<EF> counted) {
    lo = hn::IfThenElse(counted, hn::Min(lo, v), lo);
    hi = hn::IfThenElse(counted, hn::Max(hi, v), hi);
    finite = hn::Add(finite, hn::IfThenElseZero(hn::RebindMask(di, counted), one));
  };
  uint64_t i = begin;
  // Counts per lane stay below 2^31: flush them every 2^30 vectors.
  uint64_t flushed = 0;
  for (; i + lanes <= end; i += lanes) {
    const VF v = LoadElements<K>(df, input, i);
    add(v, IsFiniteLanes(df, v));
    if (++flushed == (uint64_t{1} << 30)) {
      totals->finite += static_cast<uint64_t>(hn::GetLane(hn::SumOfLanes(di, finite)));
      finite = hn::Zero(di);
      flushed = 0;
    }
  }
  if (i < end) {
    const VF v = LoadElementsN<K>(df, input, i, end - i);
    add(v, hn::And(hn::FirstN(df, end - i), IsFiniteLanes(df, v)));
  }
  totals->lo = std::min(totals->lo, hn::GetLane(hn::MinOfLanes(df, lo)));
  totals->hi = std::max(totals->hi, hn::GetLane(hn::MaxOfLanes(df, hi)));
  totals->finite += static_cast<uint64_t>(hn::GetLane(hn::SumOfLanes(di, finite)));
}

void EbRangeVector(int kind, const void* input, uint64_t begin, uint64_t end,
                   EbRangeTotals* totals) {
  return WithKind(kind, [&](auto k) { Range<decltype(k)::value>(input, begin, end, totals); });
}

#endif  // HWY_TARGET == HWY_SCALAR

}  // namespace HWY_NAMESPACE
}  // namespace actpack::codecs::simd
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace actpack::codecs::simd {

HWY_EXPORT(EbEncodeBlocksVector);
HWY_EXPORT(EbDecodeBlocksVector);
HWY_EXPORT(EbRangeVector);

uint64_t EbEncodeBlocks(int kind, const void* input, const eb_math::Layout& l,
                        const eb_math::Quantizer& qz, uint64_t first, uint64_t last,
                        uint32_t* headers, uint32_t* data, uint64_t* slots, uint32_t* raw,
                        uint64_t* outliers) {
  return HWY_DYNAMIC_DISPATCH(EbEncodeBlocksVector)(kind, input, l, qz, first, last, headers,
                                                    data, slots, raw, outliers);
}

void EbDecodeBlocks(int kind, const uint32_t* headers, const uint32_t* data,
                    const eb_math::Layout& l, float half_bin, uint64_t first, uint64_t last,
                    void* output) {
  HWY_DYNAMIC_DISPATCH(EbDecodeBlocksVector)(kind, headers, data, l, half_bin, first, last,
                                             output);
}

void EbRange(int kind, const void* input, uint64_t begin, uint64_t end, EbRangeTotals* totals) {
  HWY_DYNAMIC_DISPATCH(EbRangeVector)(kind, input, begin, end, totals);
}

}  // namespace actpack::codecs::simd
#endif  // HWY_ONCE

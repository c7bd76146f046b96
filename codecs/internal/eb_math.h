// Strict error-bounded prediction coding (`eb`, in the spirit of cuSZ/cuSZp): the arithmetic
// shared by the CPU reference (eb.cc) and the CUDA kernels (cuda/eb_kernels.cu), so that both
// write the same bytes. FORMAT.md specifies the payload; this header is the one place that
// computes it.
//
// Quantizer. With half-bin q, a value x != 0 falls in bin m = max(1, ceil(|x| / 2q)), i.e.
// |x| in ((m - 1)·2q, m·2q], and decodes to the bin's centre sign(x)·(2m - 1)·q. Zero is its
// own code (k = 0 decodes to +0), so no value changes sign or becomes zero: a tiny x decodes to
// ±q. The code is k = sign(x)·m. Every value is checked in float after rounding to its dtype;
// one that misses the bound (a bin edge where the float division rounded the wrong way and the
// neighbouring bin does not fit either, a decoded half that overflows or underflows) or is not
// finite or whose |k| would exceed kMaxCode is an outlier: stored exactly, its code set to 0.
//
// Prediction ("dual quantization"): codes, not floats, are predicted, so decoding is exact
// integer arithmetic and every block decodes on its own. A block is a tile of at most 128
// values (FORMAT.md: 8 x 16 over the last two dims, or 128 consecutive values); inside it the
// encoder picks the predictor with the narrowest residuals: the block's mid code (kOffset), the
// left neighbour (kRow, the first column predicted from above), or 2-D Lorenzo (kLorenzo);
// neighbours outside the tile count as the anchor, so the first value's residual is 0.
// Residuals are zigzagged and packed with one bit width per block; a block that would not get
// smaller than its raw bits is stored verbatim.
//
// This header is included by nvcc (C++17): it must not include Abseil.
#ifndef ACTPACK_CODECS_INTERNAL_EB_MATH_H_
#define ACTPACK_CODECS_INTERNAL_EB_MATH_H_

#include <cstdint>

#include "codecs/internal/elements.h"
#include "codecs/internal/portable.h"

namespace actpack::codecs::eb_math {

inline constexpr uint32_t kBlockValues = 128;
inline constexpr uint32_t kTileRows = 8;    // 2-D tiles: 8 x 16
inline constexpr uint32_t kTileCols = 16;
inline constexpr uint32_t kBlocksPerChunk = 32;  // one chunk-index entry per 32 blocks
inline constexpr int32_t kMaxCode = 1 << 23;     // keeps 2|k| - 1 exact in float
inline constexpr uint32_t kMaxAnchor = 1u << 24;  // ZigZag of a code
inline constexpr uint32_t kMaxWidth = 27;        // the widest residual (2-D Lorenzo)
inline constexpr uint32_t kOutlierWords = 3;     // uint64 slot + one word of raw bits

// A block's predictor; the low 2 bits of its header word.
enum Mode : uint32_t { kVerbatim = 0, kOffset = 1, kRow = 2, kLorenzo = 3 };

// How a tensor is cut into blocks: planes of [rows, cols], each cut into tiles of
// tile_rows x tile_cols (the last tile of a row or column of tiles may be smaller).
struct Layout {
  uint64_t rows;
  uint64_t cols;
  uint32_t tile_rows;
  uint32_t tile_cols;
  uint64_t tiles_down;    // ceil(rows / tile_rows)
  uint64_t tiles_across;  // ceil(cols / tile_cols)
  uint64_t blocks;
  uint64_t chunks;  // ceil(blocks / kBlocksPerChunk)
};

// 2-D tiles (dims = 2) over [planes, rows, cols], or 1-D blocks of 128 (dims = 1, the whole
// tensor as one row of `cols` values).
ACTPACK_HD Layout MakeLayout(int dims, uint64_t planes, uint64_t rows, uint64_t cols) {
  Layout l;
  l.rows = rows;
  l.cols = cols;
  l.tile_rows = dims == 2 ? kTileRows : 1;
  l.tile_cols = dims == 2 ? kTileCols : kBlockValues;
  l.tiles_down = (rows + l.tile_rows - 1) / l.tile_rows;
  l.tiles_across = (cols + l.tile_cols - 1) / l.tile_cols;
  l.blocks = planes * l.tiles_down * l.tiles_across;
  l.chunks = (l.blocks + kBlocksPerChunk - 1) / kBlocksPerChunk;
  return l;
}

// Where a payload's sections start, in 32-bit words: the block headers (one word a block), the
// chunk index (a uint64 per chunk: where its blocks' data starts), the block data, the outliers'
// uint64 slots and their raw bits. The CPU reference and the CUDA kernels both place and find
// the sections through this.
struct Sections {
  uint64_t index;
  uint64_t data;
  uint64_t slots;
  uint64_t raw;
  uint64_t end;          // the payload's size in words
  uint64_t fixed_words;  // everything but the block data
};

ACTPACK_HD Sections SectionsOf(const Layout& l, uint64_t data_words, uint64_t outliers) {
  Sections s;
  s.index = l.blocks;
  s.data = l.blocks + 2 * l.chunks;
  s.slots = s.data + data_words;
  s.raw = s.slots + 2 * outliers;
  s.end = s.raw + outliers;
  s.fixed_words = s.data + kOutlierWords * outliers;
  return s;
}

// One block: its first element, its extent, and its value count.
struct Tile {
  uint64_t origin;
  uint32_t rows;
  uint32_t cols;
  uint32_t count;
};

ACTPACK_HD Tile TileOf(const Layout& l, uint64_t block) {
  const uint64_t per_plane = l.tiles_down * l.tiles_across;
  const uint64_t plane = block / per_plane;
  const uint64_t rest = block - plane * per_plane;
  const uint64_t tile_row = rest / l.tiles_across;
  const uint64_t first_row = tile_row * l.tile_rows;
  const uint64_t first_col = (rest - tile_row * l.tiles_across) * l.tile_cols;
  Tile t;
  t.rows = static_cast<uint32_t>(l.rows - first_row < l.tile_rows ? l.rows - first_row
                                                                  : l.tile_rows);
  t.cols = static_cast<uint32_t>(l.cols - first_col < l.tile_cols ? l.cols - first_col
                                                                  : l.tile_cols);
  t.count = t.rows * t.cols;
  t.origin = (plane * l.rows + first_row) * l.cols + first_col;
  return t;
}

// The tensor element of value `i` of a tile (values are numbered row-major inside the tile).
ACTPACK_HD uint64_t ElementOf(const Layout& l, const Tile& t, uint32_t i) {
  const uint32_t r = i / t.cols;
  return t.origin + r * l.cols + (i - r * t.cols);
}

// ---- quantizer ----

struct Quantizer {
  float half_bin;  // q: what a code step is worth on each side of a bin's centre
  float bin;       // 2q
  float bound;     // every finite value decodes within this of its input
};

ACTPACK_HD Quantizer MakeQuantizer(float half_bin, float bound) {
  return Quantizer{half_bin, portable::Add(half_bin, half_bin), bound};
}

// A larger half-bin would make the bin 2q or a decoded centre overflow.
inline constexpr float kMaxHalfBin = 0x1p100f;
inline constexpr float kMinNormal = 0x1p-126f;
// The bound modes as the header stores them (codec.h's EbMode).
inline constexpr int kAbsolute = 1;
inline constexpr int kRelative = 2;

// The largest float <= v (v >= 0); 0 below the smallest subnormal.
ACTPACK_HD float FloatAtMost(double v) {
  constexpr double kFloatMax = 3.4028234663852886e38;
  v = v < kFloatMax ? v : kFloatMax;
  float f = static_cast<float>(v);  // to nearest, on both devices
  // f > v >= 0: the next float towards zero.
  if (static_cast<double>(f) > v) f = portable::BitsToFloat(portable::FloatBits(f) - 1);
  return f;
}

// The quantizer for a bound mode (kAbsolute, kRelative) and value, given the finite values'
// range [lo, hi] (`finite` false when there is none). The CPU and the GPU encoders both call
// this with the same range.
ACTPACK_HD Quantizer QuantizerFor(int mode, double value, float lo, float hi, bool finite) {
  double bound = value;
  if (mode == kRelative) {
    bound = finite ? value * (static_cast<double>(hi) - static_cast<double>(lo)) : 0.0;
  }
  const float b = FloatAtMost(bound);
  if (b >= kMinNormal) return MakeQuantizer(b < kMaxHalfBin ? b : kMaxHalfBin, b);
  // A zero bound (every finite value is the same, relative mode): only exact reconstructions
  // pass. Centring the bins on that value keeps it exact: k = ±1 decodes to ±q = the value.
  const float abs_lo = portable::BitsToFloat(portable::FloatBits(lo) & 0x7fffffffu);
  const float abs_hi = portable::BitsToFloat(portable::FloatBits(hi) & 0x7fffffffu);
  const float top = finite ? (abs_lo > abs_hi ? abs_lo : abs_hi) : 0.0f;
  const float q = top >= kMinNormal && top <= kMaxHalfBin ? top : 1.0f;
  return MakeQuantizer(q, b);
}

// `v` as the decoded tensor holds it: rounded to the element type.
template <int K>
ACTPACK_HD float RoundTo(float v) {
  if constexpr (K == elements::kF32) {
    return v;
  } else if constexpr (K == elements::kF16) {
    return portable::HalfToFloat(portable::FloatToHalf(v));
  } else {
    return portable::Bf16ToFloat(portable::FloatToBf16(v));
  }
}

// The decoded value of code k before rounding to the element type: sign(k)·(2|k| - 1)·q.
// Unsigned arithmetic: a corrupt code decodes to some value, never to undefined behaviour.
// Branch-free, so CPU loops over it vectorize.
ACTPACK_HD float Dequantize(int32_t k, float half_bin) {
  const uint32_t m = k < 0 ? 0u - static_cast<uint32_t>(k) : static_cast<uint32_t>(k);
  // 2m - 1 converts from int32 (exact for every valid code; SIMD has no unsigned conversion).
  const float v = portable::Mul(static_cast<float>(static_cast<int32_t>(2u * m - 1u)), half_bin);
  const uint32_t sign = static_cast<uint32_t>(k) & 0x80000000u;
  const uint32_t keep = 0u - static_cast<uint32_t>(m != 0);  // code 0 decodes to +0
  return portable::BitsToFloat((portable::FloatBits(v) | sign) & keep);
}

// Whether |a| decoding to `decoded` (> 0 required: no sign change, no flush to zero) is within
// the bound. a - decoded is exact in float whenever it is near the bound (the two are within a
// factor of 2, or decoded = q and the difference stays in q's binade), so the test is strict.
ACTPACK_HD bool Fits(float a, float decoded, float bound) {
  const float error = portable::Sub(a, decoded);
  return decoded > 0.0f && portable::IsFinite(decoded) &&
         portable::BitsToFloat(portable::FloatBits(error) & 0x7fffffffu) <= bound;
}

// The first bin tried for |x| = a > 0: ceil(a / 2q), at least 1; 0 when x is not finite or
// beyond the code range (an outlier).
ACTPACK_HD int32_t FirstBin(float a, const Quantizer& qz) {
  const float t = portable::Div(a, qz.bin);
  const bool in_range = t <= static_cast<float>(kMaxCode);  // false for NaN and infinity
  const float clamped = in_range ? t : 0.0f;
  int32_t m = static_cast<int32_t>(clamped);
  m += static_cast<float>(m) < clamped ? 1 : 0;
  m = m < 1 ? 1 : m;
  return in_range ? m : 0;
}

// Whether bin m >= 1 decodes |x| = a within the bound, in the element type.
template <int K>
ACTPACK_HD bool BinFits(float a, int32_t m, const Quantizer& qz) {
  return Fits(a, RoundTo<K>(Dequantize(m, qz.half_bin)), qz.bound);
}

// The code of x; false when x must be stored exactly (the code is then 0).
template <int K>
ACTPACK_HD bool Quantize(float x, const Quantizer& qz, int32_t* code) {
  const uint32_t bits = portable::FloatBits(x);
  const float a = portable::BitsToFloat(bits & 0x7fffffffu);
  if (a == 0.0f) {  // both zeros: code 0, decoded +0
    *code = 0;
    return true;
  }
  int32_t m = FirstBin(a, qz);
  bool fits = m > 0 && BinFits<K>(a, m, qz);
  if (m > 0 && !fits) {
    // The rounded division may put a value right at a bin edge into the wrong bin: the
    // neighbouring centre is as close in exact arithmetic.
    const float decoded = RoundTo<K>(Dequantize(m, qz.half_bin));
    const int32_t other = a > decoded ? m + 1 : m - 1;
    if (other >= 1 && other <= kMaxCode && BinFits<K>(a, other, qz)) {
      m = other;
      fits = true;
    }
  }
  const bool negative = (bits >> 31) != 0;
  *code = fits ? (negative ? -m : m) : 0;
  return fits;
}

// ---- residuals ----

ACTPACK_HD uint32_t ZigZag(int32_t r) {
  return (static_cast<uint32_t>(r) << 1) ^ (0u - (static_cast<uint32_t>(r) >> 31));
}

ACTPACK_HD int32_t UnZigZag(uint32_t z) {
  return static_cast<int32_t>((z >> 1) ^ (0u - (z & 1u)));
}

// Bits needed for v (0 for 0).
ACTPACK_HD uint32_t BitWidth(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return 32u - static_cast<uint32_t>(__clz(v));
#else
  return v == 0 ? 0u : 32u - static_cast<uint32_t>(__builtin_clz(v));
#endif
}

// The residual of value i (row r, column c) of a tile under `mode`, from the codes k of the
// tile laid out with row stride `stride`. Codes outside the tile count as the anchor.
// Wrapping unsigned arithmetic: in range for every code the encoder produces.
ACTPACK_HD int32_t Residual(uint32_t mode, const int32_t* k, uint32_t stride, uint32_t r,
                            uint32_t c, int32_t anchor) {
  const uint32_t a = static_cast<uint32_t>(anchor);
  const uint32_t* u = reinterpret_cast<const uint32_t*>(k);
  const uint32_t here = u[r * stride + c] - a;
  if (mode == kOffset) return static_cast<int32_t>(here);
  const uint32_t left = c > 0 ? u[r * stride + c - 1] - a : 0u;
  const uint32_t up = r > 0 ? u[(r - 1) * stride + c] - a : 0u;
  if (mode == kRow) return static_cast<int32_t>(c > 0 ? here - left : here - up);
  const uint32_t up_left = r > 0 && c > 0 ? u[(r - 1) * stride + c - 1] - a : 0u;
  return static_cast<int32_t>(here - left - up + up_left);
}

// The offset predictor's anchor: the middle of the block's codes, rounded down.
ACTPACK_HD int32_t MidCode(int32_t lo, int32_t hi) {
  return static_cast<int32_t>((static_cast<int64_t>(lo) + hi) >> 1);
}

// ---- block headers and sizes ----

// Header word: bits 0..1 mode, 2..6 residual width, 7..31 ZigZag(anchor).
ACTPACK_HD uint32_t HeaderWord(uint32_t mode, uint32_t width, uint32_t anchor_zigzag) {
  return mode | (width << 2) | (anchor_zigzag << 7);
}
ACTPACK_HD uint32_t HeaderMode(uint32_t h) { return h & 3u; }
ACTPACK_HD uint32_t HeaderWidth(uint32_t h) { return (h >> 2) & 31u; }
ACTPACK_HD int32_t HeaderAnchor(uint32_t h) { return UnZigZag(h >> 7); }

ACTPACK_HD bool ValidHeader(uint32_t h) {
  if (HeaderMode(h) == kVerbatim) return (h >> 2) == 0;
  return HeaderWidth(h) <= kMaxWidth && (h >> 7) <= kMaxAnchor;
}

// Words of a verbatim block: the raw element bits, two 16-bit elements per word.
ACTPACK_HD uint32_t VerbatimWords(uint32_t count, uint32_t element_bytes) {
  return element_bytes == 4 ? count : (count + 1) / 2;
}

ACTPACK_HD uint32_t PackedWords(uint32_t count, uint32_t width) {
  return (count * width + 31) / 32;
}

// Data words of a block with (valid) header h.
ACTPACK_HD uint32_t DataWords(uint32_t h, uint32_t count, uint32_t element_bytes) {
  return HeaderMode(h) == kVerbatim ? VerbatimWords(count, element_bytes)
                                    : PackedWords(count, HeaderWidth(h));
}

// The most data words blocks [0, block) can take: each its verbatim size. (Every tile before
// the last column of tiles is tile_cols wide; every tile row but the last is tile_rows high.)
ACTPACK_HD uint64_t VerbatimWordsBefore(const Layout& l, uint64_t block, uint32_t element_bytes) {
  if (l.blocks == 0) return 0;
  const uint64_t per_plane = l.tiles_down * l.tiles_across;
  const uint64_t plane = block / per_plane;
  const uint64_t rest = block - plane * per_plane;
  const uint64_t tile_row = rest / l.tiles_across;
  const uint64_t tile_col = rest - tile_row * l.tiles_across;
  const uint64_t last_cols = l.cols - (l.tiles_across - 1) * l.tile_cols;
  const uint64_t last_rows = l.rows - (l.tiles_down - 1) * l.tile_rows;
  // The first `tiles` tiles of a tile row `rows` high.
  const auto row_words = [&](uint64_t rows, uint64_t tiles) {
    const uint64_t full = tiles < l.tiles_across ? tiles : l.tiles_across - 1;
    uint64_t words = full * VerbatimWords(static_cast<uint32_t>(rows * l.tile_cols), element_bytes);
    if (tiles == l.tiles_across) {
      words += VerbatimWords(static_cast<uint32_t>(rows * last_cols), element_bytes);
    }
    return words;
  };
  const uint64_t full_row = row_words(l.tile_rows, l.tiles_across);
  const uint64_t plane_words = (l.tiles_down - 1) * full_row + row_words(last_rows, l.tiles_across);
  const uint64_t rows_here = tile_row + 1 == l.tiles_down ? last_rows : l.tile_rows;
  return plane * plane_words + tile_row * full_row + row_words(rows_here, tile_col);
}

struct BlockChoice {
  uint32_t header;
  uint32_t data_words;
  uint32_t outliers;  // listed outliers (none for a verbatim block)
};

// The predictor with the narrowest residuals (the first of offset, row, Lorenzo on a tie),
// given the OR of each one's ZigZag residuals; verbatim when packing would not save a word
// (outliers cost kOutlierWords each).
ACTPACK_HD BlockChoice ChooseBlock(uint32_t or_offset, uint32_t or_row, uint32_t or_lorenzo,
                                   int32_t mid_anchor, int32_t first_anchor, uint32_t outliers,
                                   uint32_t count, uint32_t element_bytes) {
  uint32_t mode = kOffset;
  uint32_t width = BitWidth(or_offset);
  if (BitWidth(or_row) < width) {  // coverage: every branch
    mode = kRow;
    width = BitWidth(or_row);
  }
  if (BitWidth(or_lorenzo) < width) {  // coverage: every branch
    mode = kLorenzo;
    width = BitWidth(or_lorenzo);
  }
  const uint32_t packed = PackedWords(count, width);
  const uint32_t verbatim = VerbatimWords(count, element_bytes);
  if (static_cast<uint64_t>(packed) + uint64_t{kOutlierWords} * outliers >= verbatim) {  // coverage: every branch
    return BlockChoice{HeaderWord(kVerbatim, 0, 0), verbatim, 0};
  }
  const int32_t anchor = mode == kOffset ? mid_anchor : first_anchor;
  return BlockChoice{HeaderWord(mode, width, ZigZag(anchor)), packed, outliers};
}

// ---- bit packing: value i of a block occupies bits [i·width, (i + 1)·width) of its words,
// least significant bit first; bits past the last value are 0 ----

// Packs v[0 .. count) into PackedWords(count, width) words, one value after the other (the
// CPU's sequential form; PackWord is the same bits one word at a time, for a warp).
ACTPACK_HD void PackValues(const uint32_t* v, uint32_t count, uint32_t width, uint32_t* out) {
  if (width == 0) return;
  uint64_t acc = 0;
  uint32_t filled = 0;
  for (uint32_t i = 0; i < count; ++i) {
    acc |= static_cast<uint64_t>(v[i]) << filled;
    filled += width;
    if (filled >= 32) {
      *out++ = static_cast<uint32_t>(acc);
      acc >>= 32;
      filled -= 32;
    }
  }
  if (filled > 0) *out = static_cast<uint32_t>(acc);
}

// Word t of PackValues' output (width > 0).
ACTPACK_HD uint32_t PackWord(const uint32_t* v, uint32_t count, uint32_t width, uint32_t t) {
  uint32_t word = 0;
  const uint32_t first_bit = 32 * t;
  for (uint32_t i = first_bit / width; i < count; ++i) {
    const uint32_t bit = i * width;
    if (bit >= first_bit + 32) break;
    word |= bit >= first_bit ? v[i] << (bit - first_bit) : v[i] >> (first_bit - bit);
  }
  return word;
}

// Unpacks `count` values of `width` <= kMaxWidth bits, reading PackedWords(count, width) words.
ACTPACK_HD void UnpackValues(const uint32_t* words, uint32_t count, uint32_t width,
                             uint32_t* v) {
  const uint32_t mask = width == 0 ? 0u : (1u << width) - 1u;
  uint64_t acc = 0;
  uint32_t available = 0;
  for (uint32_t i = 0; i < count; ++i) {
    if (available < width) {
      acc |= static_cast<uint64_t>(*words++) << available;
      available += 32;
    }
    v[i] = static_cast<uint32_t>(acc) & mask;
    acc >>= width;
    available -= width;
  }
}

// Value i of UnpackValues' output, on its own (reads only the words holding its bits).
ACTPACK_HD uint32_t UnpackValue(const uint32_t* words, uint32_t i, uint32_t width) {
  if (width == 0) return 0;
  const uint32_t bit = i * width;
  const uint32_t shift = bit & 31u;
  uint64_t pair = words[bit >> 5];
  if (shift + width > 32) pair |= static_cast<uint64_t>(words[(bit >> 5) + 1]) << 32;
  return static_cast<uint32_t>(pair >> shift) & ((1u << width) - 1u);
}

}  // namespace actpack::codecs::eb_math

#endif  // ACTPACK_CODECS_INTERNAL_EB_MATH_H_

#include "codecs/eb.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/types/span.h"
#include "codecs/internal/cuda_status.h"
#include "codecs/internal/element_kind.h"
#include "codecs/internal/eb_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/parallel.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/simd.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs {
namespace {

using eb_math::Layout;
using eb_math::Quantizer;
using eb_math::Tile;

constexpr double kMinRelative = 1e-10;
constexpr double kMaxRelative = 1.0;
constexpr double kMinAbsolute = 1e-30;
constexpr double kMaxAbsolute = 1e30;
using eb_math::kMaxHalfBin;
using eb_math::kMinNormal;
// Chunks of 32 blocks per parallel task: about 64 Ki values.
constexpr int64_t kChunkGrain = 16;

// Blocks of the tensor: 8 x 16 tiles over the last two dims when they are at least 8 and 16
// (narrower tiles spend too much on headers: FORMAT.md has the measurements), else runs of
// 128 along the flattened tensor.
int LayoutDims(absl::Span<const int64_t> shape) {
  const size_t n = shape.size();
  return n >= 2 && shape[n - 2] >= eb_math::kTileRows && shape[n - 1] >= eb_math::kTileCols ? 2
                                                                                            : 1;
}

struct Shape {
  int dims;
  uint64_t planes, rows, cols;
};

Shape ShapeOf(absl::Span<const int64_t> shape, uint64_t numel) {
  if (LayoutDims(shape) == 2) {
    // rows * cols <= numel unless another dim is 0 (then it may overflow): no division then.
    const uint64_t rows = shape[shape.size() - 2], cols = shape.back();
    return {2, numel == 0 ? 0 : numel / (rows * cols), rows, cols};
  }
  return {1, 1, 1, numel};
}

Layout LayoutOf(const Shape& s) { return eb_math::MakeLayout(s.dims, s.planes, s.rows, s.cols); }

using eb_math::Sections;
using eb_math::SectionsOf;

// The most data + outlier words the blocks can take: each at most its verbatim size.
uint64_t MaxBlockWords(const Layout& l, uint64_t numel, size_t element_bytes) {
  return element_bytes == 4 ? numel : (numel + l.blocks + 1) / 2;
}

// The most outliers the blocks can list: a block lists its outliers (kOutlierWords each) only
// when they and its packed words take fewer words than its verbatim size.
[[maybe_unused]] uint64_t MaxOutliers(const Layout& l, uint64_t numel, size_t element_bytes) {
  return MaxBlockWords(l, numel, element_bytes) / eb_math::kOutlierWords;
}

// The largest payload of a shape (what MaxPayloadSize gives, less the encoder's scratch).
uint64_t MaxPayloadBytes(const Layout& l, uint64_t numel, size_t element_bytes) {
  return 4 * (SectionsOf(l, 0, 0).fixed_words + MaxBlockWords(l, numel, element_bytes));
}

uint64_t ReadU64(const uint32_t* words, uint64_t i) {
  return words[2 * i] | static_cast<uint64_t>(words[2 * i + 1]) << 32;
}

void WriteU64(uint32_t* words, uint64_t i, uint64_t value) {
  words[2 * i] = static_cast<uint32_t>(value);
  words[2 * i + 1] = static_cast<uint32_t>(value >> 32);
}

struct Params {
  EbMode mode;
  int dims;
  float half_bin;
  float bound;
  uint64_t outliers;
};

void WriteParams(const Params& p, Header* header) {
  header->params.fill(0);
  header->params[0] = static_cast<uint8_t>(p.mode);
  header->params[1] = static_cast<uint8_t>(p.dims);
  std::memcpy(header->params.data() + 4, &p.half_bin, 4);
  std::memcpy(header->params.data() + 8, &p.bound, 4);
  std::memcpy(header->params.data() + 16, &p.outliers, 8);
}

// The header's parameters; with `resolved` false, only those the host writes (the bound mode
// and the layout: the rest the device decided, and they are 0 here).
absl::StatusOr<Params> ReadParams(const Header& header, bool resolved = true) {
  Params p{};
  const uint8_t mode = header.params[0];
  if (mode != static_cast<uint8_t>(EbMode::kAbsolute) &&
      mode != static_cast<uint8_t>(EbMode::kRelative)) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt eb buffer: bound mode ", mode,
                                            ", expected 1 (absolute) or 2 (relative)"));
  }
  p.mode = static_cast<EbMode>(mode);
  p.dims = header.params[1];
  const int dims = LayoutDims(header.Shape());
  if (p.dims != dims) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt eb buffer: block layout ", p.dims,
                                            ", the shape takes ", dims));
  }
  for (const auto& [first, last] : {std::pair<size_t, size_t>{2, 4}, {12, 16}}) {
    absl::Status unused = CheckParamBytesZero(header, first, last, "eb");
    if (!unused.ok()) return unused;
  }
  if (!resolved) return p;
  std::memcpy(&p.half_bin, header.params.data() + 4, 4);
  std::memcpy(&p.bound, header.params.data() + 8, 4);
  std::memcpy(&p.outliers, header.params.data() + 16, 8);
  if (!(p.half_bin >= kMinNormal && p.half_bin <= kMaxHalfBin)) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt eb buffer: half-bin ", p.half_bin,
                                            ", expected a normal float up to 2^100"));
  }
  if (!(p.bound >= 0.0f && portable::IsFinite(p.bound))) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt eb buffer: bound ", p.bound));
  }
  if (p.outliers > header.numel) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt eb buffer: ", p.outliers,
                                            " outliers in ", header.numel, " values"));
  }
  return p;
}

// ---- CPU encoder ----

// What one parallel task encodes: its blocks' data words and outliers, copied into place once
// every task's sizes are known.
struct TaskOutput {
  std::vector<uint32_t> data;
  std::vector<uint64_t> slots;
  std::vector<uint32_t> raw;
  // The vector kernels write a task's data words into the payload itself, from where the task's
  // blocks would start if every block before them were verbatim (the most they can take), and
  // they are moved down into place once every task's size is known.
  const uint32_t* in_place = nullptr;
  uint64_t in_place_words = 0;
};

// Appends v[0 .. count) packed at `width` bits.
void AppendPacked(const uint32_t* v, uint32_t count, uint32_t width, std::vector<uint32_t>* out) {
  const size_t size = out->size();
  out->resize(size + eb_math::PackedWords(count, width));
  eb_math::PackValues(v, count, width, out->data() + size);
}

template <int K>
constexpr int WidthOf() {
  return K == elements::kF32 ? 4 : 2;
}

// The ZigZag residuals of a tile's codes k (row-major, `cols` per row) under `mode`, as
// eb_math::Residual defines them, in loops the compiler vectorizes. Row and 2-D Lorenzo
// residuals do not depend on their anchor (the tile's first code) but at value 0, where they
// are 0.
void Residuals(uint32_t mode, const int32_t* k, uint32_t rows, uint32_t cols, int32_t mid,
               uint32_t* zz) {
  const uint32_t* u = reinterpret_cast<const uint32_t*>(k);
  const uint32_t count = rows * cols;
  if (mode == eb_math::kOffset) {
    const uint32_t anchor = static_cast<uint32_t>(mid);
    for (uint32_t i = 0; i < count; ++i) zz[i] = eb_math::ZigZag(u[i] - anchor);
    return;
  }
  zz[0] = 0;
  for (uint32_t c = 1; c < cols; ++c) zz[c] = eb_math::ZigZag(u[c] - u[c - 1]);
  for (uint32_t r = 1; r < rows; ++r) {
    const uint32_t* here = u + r * cols;
    const uint32_t* up = here - cols;
    uint32_t* out = zz + r * cols;
    out[0] = eb_math::ZigZag(here[0] - up[0]);
    if (mode == eb_math::kRow) {
      for (uint32_t c = 1; c < cols; ++c) out[c] = eb_math::ZigZag(here[c] - here[c - 1]);
    } else {
      for (uint32_t c = 1; c < cols; ++c) {
        out[c] = eb_math::ZigZag(here[c] - here[c - 1] - up[c] + up[c - 1]);
      }
    }
  }
}

uint32_t OrOf(const uint32_t* v, uint32_t count) {
  uint32_t acc = 0;
  for (uint32_t i = 0; i < count; ++i) acc |= v[i];
  return acc;
}

// Encodes block b; returns its header word and appends its data and outliers to `out`.
template <int K>
uint32_t EncodeBlock(const void* input, const Layout& l, const Quantizer& qz, uint64_t b,
                     TaskOutput* out) {
  constexpr uint32_t kBytes = WidthOf<K>();
  const Tile t = eb_math::TileOf(l, b);
  float x[eb_math::kBlockValues];
  int32_t k[eb_math::kBlockValues];
  uint8_t fits[eb_math::kBlockValues];
  for (uint32_t r = 0; r < t.rows; ++r) {
    const uint64_t row = t.origin + r * l.cols;
    float* dst = x + r * t.cols;
    for (uint32_t c = 0; c < t.cols; ++c) dst[c] = elements::Load<K>(input, row + c);
  }
  // eb_math::Quantize in two passes: its first bin for every value, then the full function
  // again for the few values that bin misses. The first pass is FirstBin and BinFits written
  // to vectorize: float comparisons and conversions may trap, so nothing that could is left
  // conditional: the comparisons, all of non-negative floats (or NaN, which must compare
  // false), are made on their bits, the bin is clamped before it converts, and 2m - 1 < 2^24
  // converts exactly either way.
  uint32_t misses = 0;
  const uint32_t top = portable::FloatBits(static_cast<float>(eb_math::kMaxCode));
  const uint32_t bound = portable::FloatBits(qz.bound);
  for (uint32_t i = 0; i < t.count; ++i) {
    const uint32_t bits = portable::FloatBits(x[i]);
    const uint32_t abs_bits = bits & 0x7fffffffu;
    const float a = portable::BitsToFloat(abs_bits);
    const float bin = portable::Div(a, qz.bin);
    const bool in_range = portable::FloatBits(bin) <= top;
    const float clamped = portable::BitsToFloat(std::min(portable::FloatBits(bin), top));
    int32_t m = static_cast<int32_t>(clamped);
    m += portable::FloatBits(static_cast<float>(m)) < portable::FloatBits(clamped) ? 1 : 0;
    m = std::max(m, 1);
    const uint32_t decoded = portable::FloatBits(
        eb_math::RoundTo<K>(portable::Mul(static_cast<float>(2 * m - 1), qz.half_bin)));
    const uint32_t error = portable::FloatBits(portable::Sub(a, portable::BitsToFloat(decoded))) &
                           0x7fffffffu;
    const bool fit = in_range & (decoded != 0) & (decoded < 0x7f800000u) & (error <= bound);
    const bool zero = abs_bits == 0;
    const bool coded = fit & !zero;
    const bool done = fit | zero;
    const int32_t signed_m = bits >> 31 ? -m : m;
    k[i] = coded ? signed_m : 0;
    fits[i] = done;
    misses += done ? 0u : 1u;
  }
  uint32_t outliers = 0;
  if (misses > 0) {
    for (uint32_t i = 0; i < t.count; ++i) {
      if (fits[i]) continue;
      fits[i] = eb_math::Quantize<K>(x[i], qz, &k[i]) ? 1 : 0;
      outliers += fits[i] ? 0u : 1u;
    }
  }
  int32_t lo = k[0], hi = k[0];
  for (uint32_t i = 1; i < t.count; ++i) {
    lo = std::min(lo, k[i]);
    hi = std::max(hi, k[i]);
  }
  const int32_t mid = eb_math::MidCode(lo, hi);
  uint32_t zz[3][eb_math::kBlockValues];
  Residuals(eb_math::kOffset, k, t.rows, t.cols, mid, zz[0]);
  Residuals(eb_math::kRow, k, t.rows, t.cols, mid, zz[1]);
  Residuals(eb_math::kLorenzo, k, t.rows, t.cols, mid, zz[2]);
  const eb_math::BlockChoice choice =
      eb_math::ChooseBlock(OrOf(zz[0], t.count), OrOf(zz[1], t.count), OrOf(zz[2], t.count), mid,
                           k[0], outliers, t.count, kBytes);
  const uint32_t mode = eb_math::HeaderMode(choice.header);
  if (mode == eb_math::kVerbatim) {
    uint32_t raw[eb_math::kBlockValues];
    for (uint32_t i = 0; i < t.count; ++i) {
      raw[i] = elements::LoadBits<kBytes>(input, eb_math::ElementOf(l, t, i));
    }
    AppendPacked(raw, t.count, 8 * kBytes, &out->data);
    return choice.header;
  }
  AppendPacked(zz[mode - 1], t.count, eb_math::HeaderWidth(choice.header), &out->data);
  if (outliers > 0) {
    for (uint32_t i = 0; i < t.count; ++i) {
      if (fits[i]) continue;
      out->slots.push_back(b * eb_math::kBlockValues + i);
      out->raw.push_back(elements::LoadBits<kBytes>(input, eb_math::ElementOf(l, t, i)));
    }
  }
  return choice.header;
}

// Encodes chunks [begin, end) with the vector kernels: the block headers into `words`, the
// data words in place (TaskOutput::in_place), each chunk's data word count into chunk_words,
// the outliers into *out.
void VectorEncodeChunks(const void* input, DType dtype, const Layout& l, const Quantizer& qz,
                        int64_t begin, int64_t end, uint32_t* words, uint64_t* chunk_words,
                        TaskOutput* out) {
  constexpr size_t kChunkValues = size_t{eb_math::kBlocksPerChunk} * eb_math::kBlockValues;
  const uint32_t element_bytes = static_cast<uint32_t>(ElementSize(dtype));
  uint32_t* data = words + SectionsOf(l, 0, 0).data +
                   eb_math::VerbatimWordsBefore(l, begin * eb_math::kBlocksPerChunk, element_bytes);
  out->in_place = data;
  uint64_t data_used = 0, outliers_used = 0;
  for (int64_t c = begin; c < end; ++c) {
    // Room for a chunk's every value as an outlier; grows geometrically (rarely past one chunk).
    if (out->slots.size() < outliers_used + kChunkValues) {
      const size_t size = std::max(2 * out->slots.size(), outliers_used + kChunkValues);
      out->slots.resize(size);
      out->raw.resize(size);
    }
    const uint64_t first = c * eb_math::kBlocksPerChunk;
    const uint64_t last = std::min<uint64_t>(l.blocks, first + eb_math::kBlocksPerChunk);
    uint64_t outliers = 0;
    chunk_words[c] = simd::EbEncodeBlocks(elements::KindOf(dtype), input, l, qz, first, last,
                                          words + first, data + data_used,
                                          out->slots.data() + outliers_used,
                                          out->raw.data() + outliers_used, &outliers);
    data_used += chunk_words[c];
    outliers_used += outliers;
  }
  out->in_place_words = data_used;
  out->slots.resize(outliers_used);
  out->raw.resize(outliers_used);
}

// Calls fn.template operator()<K>() for the dtype's element kind.
template <typename Fn>
void DispatchKind(DType dtype, Fn&& fn) {
  switch (dtype) {
    case DType::kFloat16: fn.template operator()<elements::kF16>(); break;
    case DType::kBFloat16: fn.template operator()<elements::kBF16>(); break;
    default: fn.template operator()<elements::kF32>(); break;
  }
}

struct Range {
  float lo = std::numeric_limits<float>::infinity();
  float hi = -std::numeric_limits<float>::infinity();
  uint64_t finite = 0;
};

template <int K>
Range RangeOf(const void* input, int64_t begin, int64_t end) {
  Range r;
  for (int64_t i = begin; i < end; ++i) {
    const float v = elements::Load<K>(input, i);
    const bool finite = portable::IsFinite(v);
    r.finite += finite ? 1 : 0;
    r.lo = finite ? portable::Min(r.lo, v) : r.lo;
    r.hi = finite ? portable::Max(r.hi, v) : r.hi;
  }
  return r;
}

Range CpuRange(const void* input, DType dtype, uint64_t numel) {
  std::vector<Range> partials(internal::MaxParallelChunks());
  internal::ParallelFor(numel, 65536, [&](int chunk, int64_t begin, int64_t end) {
    if (simd::Vectorized()) {
      simd::EbRangeTotals totals;
      simd::EbRange(elements::KindOf(dtype), input, begin, end, &totals);
      partials[chunk] = Range{totals.lo, totals.hi, totals.finite};
      return;
    }
    DispatchKind(dtype, [&]<int K>() { partials[chunk] = RangeOf<K>(input, begin, end); });
  });
  Range total;
  for (const Range& r : partials) {
    total.lo = std::min(total.lo, r.lo);
    total.hi = std::max(total.hi, r.hi);
    total.finite += r.finite;
  }
  return total;
}

// Writes the payload; returns its size in words and the outlier count.
std::pair<uint64_t, uint64_t> CpuEncode(const void* input, DType dtype, const Layout& l,
                                        const Quantizer& qz, uint32_t* words) {
  const int tasks = internal::MaxParallelChunks();
  std::vector<TaskOutput> outputs(tasks);
  std::vector<int64_t> first_chunk(tasks, -1);
  std::vector<uint64_t> chunk_words(l.chunks);
  internal::ParallelFor(l.chunks, kChunkGrain, [&](int task, int64_t begin, int64_t end) {
    first_chunk[task] = begin;
    TaskOutput* out = &outputs[task];
    if (simd::Vectorized()) {
      VectorEncodeChunks(input, dtype, l, qz, begin, end, words, chunk_words.data(), out);
      return;
    }
    DispatchKind(dtype, [&]<int K>() {
      for (int64_t c = begin; c < end; ++c) {
        const size_t before = out->data.size();
        const uint64_t last = std::min<uint64_t>(l.blocks, (c + 1) * eb_math::kBlocksPerChunk);
        for (uint64_t b = c * eb_math::kBlocksPerChunk; b < last; ++b) {
          words[b] = EncodeBlock<K>(input, l, qz, b, out);
        }
        chunk_words[c] = out->data.size() - before;
      }
    });
  });
  uint64_t outliers = 0;
  for (const TaskOutput& out : outputs) outliers += out.slots.size();
  const uint64_t index = SectionsOf(l, 0, outliers).index;
  uint64_t data_words = 0;
  for (uint64_t c = 0; c < l.chunks; ++c) {
    WriteU64(words + index, c, data_words);
    data_words += chunk_words[c];
  }
  const Sections s = SectionsOf(l, data_words, outliers);
  // Tasks cover the chunks in order, so concatenating their outliers keeps slot order.
  std::vector<uint64_t> outlier_start(tasks, 0);
  for (int t = 1; t < tasks; ++t) {
    outlier_start[t] = outlier_start[t - 1] + outputs[t - 1].slots.size();
  }
  uint32_t* slots = words + s.slots;
  uint32_t* raw = words + s.raw;
  // In task order: a task's data moves down to where its blocks start, below the data of every
  // later task (those start at their worst case, past this task's worst case).
  for (int t = 0; t < tasks; ++t) {
    if (first_chunk[t] < 0 || outputs[t].in_place_words == 0) continue;
    std::memmove(words + s.data + ReadU64(words + s.index, first_chunk[t]), outputs[t].in_place,
                 4 * outputs[t].in_place_words);
  }
  internal::ParallelFor(tasks, 1, [&](int, int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const TaskOutput& out = outputs[t];
      if (first_chunk[t] < 0) continue;
      if (!out.data.empty()) {  // memcpy from an empty vector's null data is undefined
        std::memcpy(words + s.data + ReadU64(words + s.index, first_chunk[t]), out.data.data(),
                    4 * out.data.size());
      }
      for (size_t j = 0; j < out.slots.size(); ++j) {
        WriteU64(slots, outlier_start[t] + j, out.slots[j]);
        raw[outlier_start[t] + j] = out.raw[j];
      }
    }
  });
  return {s.end, outliers};
}

// ---- CPU decoder ----

// Checks every block header against the chunk index and the data size.
absl::Status ValidateBlocks(const uint32_t* words, const Layout& l, const Sections& s,
                            uint64_t data_words, uint32_t element_bytes) {
  uint64_t offset = 0;
  for (uint64_t b = 0; b < l.blocks; ++b) {
    if (b % eb_math::kBlocksPerChunk == 0) {
      const uint64_t c = b / eb_math::kBlocksPerChunk;
      const uint64_t start = ReadU64(words + s.index, c);
      if (start != offset) {
        return absl::DataLossError(absl::StrCat("actpack: corrupt eb buffer: chunk ", c,
                                                " starts at data word ", start,
                                                ", its blocks start at ", offset));
      }
    }
    const uint32_t h = words[b];
    if (!eb_math::ValidHeader(h)) {
      return absl::DataLossError(absl::StrFormat(
          "actpack: corrupt eb buffer: block %d has header 0x%08x (mode %d, width %d)", b, h,
          eb_math::HeaderMode(h), eb_math::HeaderWidth(h)));
    }
    offset += eb_math::DataWords(h, eb_math::TileOf(l, b).count, element_bytes);
    if (offset > data_words) break;
  }
  if (offset != data_words) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt eb buffer: the blocks hold ",
                                            offset, " data words, the payload ", data_words));
  }
  return absl::OkStatus();
}

absl::Status ValidateOutliers(const uint32_t* words, const Layout& l, const uint32_t* slots,
                              const uint32_t* raw, uint64_t outliers, uint32_t element_bytes) {
  uint64_t previous = 0;
  for (uint64_t j = 0; j < outliers; ++j) {
    const uint64_t slot = ReadU64(slots, j);
    if (j > 0 && slot <= previous) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt eb buffer: outlier ", j,
                                              " at slot ", slot, " follows slot ", previous));
    }
    previous = slot;
    const uint64_t b = slot / eb_math::kBlockValues;
    const uint64_t i = slot % eb_math::kBlockValues;
    if (b >= l.blocks || i >= eb_math::TileOf(l, b).count ||
        eb_math::HeaderMode(words[b]) == eb_math::kVerbatim) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt eb buffer: outlier ", j,
                                              " at slot ", slot, " is not a coded value"));
    }
    if (element_bytes == 2 && raw[j] > 0xffffu) {
      return absl::DataLossError(absl::StrFormat(
          "actpack: corrupt eb buffer: outlier %d of a 16-bit tensor has bits 0x%08x", j, raw[j]));
    }
  }
  return absl::OkStatus();
}

// Decodes block b from its data words (validated).
template <int K>
void DecodeBlock(const uint32_t* data, uint32_t h, const Layout& l, float half_bin, uint64_t b,
                 void* output) {
  constexpr uint32_t kBytes = WidthOf<K>();
  const Tile t = eb_math::TileOf(l, b);
  const uint32_t mode = eb_math::HeaderMode(h);
  if (mode == eb_math::kVerbatim) {
    for (uint32_t i = 0; i < t.count; ++i) {
      const uint32_t bits = kBytes == 4 ? data[i] : (data[i / 2] >> (16 * (i % 2))) & 0xffffu;
      elements::StoreBits<kBytes>(output, eb_math::ElementOf(l, t, i), bits);
    }
    return;
  }
  // Inverse prediction in wrapping unsigned arithmetic (a corrupt buffer decodes to some values,
  // never to undefined behaviour): k' = k - anchor, then k = k' + anchor.
  uint32_t k[eb_math::kBlockValues];
  eb_math::UnpackValues(data, t.count, eb_math::HeaderWidth(h), k);
  for (uint32_t i = 0; i < t.count; ++i) k[i] = static_cast<uint32_t>(eb_math::UnZigZag(k[i]));
  const uint32_t n = t.cols;
  if (mode == eb_math::kRow) {
    for (uint32_t r = 0; r < t.rows; ++r) {
      if (r > 0) k[r * n] += k[(r - 1) * n];
      for (uint32_t c = 1; c < n; ++c) k[r * n + c] += k[r * n + c - 1];
    }
  } else if (mode == eb_math::kLorenzo) {
    for (uint32_t r = 0; r < t.rows; ++r) {
      for (uint32_t c = 1; c < n; ++c) k[r * n + c] += k[r * n + c - 1];
      if (r > 0) {
        for (uint32_t c = 0; c < n; ++c) k[r * n + c] += k[(r - 1) * n + c];
      }
    }
  }
  const uint32_t anchor = static_cast<uint32_t>(eb_math::HeaderAnchor(h));
  float v[eb_math::kBlockValues];
  for (uint32_t i = 0; i < t.count; ++i) {
    v[i] = eb_math::Dequantize(static_cast<int32_t>(k[i] + anchor), half_bin);
  }
  for (uint32_t r = 0; r < t.rows; ++r) {
    const uint64_t row = t.origin + r * l.cols;
    for (uint32_t c = 0; c < n; ++c) elements::Store<K>(output, row + c, v[r * n + c]);
  }
}

class Eb final : public Codec {
 public:
  CodecId id() const override { return CodecId::kEb; }
  absl::string_view name() const override { return "eb"; }
  bool lossless() const override { return false; }
  // One bound: 1e-3 stores about twice quant8's bytes, where quant8 is as accurate.
  std::vector<std::string> AutoSpecs() const override { return {"eb:rel=1e-2"}; }

  absl::Status CheckEncodable(const TensorSpec& spec, const CodecParams& params) const override {
    if (!IsLossyFloat(spec.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actpack: eb encodes float32, float16 and bfloat16 tensors, not ", DTypeName(spec.dtype)));
    }
    const double v = params.error_bound;
    if (params.eb_mode == EbMode::kRelative) {
      if (!(v >= kMinRelative && v <= kMaxRelative)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "actpack: eb relative bound rel must be in [1e-10, 1], not ", v));
      }
    } else if (params.eb_mode == EbMode::kAbsolute) {
      if (!(v >= kMinAbsolute && v <= kMaxAbsolute)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "actpack: eb absolute bound abs must be in [1e-30, 1e30], not ", v));
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat("actpack: eb bound mode ",
                                                     static_cast<int>(params.eb_mode),
                                                     " is neither absolute (1) nor relative (2)"));
    }
    return absl::OkStatus();
  }

  // The payload's worst case, plus scratch the CUDA encoder uses past it (16 bytes a chunk).
  uint64_t MaxPayloadSize(const TensorSpec& spec, const CodecParams&) const override {
    const Layout l = LayoutOf(ShapeOf(spec.shape, spec.numel()));
    return MaxPayloadBytes(l, spec.numel(), ElementSize(spec.dtype)) + 8 + 16 * l.chunks;
  }

  absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input, const CodecParams& params,
                                            Header* header, uint8_t* payload,
                                            const ExecContext& context,
                                            DeviceStatus* status) const override {
    const Shape shape = ShapeOf(input.shape, header->numel);
    const Layout l = LayoutOf(shape);
    Params p{params.eb_mode, shape.dims, 0.0f, 0.0f, 0};
    uint64_t payload_words = 0;
    uint64_t checksum = 0;
    if (input.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      const cuda::EbShape cs{shape.dims, shape.planes, shape.rows, shape.cols,
                             elements::KindOf(input.dtype)};
      // Scratch past the worst-case payload, 8-byte aligned.
      const uint64_t max_bytes =
          MaxPayloadBytes(l, header->numel, ElementSize(input.dtype));
      const uintptr_t end = reinterpret_cast<uintptr_t>(payload + max_bytes);
      uint8_t* scratch = payload + max_bytes + ((8 - end % 8) % 8);
      absl::Status queued =
          cuda::EbEncode(input.data, cs, static_cast<int>(params.eb_mode), params.error_bound,
                         payload, scratch, status, context.stream);
      if (!queued.ok()) return queued;
      WriteParams(p, header);  // the mode and layout; the device adds the rest
      PayloadInfo info{max_bytes, 0};
      info.params_on_device = true;
      info.size_on_device = true;
      return info;
#else
      return internal::CudaNotCompiledIn("eb encode");
#endif
    } else {
      Range range;
      if (params.eb_mode == EbMode::kRelative) range = CpuRange(input.data, input.dtype, header->numel);
      const Quantizer qz = eb_math::QuantizerFor(static_cast<int>(params.eb_mode),
                                                 params.error_bound, range.lo, range.hi,
                                                 range.finite > 0);
      p.half_bin = qz.half_bin;
      p.bound = qz.bound;
      const auto [used, outliers] =
          CpuEncode(input.data, input.dtype, l, qz, reinterpret_cast<uint32_t*>(payload));
      payload_words = used;
      p.outliers = outliers;
      checksum = PayloadChecksum(payload, 4 * payload_words);
    }
    WriteParams(p, header);
    return PayloadInfo{4 * payload_words, checksum};
  }

  absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                             const MutableTensorView& output, const ExecContext& context,
                             DeviceStatus* status) const override {
    if (!IsLossyFloat(header.dtype)) {
      return absl::DataLossError(
          absl::StrCat("actpack: corrupt eb buffer: dtype ", DTypeName(header.dtype)));
    }
    absl::StatusOr<Params> params = ReadParams(header);
    if (!params.ok()) return params.status();
    const Params& p = *params;
    const Shape shape = ShapeOf(header.Shape(), header.numel);
    const Layout l = LayoutOf(shape);
    const uint64_t fixed_words = SectionsOf(l, 0, p.outliers).fixed_words;
    if (header.payload_size % 4 != 0 || header.payload_size / 4 < fixed_words) {
      return absl::DataLossError(absl::StrCat(
          "actpack: corrupt eb buffer: payload of ", header.payload_size, " bytes, expected ",
          4 * fixed_words, " bytes of headers, index and outliers plus whole data words"));
    }
    const uint64_t data_words = header.payload_size / 4 - fixed_words;
    const Sections s = SectionsOf(l, data_words, p.outliers);
    const uint32_t element_bytes = static_cast<uint32_t>(ElementSize(header.dtype));
    if (output.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      const cuda::EbShape cs{shape.dims, shape.planes, shape.rows, shape.cols,
                             elements::KindOf(header.dtype)};
      // The blocks and outliers are validated on the device (kFailEb* bits in the status).
      cuda::EbPayload values;
      values.half_bin = p.half_bin;
      values.data_words = data_words;
      values.outliers = p.outliers;
      return cuda::EbDecode(payload, cs, values, status, output.data, context.stream);
#else
      return internal::CudaNotCompiledIn("eb decode");
#endif
    }
    const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
    const uint32_t* slots = words + s.slots;
    const uint32_t* raw = words + s.raw;
    absl::Status valid = ValidateBlocks(words, l, s, data_words, element_bytes);
    if (!valid.ok()) return valid;
    valid = ValidateOutliers(words, l, slots, raw, p.outliers, element_bytes);
    if (!valid.ok()) return valid;
    internal::ParallelFor(l.chunks, kChunkGrain, [&](int, int64_t begin, int64_t end) {
      if (simd::Vectorized()) {
        for (int64_t c = begin; c < end; ++c) {
          const uint64_t first = c * eb_math::kBlocksPerChunk;
          const uint64_t last = std::min<uint64_t>(l.blocks, first + eb_math::kBlocksPerChunk);
          simd::EbDecodeBlocks(elements::KindOf(header.dtype), words + first,
                               words + s.data + ReadU64(words + s.index, c), l, p.half_bin, first,
                               last, output.data);
        }
        return;
      }
      DispatchKind(header.dtype, [&]<int K>() {
        for (int64_t c = begin; c < end; ++c) {
          const uint32_t* data = words + s.data + ReadU64(words + s.index, c);
          const uint64_t last = std::min<uint64_t>(l.blocks, (c + 1) * eb_math::kBlocksPerChunk);
          for (uint64_t b = c * eb_math::kBlocksPerChunk; b < last; ++b) {
            DecodeBlock<K>(data, words[b], l, p.half_bin, b, output.data);
            data += eb_math::DataWords(words[b], eb_math::TileOf(l, b).count, element_bytes);
          }
        }
      });
    });
    internal::ParallelFor(p.outliers, 4096, [&](int, int64_t begin, int64_t end) {
      for (int64_t j = begin; j < end; ++j) {
        const uint64_t slot = ReadU64(slots, j);
        const uint64_t b = slot / eb_math::kBlockValues;
        const uint64_t i = ElementIndex(l, b, static_cast<uint32_t>(slot % eb_math::kBlockValues));
        if (element_bytes == 4) {
          elements::StoreBits<4>(output.data, i, raw[j]);
        } else {
          elements::StoreBits<2>(output.data, i, raw[j]);
        }
      }
    });
    return absl::OkStatus();
  }

  bool ReadsDeviceParams() const override { return true; }

  // The half-bin, the outlier count and the payload's size come from the encode's status, read
  // and checked on the device (cuda::EbDecode).
  absl::Status DecodeUnresolvedPayload(const Header& header, const uint8_t* payload,
                                       uint64_t capacity, const MutableTensorView& output,
                                       const ExecContext& context,
                                       DeviceStatus* status) const override {
    if (!IsLossyFloat(header.dtype)) {
      return absl::DataLossError(
          absl::StrCat("actpack: corrupt eb buffer: dtype ", DTypeName(header.dtype)));
    }
    absl::StatusOr<Params> params = ReadParams(header, /*resolved=*/false);
    if (!params.ok()) return params.status();
#ifdef ACTPACK_WITH_CUDA
    const Shape shape = ShapeOf(header.Shape(), header.numel);
    const Layout l = LayoutOf(shape);
    const size_t element_bytes = ElementSize(header.dtype);
    const cuda::EbShape cs{shape.dims, shape.planes, shape.rows, shape.cols,
                           elements::KindOf(header.dtype)};
    cuda::EbPayload values;
    values.from_status = true;
    values.max_outliers = MaxOutliers(l, header.numel, element_bytes);
    values.max_bytes = std::min(capacity, MaxPayloadBytes(l, header.numel, element_bytes));
    return cuda::EbDecode(payload, cs, values, status, output.data, context.stream);
#else
    static_cast<void>(payload), static_cast<void>(capacity), static_cast<void>(output);
    static_cast<void>(context), static_cast<void>(status);
    return internal::CudaNotCompiledIn("eb decode");
#endif
  }

 private:
  static uint64_t ElementIndex(const Layout& l, uint64_t b, uint32_t i) {
    return eb_math::ElementOf(l, eb_math::TileOf(l, b), i);
  }
};

}  // namespace

const Codec* EbCodec() {
  static const Eb* const codec = new Eb();
  return codec;
}

}  // namespace actpack::codecs

#include "codecs/division.h"

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "codecs/internal/cuda_status.h"
#include "codecs/internal/element_kind.h"
#include "codecs/internal/dct_math.h"
#include "codecs/internal/division_math.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/parallel.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"
#include "codecs/internal/simd.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs {
namespace {

using division_math::Layout;

constexpr int kMinBlock = 2;
constexpr int kMaxBlock = 64;
constexpr int kMinKeep = 1;
constexpr int kMaxKeep = 32;
constexpr int kMaxGroup = 65536;

bool ValidBits(int bits) { return bits == 1 || bits == 2 || bits == 4 || bits == 8; }

// The two codecs differ only in their LFC; this names it and its header parameter (byte 1).
struct Variant {
  CodecId id;
  const char* name;
  const char* lfc_option;  // "block" or "keep"
  int min_lfc;
  int max_lfc;
  const char* auto_spec;  // what codec="auto" may choose, or nullptr
};

constexpr Variant kPoolVariant{CodecId::kDivision, "division", "block", kMinBlock, kMaxBlock,
                               "division"};
// Not among auto's candidates: with it there, the planner's auto+recompute answer fell more
// than 5% below a batch that trains (FORMAT.md, "division_dct: why a cosine transform").
constexpr Variant kDctVariant{CodecId::kDivisionDct, "division_dct", "keep", kMinKeep,
                              kMaxKeep, nullptr};

// The header parameters: byte 0 bits, byte 1 block (division) or keep (division_dct), bytes
// 4..7 group, bytes 8..15 seed; the rest zero.
struct Params {
  uint32_t bits;
  uint32_t lfc;
  uint32_t group;
  uint64_t seed;
};

void WriteParams(const Params& p, Header* header) {
  header->params.fill(0);
  header->params[0] = static_cast<uint8_t>(p.bits);
  header->params[1] = static_cast<uint8_t>(p.lfc);
  std::memcpy(header->params.data() + 4, &p.group, 4);
  std::memcpy(header->params.data() + 8, &p.seed, 8);
}

absl::StatusOr<Params> ReadParams(const Header& header, const Variant& v) {
  Params p;
  p.bits = header.params[0];
  p.lfc = header.params[1];
  std::memcpy(&p.group, header.params.data() + 4, 4);
  std::memcpy(&p.seed, header.params.data() + 8, 8);
  if (!ValidBits(static_cast<int>(p.bits))) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt ", v.name, " buffer: bits ", p.bits));
  }
  if (p.lfc < static_cast<uint32_t>(v.min_lfc) || p.lfc > static_cast<uint32_t>(v.max_lfc)) {
    return absl::DataLossError(
        absl::StrCat("actpack: corrupt ", v.name, " buffer: ", v.lfc_option, " ", p.lfc));
  }
  for (const auto& [first, last] : {std::pair<size_t, size_t>{2, 4}, {16, kParamBytes}}) {
    absl::Status unused = CheckParamBytesZero(header, first, last, v.name);
    if (!unused.ok()) return unused;
  }
  if (p.group == 0 || p.group % 32 != 0 || p.group > kMaxGroup) {
    return absl::DataLossError(
        absl::StrCat("actpack: corrupt ", v.name, " buffer: group size ", p.group));
  }
  if (!IsLossyFloat(header.dtype)) {
    return absl::DataLossError(
        absl::StrCat("actpack: corrupt ", v.name, " buffer: dtype ", DTypeName(header.dtype)));
  }
  return p;
}

Layout ResidualLayout(absl::Span<const int64_t> shape, const Params& p) {
  return division_math::MakeResidualLayout(shape.data(), static_cast<int>(shape.size()), p.bits,
                                           p.group, p.seed);
}

Layout LayoutOf(const Variant& v, absl::Span<const int64_t> shape, const Params& p) {
  const Layout l = ResidualLayout(shape, p);
  return v.id == CodecId::kDivision ? division_math::MakePoolLayout(l, p.lfc)
                                    : division_math::MakeDctLayout(l, p.lfc);
}

// Payload bytes of a layout, or 0 with *overflow set when a corrupt header's shape would need
// more than 2^62 (no real tensor can: each section holds at most one word per element).
uint64_t PayloadBytes(const Layout& l, bool* overflow) {
  const unsigned __int128 bytes = static_cast<unsigned __int128>(l.payload_words()) * 4;
  *overflow = bytes > (static_cast<unsigned __int128>(1) << 62);
  return *overflow ? 0 : static_cast<uint64_t>(bytes);
}

struct Partial {
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;        // non-finite inputs
  uint64_t nonfinite_lfc = 0;    // LFC values out of their storage type's range
  uint64_t overflow_groups = 0;  // residual ranges that overflow float
};

Partial Sum(const std::vector<Partial>& partials) {
  Partial total;
  for (const Partial& p : partials) {
    total.checksum += p.checksum;
    total.nonfinite += p.nonfinite;
    total.nonfinite_lfc += p.nonfinite_lfc;
    total.overflow_groups += p.overflow_groups;
  }
  return total;
}

// ---- the residual quantizer (both codecs) ----

// Per-thread buffers of one group.
struct GroupScratch {
  // simd::DivisionApproximations writes up to 8 values past a group.
  explicit GroupScratch(uint64_t n) : approx(n + 8), residual(n), codes(n) {}
  std::vector<float> approx;
  std::vector<float> residual;
  std::vector<uint32_t> codes;
};

// Quantizes group q of plane p given the LFC approximations of its values: writes the
// group's parameter word and code words. As quant.cc, in flat passes the compiler vectorizes;
// the arithmetic per value is division_math's and quant_math's, as on the GPU.
template <int K, int kBits>
void EncodeGroup(const void* input, const Layout& l, uint64_t p, uint64_t q,
                 const float* approx, uint32_t* words, GroupScratch& s, Partial* partial) {
  constexpr uint32_t kPerWord = 32 / kBits;
  constexpr uint32_t kLevels = (1u << kBits) - 1;
  const uint64_t j0 = q * l.group_length;
  const uint32_t n = static_cast<uint32_t>(division_math::GroupSize(l, q));
  const uint64_t first = p * l.plane + j0;  // the group's flat element index
  if (simd::Vectorized()) {
    simd::QuantTotals totals;
    simd::QuantizeGroups(K, elements::Offset<K>(input, first), approx, n,
                         static_cast<uint32_t>(l.group_length),
                         static_cast<uint32_t>(division_math::CeilDiv(n, kPerWord) * kPerWord),
                         kBits, l.seed, first, words,
                         division_math::ParamWord(l, p * l.groups_per_plane + q),
                         division_math::PlaneCodeWord(l, p) + j0 / kPerWord, &totals);
    partial->checksum += totals.checksum;
    partial->nonfinite += totals.nonfinite;
    partial->overflow_groups += totals.overflow_groups;
    return;
  }
  float lo = portable::BitsToFloat(0x7f800000u);  // +inf
  float hi = -lo;
  uint32_t nonfinite = 0;
  uint32_t overflow = 0;
  float* residual = s.residual.data();
  for (uint32_t i = 0; i < n; ++i) {
    const float x = elements::Load<K>(input, first + i);
    const float r = division_math::Residual(x, approx[i]);
    const bool x_finite = portable::IsFinite(x);
    const bool r_finite = portable::IsFinite(r);
    nonfinite += x_finite ? 0u : 1u;
    overflow += (x_finite && !r_finite) ? 1u : 0u;
    lo = r_finite ? portable::Min(lo, r) : lo;
    hi = r_finite ? portable::Max(hi, r) : hi;
    residual[i] = r;
  }
  partial->nonfinite += nonfinite;
  const quant_math::GroupParams gp = quant_math::MakeGroupParams(lo, hi, kBits);
  if (!gp.ok || overflow > 0) ++partial->overflow_groups;
  const uint64_t param_word = division_math::ParamWord(l, p * l.groups_per_plane + q);
  words[param_word] = gp.packed;
  partial->checksum += portable::ChecksumTerm(gp.packed, param_word);
  uint32_t* codes = s.codes.data();
  const auto quantize = [&](uint32_t i, float u) {
    const float r = residual[i];
    // Non-finite residuals only occur in tensors the caller refuses; code 0 keeps NaN away
    // from the float-to-int conversion.
    const bool finite = portable::IsFinite(r);
    const uint32_t code = quant_math::Quantize(finite ? r : gp.min, gp, u, kLevels);
    codes[i] = finite ? code : 0u;
  };
  const portable::UniformDraws draws(l.seed, first, first + n);
  for (uint32_t i = 0; i < n; ++i) quantize(i, draws(first + i));
  const uint64_t n_words = division_math::CeilDiv(n, kPerWord);
  for (uint64_t i = n; i < n_words * kPerWord; ++i) codes[i] = 0;
  const uint64_t first_word = division_math::PlaneCodeWord(l, p) + j0 / kPerWord;
  for (uint64_t w = 0; w < n_words; ++w) {
    uint32_t word = 0;
    for (uint32_t j = 0; j < kPerWord; ++j) word |= codes[w * kPerWord + j] << (j * kBits);
    words[first_word + w] = word;
    partial->checksum += portable::ChecksumTerm(word, first_word + w);
  }
}

template <int K, int kBits>
void DecodeGroup(const uint32_t* words, const Layout& l, uint64_t p, uint64_t q,
                 const float* approx, void* output) {
  constexpr uint32_t kPerWord = 32 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  const uint64_t j0 = q * l.group_length;
  const uint64_t n = division_math::GroupSize(l, q);
  const uint64_t first = p * l.plane + j0;
  const uint32_t param_word = words[division_math::ParamWord(l, p * l.groups_per_plane + q)];
  const uint32_t* in = words + division_math::PlaneCodeWord(l, p) + j0 / kPerWord;
  if (simd::Vectorized()) {
    simd::DequantizeGroup(K, in, param_word, static_cast<uint32_t>(n), kBits, approx,
                          elements::Offset<K>(output, first));
    return;
  }
  const quant_math::GroupParams gp = quant_math::UnpackGroupParams(param_word);
  const uint64_t full_words = n / kPerWord;
  for (uint64_t w = 0; w < full_words; ++w) {
    const uint32_t word = in[w];
    for (uint32_t j = 0; j < kPerWord; ++j) {
      const uint64_t i = w * kPerWord + j;
      elements::Store<K>(output, first + i,
                         division_math::Reconstruct(approx[i], (word >> (j * kBits)) & kMask, gp));
    }
  }
  for (uint64_t i = full_words * kPerWord; i < n; ++i) {
    const uint32_t code = (in[i / kPerWord] >> ((i % kPerWord) * kBits)) & kMask;
    elements::Store<K>(output, first + i, division_math::Reconstruct(approx[i], code, gp));
  }
}

// ---- division: the pooled LFC ----

// The means of bands [begin, end) of windows: band b is (plane b / blocks_h, window row
// b % blocks_h). Each window sums its values in division_math::WindowMean's order (rows, then
// columns, left to right); the loops here only interleave independent windows so that they
// vectorize.
template <int K>
void PoolBands(const void* input, const Layout& l, uint16_t* means, uint64_t begin, uint64_t end,
               Partial* partial) {
  const uint64_t row_means = l.blocks_w * l.inner;
  std::vector<float> acc(row_means);
  for (uint64_t b = begin; b < end; ++b) {
    const uint64_t p = b / l.blocks_h;
    const uint64_t h0 = (b % l.blocks_h) * l.block_h;
    const uint64_t h1 = std::min<uint64_t>(h0 + l.block_h, l.height);
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (uint64_t h = h0; h < h1; ++h) {
      const uint64_t row = (p * l.height + h) * l.width * l.inner;
      if (l.inner == 1) {
        // Column k of every full window, then the partial window at the right edge.
        const uint64_t full = l.width / l.block_w;
        for (uint64_t k = 0; k < l.block_w; ++k) {
          for (uint64_t wb = 0; wb < full; ++wb) {
            acc[wb] = portable::Add(acc[wb], elements::Load<K>(input, row + wb * l.block_w + k));
          }
        }
        for (uint64_t w = full * l.block_w; w < l.width; ++w) {
          acc[full] = portable::Add(acc[full], elements::Load<K>(input, row + w));
        }
      } else {
        for (uint64_t w = 0; w < l.width; ++w) {
          float* dst = acc.data() + (w / l.block_w) * l.inner;
          const uint64_t src = row + w * l.inner;
          for (uint64_t c = 0; c < l.inner; ++c) {
            dst[c] = portable::Add(dst[c], elements::Load<K>(input, src + c));
          }
        }
      }
    }
    uint16_t* out = means + b * row_means;
    for (uint64_t wb = 0; wb < l.blocks_w; ++wb) {
      const uint64_t w0 = wb * l.block_w;
      const uint64_t count = (h1 - h0) * (std::min<uint64_t>(w0 + l.block_w, l.width) - w0);
      const float divisor = static_cast<float>(count);
      for (uint64_t c = 0; c < l.inner; ++c) {
        const float mean = portable::Div(acc[wb * l.inner + c], divisor);
        out[wb * l.inner + c] = division_math::StoredMean(mean, &partial->nonfinite_lfc);
      }
    }
  }
}

// The upsampled LFC of n values of plane p from value j0 on: runs of values that share a mean
// (C == 1: a window's columns in one row) or read consecutive means (C > 1). Positions advance
// by counters: a division per value would cost more than the rest of decoding.
void PoolApproximations(const uint16_t* means, const Layout& l, uint64_t p, uint64_t j0,
                        uint64_t n, float* approx) {
  division_math::MeanCursor at(means, l, p, j0);
  for (uint64_t i = 0; i < n;) {
    const uint64_t run = at.Run(n - i);
    const uint16_t* m = at.Means();
    if (l.inner == 1) {
      const float value = portable::Bf16ToFloat(m[0]);
      for (uint64_t k = 0; k < run; ++k) approx[i + k] = value;
    } else {
      for (uint64_t k = 0; k < run; ++k) approx[i + k] = portable::Bf16ToFloat(m[k]);
    }
    i += run;
    at.Advance(run);
  }
}

// PoolApproximations, by the vector kernel when the CPU has one (it writes up to 8 values past
// approx[n - 1]).
void Approximations(const uint16_t* means, const Layout& l, uint64_t p, uint64_t j0, uint64_t n,
                    float* approx) {
  if (simd::Vectorized()) {
    simd::DivisionApproximations(means, l, p, j0, n, approx);
  } else {
    PoolApproximations(means, l, p, j0, n, approx);
  }
}

// Groups per parallel chunk: about 64 Ki values.
int64_t GroupGrain(const Layout& l) {
  return std::max<int64_t>(1, 65536 / static_cast<int64_t>(std::max<uint64_t>(1, l.group_length)));
}

// At most this many values a call of the vector quantizer, so that the approximations stay in
// cache between being written and being read (a whole plane's would go to memory).
constexpr uint64_t kRunValues = 8192;

// Groups [begin, end) (over all planes) with the vector kernels: a call per plane's run of
// groups, whose values, approximations and words are consecutive. `approx` is the task's
// scratch, kept across calls.
void VectorEncodeGroups(const void* input, DType dtype, const Layout& l, const uint16_t* means,
                        uint32_t* words, int64_t begin, int64_t end, std::vector<float>& approx,
                        Partial* partial) {
  const int kind = elements::KindOf(dtype);
  const uint64_t per_word = 32 / l.bits;
  const size_t element_bytes = ElementSize(dtype);
  const uint64_t run_groups = std::max<uint64_t>(1, kRunValues / l.group_length);
  for (int64_t g = begin; g < end;) {
    const uint64_t p = g / l.groups_per_plane;
    const uint64_t q0 = g % l.groups_per_plane;
    const uint64_t q1 = std::min<uint64_t>({l.groups_per_plane, q0 + (end - g), q0 + run_groups});
    const uint64_t j0 = q0 * l.group_length;
    const uint64_t n = std::min<uint64_t>(q1 * l.group_length, l.plane) - j0;
    const uint64_t last_values = division_math::GroupSize(l, q1 - 1);
    if (approx.size() < n + 8) approx.resize(n + 8);
    simd::DivisionApproximations(means, l, p, j0, n, approx.data());
    const uint64_t first = p * l.plane + j0;
    simd::QuantTotals totals;
    simd::QuantizeGroups(kind, static_cast<const uint8_t*>(input) + element_bytes * first,
                         approx.data(), n, static_cast<uint32_t>(l.group_length),
                         static_cast<uint32_t>(division_math::CeilDiv(last_values, per_word) * per_word),
                         l.bits, l.seed, first, words,
                         division_math::ParamWord(l, p * l.groups_per_plane + q0),
                         division_math::PlaneCodeWord(l, p) + j0 / per_word, &totals);
    partial->checksum += totals.checksum;
    partial->nonfinite += totals.nonfinite;
    partial->overflow_groups += totals.overflow_groups;
    g += q1 - q0;
  }
}

// Bands [begin, end)'s means with the vector kernels; `scratch` is the task's, kept across calls.
void VectorPoolBands(const void* input, DType dtype, const Layout& l, uint16_t* means,
                     uint64_t begin, uint64_t end, std::vector<float>& scratch, Partial* partial) {
  scratch.resize(std::max<size_t>(scratch.size(), l.blocks_w * l.inner + l.width + 16));
  for (uint64_t b = begin; b < end; ++b) {
    simd::DivisionPoolBand(elements::KindOf(dtype), input, l, b, scratch.data(), means,
                           &partial->nonfinite_lfc);
  }
}

// Planes of at most this many values are encoded one at a time by the vector path: the plane's
// means, then its groups, while it is still in cache (the input is read from memory once).
constexpr uint64_t kFusedPlaneValues = uint64_t{1} << 18;

Partial PoolEncodeCpu(const void* input, DType dtype, const Layout& l, uint8_t* payload) {
  uint32_t* words = reinterpret_cast<uint32_t*>(payload);
  uint16_t* means = reinterpret_cast<uint16_t*>(payload);  // little-endian: low half first
  std::vector<Partial> partials(internal::MaxParallelChunks());
  const bool fused = simd::Vectorized() && l.plane <= kFusedPlaneValues &&
                     l.planes >= 2 * static_cast<uint64_t>(internal::MaxParallelChunks());
  if (fused) {
    const int64_t plane_grain = std::max<int64_t>(1, 65536 / static_cast<int64_t>(l.plane));
    internal::ParallelFor(l.planes, plane_grain, [&](int chunk, int64_t begin, int64_t end) {
      std::vector<float> scratch, approx;
      for (int64_t p = begin; p < end; ++p) {
        VectorPoolBands(input, dtype, l, means, p * l.blocks_h, (p + 1) * l.blocks_h, scratch,
                        &partials[chunk]);
        VectorEncodeGroups(input, dtype, l, means, words, p * l.groups_per_plane,
                           (p + 1) * l.groups_per_plane, approx, &partials[chunk]);
      }
    });
  } else {
    const uint64_t bands = l.planes * l.blocks_h;
    const int64_t band_values = static_cast<int64_t>(l.block_h * l.width * l.inner);
    internal::ParallelFor(bands, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, band_values)),
                          [&](int chunk, int64_t begin, int64_t end) {
      if (simd::Vectorized()) {
        std::vector<float> scratch;
        VectorPoolBands(input, dtype, l, means, begin, end, scratch, &partials[chunk]);
        return;
      }
      switch (dtype) {
        case DType::kFloat16:
          PoolBands<elements::kF16>(input, l, means, begin, end, &partials[chunk]);
          break;
        case DType::kBFloat16:
          PoolBands<elements::kBF16>(input, l, means, begin, end, &partials[chunk]);
          break;
        default:
          PoolBands<elements::kF32>(input, l, means, begin, end, &partials[chunk]);
      }
    });
  }
  if (l.means % 2 != 0) means[l.means] = 0;  // the unused high half of the last LFC word
  internal::ParallelFor(l.lfc_words, 65536, [&](int chunk, int64_t begin, int64_t end) {
    partials[chunk].checksum += simd::ChecksumWords(words + begin, end - begin, begin);
  });
  if (fused) return Sum(partials);  // the groups are encoded
  internal::ParallelFor(l.groups, GroupGrain(l), [&](int chunk, int64_t begin, int64_t end) {
    if (simd::Vectorized()) {
      std::vector<float> approx;
      VectorEncodeGroups(input, dtype, l, means, words, begin, end, approx, &partials[chunk]);
      return;
    }
    GroupScratch s(l.group_length);
    elements::DispatchKindAndBits(dtype, l.bits, [&]<int K, int kBits>() {
      for (int64_t g = begin; g < end; ++g) {
        const uint64_t p = g / l.groups_per_plane;
        const uint64_t q = g % l.groups_per_plane;
        Approximations(means, l, p, q * l.group_length, division_math::GroupSize(l, q),
                       s.approx.data());
        EncodeGroup<K, kBits>(input, l, p, q, s.approx.data(), words, s, &partials[chunk]);
      }
    });
  });
  return Sum(partials);
}

void PoolDecodeCpu(const uint8_t* payload, DType dtype, const Layout& l, void* output) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  const uint16_t* means = reinterpret_cast<const uint16_t*>(payload);
  internal::ParallelFor(l.groups, GroupGrain(l), [&](int, int64_t begin, int64_t end) {
    std::vector<float> approx(l.group_length + 8);
    elements::DispatchKindAndBits(dtype, l.bits, [&]<int K, int kBits>() {
      for (int64_t g = begin; g < end; ++g) {
        const uint64_t p = g / l.groups_per_plane;
        const uint64_t q = g % l.groups_per_plane;
        Approximations(means, l, p, q * l.group_length, division_math::GroupSize(l, q),
                       approx.data());
        DecodeGroup<K, kBits>(words, l, p, q, approx.data(), output);
      }
    });
  });
}

// ---- division_dct: the cosine-transform LFC (cuda/division_kernels.cu computes the same) ----

// The cosines of one axis of n samples at its kept frequencies: [frequency][m]. One shared
// table when it is small; past kMaxTable entries (a long axis: a 1-D tensor, the rows of a
// long 2-D one) each plane computes the cosines it needs where it needs them.
class AxisCosines {
 public:
  AxisCosines(uint64_t n, uint64_t kept) : n_(n) {
    if (n_ * kept > kMaxTable) return;
    table_.resize(n_ * kept);
    for (uint64_t f = 0; f < kept; ++f) Fill(f, &table_[f * n_]);
  }

  // The cosine of frequency f at sample m.
  float At(uint64_t f, uint64_t m) const {
    return table_.empty() ? dct_math::Basis(m, f, n_) : table_[f * n_ + m];
  }

  // The cosines of frequency f, from the table or computed into *buffer.
  const float* Get(uint64_t f, std::vector<float>* buffer) const {
    if (!table_.empty()) return &table_[f * n_];
    buffer->resize(n_);
    Fill(f, buffer->data());
    return buffer->data();
  }

 private:
  static constexpr uint64_t kMaxTable = 1 << 20;

  void Fill(uint64_t f, float* out) const {
    for (uint64_t m = 0; m < n_; ++m) out[m] = dct_math::Basis(m, f, n_);
  }

  uint64_t n_;
  std::vector<float> table_;
};

struct DctCosines {
  explicit DctCosines(const Layout& l)
      : rows(std::max<uint64_t>(1, l.height), l.kept_rows),
        columns(std::max<uint64_t>(1, l.width), l.kept_columns) {}
  AxisCosines rows;
  AxisCosines columns;
};

// One plane's transform work. The loops put independent sums innermost (all (w, c) of a row,
// or all c of a column) so that they vectorize; each sum still runs in the order FORMAT.md
// gives: forward along h (h ascending) then along w (w ascending), inverse along h (u
// ascending) then along w (v ascending).
class PlaneDct {
 public:
  PlaneDct(const Layout& l, const DctCosines& cosines)
      : l_(l),
        cosines_(cosines),
        row_(l.width * l.inner),
        g_(l.kept_rows * l.width * l.inner),
        gt_(g_.size()),
        acc_(l.kept_rows * l.inner),
        y_(l.kept_columns * l.height * l.inner),
        x_(l.kept_rows * l.kept_columns * l.inner),
        approx_(l.plane) {}

  // The kept coefficients of plane p as bfloat16 into the LFC section, [rows][columns][C], two
  // per word (coefficient 2w in word w's low half); counts those out of bfloat16's range.
  // Halves are stored one by one: two planes' chunks may share a word.
  template <int K>
  void Forward(const void* input, uint64_t p, uint8_t* lfc, Partial* partial) {
    const uint64_t H = l_.height, W = l_.width, C = l_.inner, R = l_.kept_rows, V = l_.kept_columns;
    const uint64_t lanes = W * C;
    // Along h: G[u][w][c] = sum_h x[h][w][c] cos_H(u, h), a row at a time.
    std::fill(g_.begin(), g_.end(), 0.0f);
    const uint64_t base = p * l_.plane;
    for (uint64_t h = 0; h < H; ++h) {
      for (uint64_t k = 0; k < lanes; ++k) row_[k] = elements::Load<K>(input, base + h * lanes + k);
      for (uint64_t u = 0; u < R; ++u) {
        const float t = cosines_.rows.At(u, h);
        float* g = &g_[u * lanes];
        for (uint64_t k = 0; k < lanes; ++k) g[k] = portable::Add(g[k], portable::Mul(row_[k], t));
      }
    }
    // Along w at each kept column frequency: G turned to [W][R][C] first, so that the R * C
    // independent sums of a column frequency run side by side (w ascending in each).
    const uint64_t sums = R * C;
    for (uint64_t u = 0; u < R; ++u) {
      for (uint64_t w = 0; w < W; ++w) {
        for (uint64_t c = 0; c < C; ++c) gt_[(w * R + u) * C + c] = g_[u * lanes + w * C + c];
      }
    }
    for (uint64_t v = 0; v < V; ++v) {
      const float* t = cosines_.columns.Get(v, &buffer_);
      std::fill(acc_.begin(), acc_.end(), 0.0f);  // [R][C]
      for (uint64_t w = 0; w < W; ++w) {
        const float* g = &gt_[w * sums];
        for (uint64_t j = 0; j < sums; ++j) acc_[j] = portable::Add(acc_[j], portable::Mul(g[j], t[w]));
      }
      for (uint64_t u = 0; u < R; ++u) {
        for (uint64_t c = 0; c < C; ++c) {
          const uint16_t stored = division_math::StoredMean(
              dct_math::Coefficient(acc_[u * C + c], u, v, H, W), &partial->nonfinite_lfc);
          const uint64_t at = division_math::CoefficientIndex(l_, p, u, v, c);
          std::memcpy(lfc + 2 * at, &stored, 2);  // little-endian
        }
      }
    }
  }

  // The inverse transform of plane p's stored coefficients: approximations of its H*W*C values.
  const float* Inverse(const uint8_t* lfc, uint64_t p) {
    const uint64_t H = l_.height, W = l_.width, C = l_.inner, R = l_.kept_rows, V = l_.kept_columns;
    const uint8_t* plane = lfc + 2 * division_math::CoefficientIndex(l_, p, 0, 0, 0);
    for (uint64_t k = 0; k < R * V * C; ++k) {
      uint16_t half;
      std::memcpy(&half, plane + 2 * k, 2);
      x_[k] = portable::Bf16ToFloat(half);
    }
    // Along h: Y[v][h][c] = sum_u X[u][v][c] cos_H(u, h).
    std::fill(y_.begin(), y_.end(), 0.0f);
    for (uint64_t u = 0; u < R; ++u) {
      const float* t = cosines_.rows.Get(u, &buffer_);
      for (uint64_t v = 0; v < V; ++v) {
        const float* x = &x_[(u * V + v) * C];
        float* y = &y_[v * H * C];
        if (C == 1) {
          const float xv = x[0];
          for (uint64_t h = 0; h < H; ++h) y[h] = portable::Add(y[h], portable::Mul(xv, t[h]));
          continue;
        }
        for (uint64_t h = 0; h < H; ++h) {
          for (uint64_t c = 0; c < C; ++c) {
            y[h * C + c] = portable::Add(y[h * C + c], portable::Mul(x[c], t[h]));
          }
        }
      }
    }
    // Along w.
    std::fill(approx_.begin(), approx_.end(), 0.0f);
    for (uint64_t v = 0; v < V; ++v) {
      const float* t = cosines_.columns.Get(v, &buffer_);
      for (uint64_t h = 0; h < H; ++h) {
        const float* y = &y_[(v * H + h) * C];
        float* out = &approx_[h * W * C];
        if (C == 1) {
          const float yv = y[0];
          for (uint64_t w = 0; w < W; ++w) out[w] = portable::Add(out[w], portable::Mul(yv, t[w]));
          continue;
        }
        for (uint64_t w = 0; w < W; ++w) {
          for (uint64_t c = 0; c < C; ++c) {
            out[w * C + c] = portable::Add(out[w * C + c], portable::Mul(y[c], t[w]));
          }
        }
      }
    }
    return approx_.data();
  }

 private:
  const Layout& l_;
  const DctCosines& cosines_;
  std::vector<float> row_;     // [W][C]: one row of the input
  std::vector<float> g_;       // [R][W][C]: forward along h
  std::vector<float> gt_;      // [W][R][C]: the same, turned for the pass along w
  std::vector<float> acc_;     // [R][C]: one column frequency's sums along w
  std::vector<float> y_;       // [V][H][C]: inverse along h
  std::vector<float> x_;       // [R][V][C]: the coefficients
  std::vector<float> approx_;  // [H][W][C]
  std::vector<float> buffer_;  // cosines computed on demand
};

// Planes per parallel chunk: about 64 Ki values.
int64_t PlaneGrain(const Layout& l) {
  return std::max<int64_t>(1, 65536 / static_cast<int64_t>(std::max<uint64_t>(1, l.plane)));
}

Partial DctEncodeCpu(const void* input, DType dtype, const Layout& l, uint8_t* payload) {
  uint32_t* words = reinterpret_cast<uint32_t*>(payload);
  const DctCosines cosines(l);
  // The last word's high half stays zero when the coefficients are odd in number.
  if (l.lfc_words > 0) words[l.lfc_words - 1] = 0;
  std::vector<Partial> partials(internal::MaxParallelChunks());
  internal::ParallelFor(l.planes, PlaneGrain(l), [&](int chunk, int64_t begin, int64_t end) {
    PlaneDct dct(l, cosines);
    GroupScratch s(l.group_length);
    Partial& partial = partials[chunk];
    elements::DispatchKindAndBits(dtype, l.bits, [&]<int K, int kBits>() {
      for (int64_t p = begin; p < end; ++p) {
        dct.Forward<K>(input, p, payload, &partial);
        const float* approx = dct.Inverse(payload, p);
        for (uint64_t q = 0; q < l.groups_per_plane; ++q) {
          EncodeGroup<K, kBits>(input, l, p, q, approx + q * l.group_length, words, s, &partial);
        }
      }
    });
  });
  internal::ParallelFor(l.lfc_words, 65536, [&](int chunk, int64_t begin, int64_t end) {
    partials[chunk].checksum += simd::ChecksumWords(words + begin, end - begin, begin);
  });
  return Sum(partials);
}

void DctDecodeCpu(const uint8_t* payload, DType dtype, const Layout& l, void* output) {
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  const DctCosines cosines(l);
  internal::ParallelFor(l.planes, PlaneGrain(l), [&](int, int64_t begin, int64_t end) {
    PlaneDct dct(l, cosines);
    elements::DispatchKindAndBits(dtype, l.bits, [&]<int K, int kBits>() {
      for (int64_t p = begin; p < end; ++p) {
        const float* approx = dct.Inverse(payload, p);
        for (uint64_t q = 0; q < l.groups_per_plane; ++q) {
          DecodeGroup<K, kBits>(words, l, p, q, approx + q * l.group_length, output);
        }
      }
    });
  });
}

// ---- the codecs ----

class Division final : public Codec {
 public:
  explicit Division(const Variant& variant) : v_(variant) {}

  CodecId id() const override { return v_.id; }
  absl::string_view name() const override { return v_.name; }
  bool lossless() const override { return false; }
  std::vector<std::string> AutoSpecs() const override {
    if (v_.auto_spec == nullptr) return {};
    return {v_.auto_spec};
  }

  absl::Status CheckEncodable(const TensorSpec& spec, const CodecParams& params) const override {
    if (!IsLossyFloat(spec.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actpack: ", v_.name, " encodes float32, float16 and bfloat16 tensors, not ",
          DTypeName(spec.dtype)));
    }
    if (!ValidBits(params.bits)) {
      return absl::InvalidArgumentError(
          absl::StrCat("actpack: ", v_.name, " bits must be 1, 2, 4 or 8, not ", params.bits));
    }
    const int lfc = LfcParam(params);
    if (lfc < v_.min_lfc || lfc > v_.max_lfc) {
      return absl::InvalidArgumentError(absl::StrCat("actpack: ", v_.name, " ", v_.lfc_option,
                                                     " must be ", v_.min_lfc, "..", v_.max_lfc,
                                                     ", not ", lfc));
    }
    if (params.group_size <= 0 || params.group_size % 32 != 0 ||
        params.group_size > kMaxGroup) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actpack: ", v_.name, " group size must be a positive multiple of 32 up to ",
          kMaxGroup, ", not ", params.group_size));
    }
    return absl::OkStatus();
  }

  uint64_t MaxPayloadSize(const TensorSpec& spec, const CodecParams& params) const override {
    bool overflow = false;
    return PayloadBytes(LayoutOf(v_, spec.shape, ParamsOf(params)), &overflow);
  }

  absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input, const CodecParams& params,
                                            Header* header, uint8_t* payload,
                                            const ExecContext& context,
                                            DeviceStatus* status) const override {
    const Params p = ParamsOf(params);
    const Layout l = LayoutOf(v_, input.shape, p);
    bool overflow = false;
    const uint64_t bytes = PayloadBytes(l, &overflow);
    WriteParams(p, header);
    if (input.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      // Two launches: the LFC (zeroing the status), then the residual, the checksum and counts
      // of the whole payload, and the header.
      header->payload_size = bytes;
      absl::Status queued =
          cuda::DivisionEncode(input.data, l, elements::KindOf(input.dtype),
                               HeaderWordsOf(*header), payload - kHeaderSize, status,
                               context.stream);
      if (!queued.ok()) return queued;
      PayloadInfo info{bytes, 0};
      info.header_written = true;
      return info;
#else
      return internal::CudaNotCompiledIn("division encode");
#endif
    }
    const Partial total = v_.id == CodecId::kDivision
                              ? PoolEncodeCpu(input.data, input.dtype, l, payload)
                              : DctEncodeCpu(input.data, input.dtype, l, payload);
    DeviceStatus counts{};
    counts.nonfinite = total.nonfinite;
    counts.unrepresentable = total.nonfinite_lfc + total.overflow_groups;
    counts.work[0] = total.nonfinite_lfc;
    absl::Status refused = Refusal(counts, *header);
    if (!refused.ok()) return refused;
    return PayloadInfo{bytes, total.checksum};
  }

  // counts.work[0]: the LFC means (or DCT coefficients) that overflow, counted apart from the
  // residual groups in `unrepresentable` (kernels.h).
  absl::Status Refusal(const DeviceStatus& counts, const Header&) const override {
    if (counts.nonfinite > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("actpack: ", v_.name, " cannot encode a tensor with ", counts.nonfinite,
                       " non-finite values; keep it exact"));
    }
    const uint64_t lfc = counts.work[0];
    if (lfc > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "actpack: ", v_.name, " cannot encode this tensor: ", lfc,
          v_.id == CodecId::kDivision ? " window means overflow bfloat16 (a window sum overflows)"
                                      : " DCT coefficients overflow bfloat16",
          "; keep it exact"));
    }
    if (counts.unrepresentable > 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "actpack: ", v_.name, " cannot encode a tensor whose residual range overflows float in ",
          counts.unrepresentable, " groups; keep it exact"));
    }
    return absl::OkStatus();
  }

  absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                             const MutableTensorView& output, const ExecContext& context,
                             DeviceStatus* status) const override {
    absl::StatusOr<Params> p = ReadParams(header, v_);
    if (!p.ok()) return p.status();
    absl::StatusOr<Layout> l = CheckedLayout(header, *p);
    if (!l.ok()) return l.status();
    if (v_.id == CodecId::kDivision) {
      PoolDecodeCpu(payload, header.dtype, *l, output.data);
    } else {
      DctDecodeCpu(payload, header.dtype, *l, output.data);
    }
    return absl::OkStatus();
  }

  // The decode launch checks the buffer.
  bool ChecksOwnBuffer() const override { return true; }

  // The LFC launch zeroes the status, which only the residual launch after it sums into.
  bool EncodeZeroesStatus() const override { return true; }

  absl::Status DecodeCheckedPayload(const Header& header, const DeviceBufferCheck& check,
                                    const MutableTensorView& output, const ExecContext& context,
                                    DeviceStatus* status) const override {
    absl::StatusOr<Params> p = ReadParams(header, v_);
    if (!p.ok()) return p.status();
    absl::StatusOr<Layout> l = CheckedLayout(header, *p);
    if (!l.ok()) return l.status();
#ifdef ACTPACK_WITH_CUDA
    return cuda::DivisionDecode(check.buffer, check.capacity, check.expected, check.known, *l,
                                elements::KindOf(header.dtype), output.data, status,
                                context.stream);
#else
    return internal::CudaNotCompiledIn("division decode");
#endif
  }

 private:
  // The payload's layout from the header's parameters; kDataLoss for a payload size no encode
  // of this shape writes.
  absl::StatusOr<Layout> CheckedLayout(const Header& header, const Params& p) const {
    const Layout l = LayoutOf(v_, header.Shape(), p);
    bool overflow = false;
    const uint64_t expected = PayloadBytes(l, &overflow);
    if (overflow || header.payload_size != expected) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt ", v_.name, " buffer: payload of ",
                                              header.payload_size, " bytes, expected ",
                                              overflow ? "more than 2^62" : absl::StrCat(expected)));
    }
    return l;
  }

  int LfcParam(const CodecParams& params) const {
    return v_.id == CodecId::kDivision ? params.block : params.keep;
  }

  Params ParamsOf(const CodecParams& params) const {
    return Params{static_cast<uint32_t>(params.bits), static_cast<uint32_t>(LfcParam(params)),
                  static_cast<uint32_t>(params.group_size), params.seed};
  }

  const Variant v_;
};

}  // namespace

const Codec* DivisionCodec() {
  static const Division* const codec = new Division(kPoolVariant);
  return codec;
}

const Codec* DivisionDctCodec() {
  static const Division* const codec = new Division(kDctVariant);
  return codec;
}

}  // namespace actpack::codecs

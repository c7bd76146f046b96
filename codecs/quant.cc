#include "codecs/quant.h"

#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/internal/cuda_status.h"
#include "codecs/internal/element_kind.h"
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

using quant_math::Layout;
using quant_math::MakeLayout;

void WriteParams(const Layout& l, Header* header) {
  header->params.fill(0);
  header->params[0] = static_cast<uint8_t>(l.bits);
  std::memcpy(header->params.data() + 4, &l.group_size, 4);
  std::memcpy(header->params.data() + 8, &l.seed, 8);
}

absl::StatusOr<Layout> ReadParams(const Header& header) {
  const uint32_t bits = header.params[0];
  uint32_t group_size;
  uint64_t seed;
  std::memcpy(&group_size, header.params.data() + 4, 4);
  std::memcpy(&seed, header.params.data() + 8, 8);
  if (bits != 1 && bits != 2 && bits != 4 && bits != 8) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt quant buffer: bits ", bits));
  }
  for (const auto& [first, last] : {std::pair<size_t, size_t>{1, 4}, {16, kParamBytes}}) {
    absl::Status unused = CheckParamBytesZero(header, first, last, "quant");
    if (!unused.ok()) return unused;
  }
  if (group_size == 0 || group_size % 32 != 0 || group_size > 65536) {
    return absl::DataLossError(
        absl::StrCat("actpack: corrupt quant buffer: group size ", group_size));
  }
  return MakeLayout(header.numel, group_size, bits, seed);
}

using Partial = simd::QuantTotals;

// The CPU reference runs in three flat passes per group (load + min/max, quantize into a code
// array, pack with shifts known at compile time) so that the compiler can vectorize each one;
// the arithmetic per value is quant_math's, as on the GPU.
template <int K, int kBits>
Partial EncodeGroups(const void* input, const Layout& l, uint32_t* words, uint64_t g_begin,
                     uint64_t g_end) {
  constexpr uint32_t kPerWord = 32 / kBits;
  constexpr uint32_t kLevels = (1u << kBits) - 1;
  Partial partial;
  if (simd::Vectorized()) {
    const uint64_t first = g_begin * l.group_size;
    const uint64_t n = std::min<uint64_t>(g_end * l.group_size, l.numel) - first;
    simd::QuantizeGroups(K, elements::Offset<K>(input, first), nullptr, n, l.group_size,
                         l.group_size, kBits, l.seed, first, words, g_begin, l.CodeWord(g_begin, 0),
                         &partial);
    return partial;
  }
  std::vector<float> values(l.group_size);
  std::vector<uint32_t> group_codes(l.group_size);
  for (uint64_t g = g_begin; g < g_end; ++g) {
    const uint64_t first = g * l.group_size;
    const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(l.group_size, l.numel - first));
    float lo = portable::BitsToFloat(0x7f800000u);  // +inf
    float hi = -lo;
    uint32_t nonfinite = 0;
    for (uint32_t i = 0; i < n; ++i) {
      const float v = elements::Load<K>(input, first + i);
      const bool finite = portable::IsFinite(v);
      nonfinite += finite ? 0u : 1u;
      lo = finite ? portable::Min(lo, v) : lo;
      hi = finite ? portable::Max(hi, v) : hi;
      values[i] = v;
    }
    partial.nonfinite += nonfinite;
    const quant_math::GroupParams p = quant_math::MakeGroupParams(lo, hi, kBits);
    if (!p.ok) ++partial.overflow_groups;
    words[g] = p.packed;
    partial.checksum += portable::ChecksumTerm(p.packed, g);
    // Stochastic rounding. A group lies in one 2^32-element stream of draws unless it straddles
    // a stream boundary (only past 2^32 elements): then each value takes the general draw.
    const auto quantize = [&](uint32_t i, float u) {
      const float v = values[i];
      // Non-finite values never reach a tensor that encodes (the caller refuses it); give
      // them code 0 without feeding NaN to the float-to-int conversion.
      const bool finite = portable::IsFinite(v);
      const uint32_t code = quant_math::Quantize(finite ? v : p.min, p, u, kLevels);
      group_codes[i] = finite ? code : 0u;
    };
    const portable::UniformDraws draws(l.seed, first, first + n);
    for (uint32_t i = 0; i < n; ++i) quantize(i, draws(first + i));
    for (uint32_t i = n; i < l.group_size; ++i) group_codes[i] = 0;
    uint32_t* out = words + l.CodeWord(g, 0);
    for (uint64_t w = 0; w < l.words_per_group; ++w) {
      uint32_t word = 0;
      for (uint32_t j = 0; j < kPerWord; ++j) word |= group_codes[w * kPerWord + j] << (j * kBits);
      out[w] = word;
      partial.checksum += portable::ChecksumTerm(word, l.CodeWord(g, w));
    }
  }
  return partial;
}

template <int K, int kBits>
void DecodeGroups(const uint32_t* words, const Layout& l, void* output, uint64_t g_begin,
                  uint64_t g_end) {
  constexpr uint32_t kPerWord = 32 / kBits;
  constexpr uint32_t kMask = (1u << kBits) - 1;
  if (simd::Vectorized()) {
    for (uint64_t g = g_begin; g < g_end; ++g) {
      const uint64_t first = g * l.group_size;
      const uint32_t n = static_cast<uint32_t>(std::min<uint64_t>(l.group_size, l.numel - first));
      simd::DequantizeGroup(K, words + l.CodeWord(g, 0), words[g], n, kBits, nullptr,
                            elements::Offset<K>(output, first));
    }
    return;
  }
  for (uint64_t g = g_begin; g < g_end; ++g) {
    const quant_math::GroupParams p = quant_math::UnpackGroupParams(words[g]);
    const uint64_t first = g * l.group_size;
    const uint64_t n = std::min<uint64_t>(l.group_size, l.numel - first);
    const uint32_t* in = words + l.CodeWord(g, 0);
    const uint64_t full_words = n / kPerWord;
    for (uint64_t w = 0; w < full_words; ++w) {
      const uint32_t word = in[w];
      for (uint32_t j = 0; j < kPerWord; ++j) {
        elements::Store<K>(output, first + w * kPerWord + j,
                           quant_math::Dequantize((word >> (j * kBits)) & kMask, p));
      }
    }
    for (uint64_t k = full_words * kPerWord; k < n; ++k) {
      const uint32_t code = (in[k / kPerWord] >> ((k % kPerWord) * kBits)) & kMask;
      elements::Store<K>(output, first + k, quant_math::Dequantize(code, p));
    }
  }
}

// Groups per parallel chunk: about 64 Ki values, enough to amortise a thread start.
int64_t GroupGrain(const Layout& l) { return std::max<int64_t>(1, 65536 / l.group_size); }

class Quant final : public Codec {
 public:
  CodecId id() const override { return CodecId::kQuant; }
  absl::string_view name() const override { return "quant"; }
  bool lossless() const override { return false; }
  std::vector<std::string> AutoSpecs() const override { return {"quant8", "quant4", "quant2"}; }

  absl::Status CheckEncodable(const TensorSpec& spec, const CodecParams& params) const override {
    if (!IsLossyFloat(spec.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actpack: quant encodes float32, float16 and bfloat16 tensors, not ",
          DTypeName(spec.dtype)));
    }
    if (params.bits != 1 && params.bits != 2 && params.bits != 4 && params.bits != 8) {
      return absl::InvalidArgumentError(
          absl::StrCat("actpack: quant bits must be 1, 2, 4 or 8, not ", params.bits));
    }
    if (params.group_size <= 0 || params.group_size % 32 != 0 || params.group_size > 65536) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actpack: quant group size must be a positive multiple of 32 up to 65536, not ",
          params.group_size));
    }
    return absl::OkStatus();
  }

  uint64_t MaxPayloadSize(const TensorSpec& spec, const CodecParams& params) const override {
    return 4 * MakeLayout(spec.numel(), params.group_size, params.bits, params.seed).payload_words();
  }

  absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input, const CodecParams& params,
                                            Header* header, uint8_t* payload,
                                            const ExecContext& context,
                                            DeviceStatus* status) const override {
    const Layout l = MakeLayout(header->numel, params.group_size, params.bits, params.seed);
    WriteParams(l, header);
    if (input.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      // One launch: the payload, its checksum and counts, and the header before it.
      header->payload_size = 4 * l.payload_words();
      absl::Status queued =
          cuda::QuantEncode(input.data, l, elements::KindOf(input.dtype), HeaderWordsOf(*header),
                            payload - kHeaderSize, status, context.stream);
      if (!queued.ok()) return queued;
      PayloadInfo info{4 * l.payload_words(), 0};
      info.header_written = true;
      return info;
#else
      return internal::CudaNotCompiledIn("quant encode");
#endif
    }
    Partial total;
    {
      std::vector<Partial> partials(internal::MaxParallelChunks());
      uint32_t* words = reinterpret_cast<uint32_t*>(payload);
      internal::ParallelFor(l.groups, GroupGrain(l), [&](int chunk, int64_t begin, int64_t end) {
        elements::DispatchKindAndBits(input.dtype, l.bits, [&]<int K, int kBits>() {
          partials[chunk] = EncodeGroups<K, kBits>(input.data, l, words, begin, end);
        });
      });
      for (const Partial& p : partials) {
        total.checksum += p.checksum;
        total.nonfinite += p.nonfinite;
        total.overflow_groups += p.overflow_groups;
      }
    }
    DeviceStatus counts{};
    counts.nonfinite = total.nonfinite;
    counts.unrepresentable = total.overflow_groups;
    absl::Status refused = Refusal(counts, *header);
    if (!refused.ok()) return refused;
    return PayloadInfo{4 * l.payload_words(), total.checksum};
  }

  absl::Status Refusal(const DeviceStatus& counts, const Header&) const override {
    if (counts.nonfinite > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("actpack: quant cannot encode a tensor with ", counts.nonfinite,
                       " non-finite values; keep it exact"));
    }
    if (counts.unrepresentable > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("actpack: quant cannot encode a tensor whose value range overflows float "
                       "in ", counts.unrepresentable, " groups; keep it exact"));
    }
    return absl::OkStatus();
  }

  absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                             const MutableTensorView& output, const ExecContext& context,
                             DeviceStatus* status) const override {
    absl::StatusOr<Layout> layout = CheckedLayout(header);
    if (!layout.ok()) return layout.status();
    const Layout& l = *layout;
    const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
    internal::ParallelFor(l.groups, GroupGrain(l), [&](int, int64_t begin, int64_t end) {
      elements::DispatchKindAndBits(header.dtype, l.bits, [&]<int K, int kBits>() {
        DecodeGroups<K, kBits>(words, l, output.data, begin, end);
      });
    });
    return absl::OkStatus();
  }

  bool ChecksOwnBuffer() const override { return true; }

  absl::Status DecodeCheckedPayload(const Header& header, const DeviceBufferCheck& check,
                                    const MutableTensorView& output, const ExecContext& context,
                                    DeviceStatus* status) const override {
    absl::StatusOr<Layout> layout = CheckedLayout(header);
    if (!layout.ok()) return layout.status();
#ifdef ACTPACK_WITH_CUDA
    return cuda::QuantDecode(check.buffer, check.capacity, check.expected, check.known, *layout,
                             elements::KindOf(header.dtype), output.data, status, context.stream);
#else
    return internal::CudaNotCompiledIn("quant decode");
#endif
  }

 private:
  // The payload's layout from the header; kDataLoss for parameters, a dtype or a payload size
  // no quant encode writes.
  static absl::StatusOr<Layout> CheckedLayout(const Header& header) {
    absl::StatusOr<Layout> layout = ReadParams(header);
    if (!layout.ok()) return layout.status();
    if (!IsLossyFloat(header.dtype)) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt quant buffer: dtype ",
                                              DTypeName(header.dtype)));
    }
    if (header.payload_size != 4 * layout->payload_words()) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt quant buffer: payload of ",
                                              header.payload_size, " bytes, expected ",
                                              4 * layout->payload_words()));
    }
    return layout;
  }
};

}  // namespace

const Codec* QuantCodec() {
  static const Quant* const codec = new Quant();
  return codec;
}

}  // namespace actpack::codecs

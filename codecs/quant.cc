#include "codecs/quant.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/internal/cuda_status.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/parallel.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/quant_math.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs {
namespace {

struct Layout {
  uint64_t numel;
  uint32_t group_size;
  uint32_t bits;
  uint64_t seed;
  uint64_t groups;
  uint64_t words_per_group;
  uint64_t payload_size() const { return 4 * groups * (1 + words_per_group); }
};

Layout MakeLayout(uint64_t numel, uint32_t group_size, uint32_t bits, uint64_t seed) {
  Layout l{numel, group_size, bits, seed, 0, 0};
  l.groups = (numel + group_size - 1) / group_size;
  l.words_per_group = uint64_t{group_size} * bits / 32;
  return l;
}

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
  if (group_size == 0 || group_size % 32 != 0 || group_size > 65536) {
    return absl::DataLossError(
        absl::StrCat("actpack: corrupt quant buffer: group size ", group_size));
  }
  return MakeLayout(header.numel, group_size, bits, seed);
}

struct Partial {
  uint64_t checksum = 0;
  uint64_t nonfinite = 0;
  uint64_t overflow_groups = 0;
};

template <int K>
Partial EncodeGroups(const void* input, const Layout& l, uint32_t* words, uint64_t g_begin,
                     uint64_t g_end) {
  Partial partial;
  const uint32_t levels = (1u << l.bits) - 1;
  const uint32_t per_word = 32 / l.bits;
  uint32_t* codes = words + l.groups;
  for (uint64_t g = g_begin; g < g_end; ++g) {
    const uint64_t first = g * l.group_size;
    const uint64_t last = std::min<uint64_t>(first + l.group_size, l.numel);
    float lo = 3.4e38f * 10.0f;  // +inf
    float hi = -lo;
    for (uint64_t i = first; i < last; ++i) {
      const float v = elements::Load<K>(input, i);
      if (!portable::IsFinite(v)) {
        ++partial.nonfinite;
        continue;
      }
      lo = portable::Min(lo, v);
      hi = portable::Max(hi, v);
    }
    const quant_math::GroupParams p = quant_math::MakeGroupParams(lo, hi, l.bits);
    if (!p.ok) ++partial.overflow_groups;
    words[g] = p.packed;
    partial.checksum += portable::ChecksumTerm(p.packed, g);
    for (uint64_t w = 0; w < l.words_per_group; ++w) {
      uint32_t word = 0;
      const uint64_t base = first + w * per_word;
      for (uint32_t j = 0; j < per_word; ++j) {
        const uint64_t i = base + j;
        if (i >= last) break;
        const float v = elements::Load<K>(input, i);
        if (!portable::IsFinite(v)) continue;
        const uint32_t code =
            quant_math::Quantize(v, p, portable::UniformFloat(l.seed, i), levels);
        word |= code << (j * l.bits);
      }
      const uint64_t index = g * l.words_per_group + w;
      codes[index] = word;
      partial.checksum += portable::ChecksumTerm(word, l.groups + index);
    }
  }
  return partial;
}

template <int K>
void DecodeGroups(const uint32_t* words, const Layout& l, void* output, uint64_t g_begin,
                  uint64_t g_end) {
  const uint32_t mask = (1u << l.bits) - 1;
  const uint32_t per_word = 32 / l.bits;
  const uint32_t* codes = words + l.groups;
  for (uint64_t g = g_begin; g < g_end; ++g) {
    const quant_math::GroupParams p = quant_math::UnpackGroupParams(words[g]);
    const uint64_t first = g * l.group_size;
    const uint64_t last = std::min<uint64_t>(first + l.group_size, l.numel);
    for (uint64_t i = first; i < last; ++i) {
      const uint64_t k = i - first;
      const uint32_t word = codes[g * l.words_per_group + k / per_word];
      const uint32_t code = (word >> ((k % per_word) * l.bits)) & mask;
      elements::Store<K>(output, i, quant_math::Dequantize(code, p));
    }
  }
}

// Groups per parallel chunk: about 64 Ki values, enough to amortise a thread start.
int64_t GroupGrain(const Layout& l) { return std::max<int64_t>(1, 65536 / l.group_size); }

class Quant final : public Codec {
 public:
  CodecId id() const override { return CodecId::kQuant; }
  absl::string_view name() const override { return "quant"; }

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
    return MakeLayout(spec.numel(), params.group_size, params.bits, params.seed).payload_size();
  }

  absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input, const CodecParams& params,
                                            Header* header, uint8_t* payload,
                                            const ExecContext& context) const override {
    const Layout l = MakeLayout(header->numel, params.group_size, params.bits, params.seed);
    WriteParams(l, header);
    Partial total;
    if (input.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      const cuda::QuantLayout cl{l.numel, l.group_size, l.bits, l.seed,
                                 static_cast<int>(input.dtype)};
      absl::Status status = internal::CudaStatus(
          cuda::QuantEncode(input.data, cl, payload, context.stream, &total.checksum,
                            &total.nonfinite, &total.overflow_groups));
      if (!status.ok()) return status;
#else
      return internal::CudaNotCompiledIn("quant encode");
#endif
    } else {
      std::vector<Partial> partials(internal::MaxParallelChunks());
      uint32_t* words = reinterpret_cast<uint32_t*>(payload);
      internal::ParallelFor(l.groups, GroupGrain(l), [&](int chunk, int64_t begin, int64_t end) {
        switch (input.dtype) {
          case DType::kFloat16:
            partials[chunk] = EncodeGroups<elements::kF16>(input.data, l, words, begin, end);
            break;
          case DType::kBFloat16:
            partials[chunk] = EncodeGroups<elements::kBF16>(input.data, l, words, begin, end);
            break;
          default:
            partials[chunk] = EncodeGroups<elements::kF32>(input.data, l, words, begin, end);
        }
      });
      for (const Partial& p : partials) {
        total.checksum += p.checksum;
        total.nonfinite += p.nonfinite;
        total.overflow_groups += p.overflow_groups;
      }
    }
    if (total.nonfinite > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("actpack: quant cannot encode a tensor with ", total.nonfinite,
                       " non-finite values; keep it exact"));
    }
    if (total.overflow_groups > 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("actpack: quant cannot encode a tensor whose value range overflows float "
                       "in ", total.overflow_groups, " groups; keep it exact"));
    }
    return PayloadInfo{l.payload_size(), total.checksum};
  }

  absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                             const MutableTensorView& output,
                             const ExecContext& context) const override {
    absl::StatusOr<Layout> layout = ReadParams(header);
    if (!layout.ok()) return layout.status();
    const Layout& l = *layout;
    if (!IsLossyFloat(header.dtype)) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt quant buffer: dtype ",
                                              DTypeName(header.dtype)));
    }
    if (header.payload_size != l.payload_size()) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt quant buffer: payload of ",
                                              header.payload_size, " bytes, expected ",
                                              l.payload_size()));
    }
    if (output.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      const cuda::QuantLayout cl{l.numel, l.group_size, l.bits, l.seed,
                                 static_cast<int>(header.dtype)};
      return internal::CudaStatus(cuda::QuantDecode(payload, cl, output.data, context.stream));
#else
      return internal::CudaNotCompiledIn("quant decode");
#endif
    }
    const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
    internal::ParallelFor(l.groups, GroupGrain(l), [&](int, int64_t begin, int64_t end) {
      switch (header.dtype) {
        case DType::kFloat16:
          DecodeGroups<elements::kF16>(words, l, output.data, begin, end);
          break;
        case DType::kBFloat16:
          DecodeGroups<elements::kBF16>(words, l, output.data, begin, end);
          break;
        default:
          DecodeGroups<elements::kF32>(words, l, output.data, begin, end);
      }
    });
    return absl::OkStatus();
  }
};

}  // namespace

const Codec* QuantCodec() {
  static const Quant* const codec = new Quant();
  return codec;
}

}  // namespace actpack::codecs

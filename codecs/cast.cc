#include "codecs/cast.h"

#include <vector>

#include "absl/strings/str_cat.h"
#include "codecs/internal/cast_math.h"
#include "codecs/internal/cuda_status.h"
#include "codecs/internal/parallel.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/simd.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs {
namespace {

uint64_t PayloadWords(uint64_t numel) { return (numel + 1) / 2; }

constexpr int64_t kWordGrain = 32768;

using Partial = simd::CastTotals;

class Cast final : public Codec {
 public:
  CodecId id() const override { return CodecId::kCast; }
  absl::string_view name() const override { return "cast"; }
  bool lossless() const override { return false; }

  absl::Status CheckEncodable(const TensorSpec& spec, const CodecParams& params) const override {
    if (params.cast_to != DType::kFloat16 && params.cast_to != DType::kBFloat16) {
      return absl::InvalidArgumentError(
          absl::StrCat("actpack: cast stores float16 or bfloat16, not ",
                       DTypeName(params.cast_to)));
    }
    if (spec.dtype != DType::kFloat32) {
      return absl::InvalidArgumentError(
          absl::StrCat("actpack: cast encodes float32 tensors, not ", DTypeName(spec.dtype)));
    }
    return absl::OkStatus();
  }

  uint64_t MaxPayloadSize(const TensorSpec& spec, const CodecParams&) const override {
    return 4 * PayloadWords(spec.numel());
  }

  absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input, const CodecParams& params,
                                            Header* header, uint8_t* payload,
                                            const ExecContext& context,
                                            DeviceStatus* status) const override {
    const uint64_t numel = header->numel;
    const bool to_bf16 = params.cast_to == DType::kBFloat16;
    header->params.fill(0);
    header->params[0] = static_cast<uint8_t>(params.cast_to);
    const float* values = static_cast<const float*>(input.data);
    if (input.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      // One launch: the payload, its checksum and count, and the header before it.
      header->payload_size = 4 * PayloadWords(numel);
      absl::Status queued = cuda::CastEncode(values, numel, to_bf16 ? 1 : 0,
                                             HeaderWordsOf(*header), payload - kHeaderSize,
                                             status, context.stream);
      if (!queued.ok()) return queued;
      PayloadInfo info{4 * PayloadWords(numel), 0};
      info.header_written = true;
      return info;
#else
      return internal::CudaNotCompiledIn("cast encode");
#endif
    }
    Partial total;
    {
      std::vector<Partial> partials(internal::MaxParallelChunks());
      uint32_t* words = reinterpret_cast<uint32_t*>(payload);
      internal::ParallelFor(PayloadWords(numel), kWordGrain,
                            [&](int chunk, int64_t begin, int64_t end) {
                              Partial p;
                              if (simd::Vectorized()) {
                                simd::CastEncodeWords(values, numel, to_bf16, begin, end, words,
                                                      &p);
                                partials[chunk] = p;
                                return;
                              }
                              for (int64_t w = begin; w < end; ++w) {
                                words[w] = cast_math::EncodeWord(values, numel, to_bf16, w,
                                                                 &p.overflow);
                                p.checksum += portable::ChecksumTerm(words[w], w);
                              }
                              partials[chunk] = p;
                            });
      for (const Partial& p : partials) {
        total.checksum += p.checksum;
        total.overflow += p.overflow;
      }
    }
    DeviceStatus counts{};
    counts.unrepresentable = total.overflow;
    absl::Status refused = Refusal(counts, *header);
    if (!refused.ok()) return refused;
    return PayloadInfo{4 * PayloadWords(numel), total.checksum};
  }

  absl::Status Refusal(const DeviceStatus& counts, const Header& header) const override {
    if (counts.unrepresentable == 0) return absl::OkStatus();
    return absl::FailedPreconditionError(absl::StrCat(
        "actpack: cast to ", DTypeName(static_cast<DType>(header.params[0])), " would turn ",
        counts.unrepresentable, " finite values into infinity; keep exact"));
  }

  absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                             const MutableTensorView& output, const ExecContext& context,
                             DeviceStatus* status) const override {
    absl::StatusOr<bool> from_bf16 = CheckHeader(header);
    if (!from_bf16.ok()) return from_bf16.status();
    float* out = static_cast<float*>(output.data);
    const uint16_t* halves = reinterpret_cast<const uint16_t*>(payload);
    internal::ParallelFor(header.numel, 2 * kWordGrain, [&](int, int64_t begin, int64_t end) {
      if (simd::Vectorized()) {
        simd::CastDecodeElements(halves, *from_bf16, begin, end, out);
        return;
      }
      for (int64_t i = begin; i < end; ++i) {
        out[i] = cast_math::DecodeElement(halves, *from_bf16, i);
      }
    });
    return absl::OkStatus();
  }

  bool ChecksOwnBuffer() const override { return true; }

  absl::Status DecodeCheckedPayload(const Header& header, const DeviceBufferCheck& check,
                                    const MutableTensorView& output, const ExecContext& context,
                                    DeviceStatus* status) const override {
    absl::StatusOr<bool> from_bf16 = CheckHeader(header);
    if (!from_bf16.ok()) return from_bf16.status();
#ifdef ACTPACK_WITH_CUDA
    return cuda::CastDecode(check.buffer, check.capacity, check.expected, check.known,
                            header.numel, *from_bf16 ? 1 : 0, static_cast<float*>(output.data),
                            status, context.stream);
#else
    return internal::CudaNotCompiledIn("cast decode");
#endif
  }

 private:
  // Whether the payload holds bfloat16 (else float16); kDataLoss for parameters, a dtype or a
  // payload size no cast encode writes.
  static absl::StatusOr<bool> CheckHeader(const Header& header) {
    const DType stored = static_cast<DType>(header.params[0]);
    if (stored != DType::kFloat16 && stored != DType::kBFloat16) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt cast buffer: storage dtype code ",
                                              header.params[0]));
    }
    absl::Status unused = CheckParamBytesZero(header, 1, kParamBytes, "cast");
    if (!unused.ok()) return unused;
    if (header.dtype != DType::kFloat32) {
      return absl::DataLossError(
          absl::StrCat("actpack: corrupt cast buffer: dtype ", DTypeName(header.dtype)));
    }
    const uint64_t expected = 4 * PayloadWords(header.numel);
    if (header.payload_size != expected) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt cast buffer: payload of ",
                                              header.payload_size, " bytes, expected ",
                                              expected));
    }
    return stored == DType::kBFloat16;
  }
};

}  // namespace

const Codec* CastCodec() {
  static const Cast* const codec = new Cast();
  return codec;
}

}  // namespace actpack::codecs

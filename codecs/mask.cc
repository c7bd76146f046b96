#include "codecs/mask.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codecs/internal/cuda_status.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/parallel.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/simd.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs {
namespace {

uint64_t PayloadWords(uint64_t numel) { return (numel + 31) / 32; }

bool IsMaskable(DType dtype) {
  return IsLossyFloat(dtype) || dtype == DType::kBool || dtype == DType::kUInt8;
}

bool IsNaNBits(DType dtype, uint32_t bits) {
  switch (dtype) {
    case DType::kFloat32: return (bits & 0x7fffffffu) > 0x7f800000u;
    case DType::kFloat16: return (bits & 0x7fffu) > 0x7c00u;
    case DType::kBFloat16: return (bits & 0x7fffu) > 0x7f80u;
    default: return false;
  }
}

constexpr int64_t kWordGrain = 4096;

using Partial = simd::MaskTotals;

template <int Width>
Partial EncodeWords(const void* input, uint64_t numel, uint32_t* words, uint64_t begin,
                    uint64_t end) {
  Partial p;
  if (simd::Vectorized()) {
    simd::MaskEncodeWords(Width, input, numel, begin, end, words, &p);
    return p;
  }
  for (uint64_t w = begin; w < end; ++w) {
    uint32_t word = 0;
    const uint64_t first = 32 * w;
    const uint64_t count = numel - first < 32 ? numel - first : 32;
    for (uint64_t j = 0; j < count; ++j) {
      const uint32_t bits = elements::LoadBits<Width>(input, first + j);
      if (bits == 0) continue;
      word |= 1u << j;
      p.max_bits = bits > p.max_bits ? bits : p.max_bits;
      p.min_bits = bits < p.min_bits ? bits : p.min_bits;
    }
    words[w] = word;
    p.checksum += portable::ChecksumTerm(word, w);
  }
  return p;
}

// Elements [32 * begin_word, min(numel, 32 * end_word)).
template <int Width>
void DecodeWords(const uint32_t* words, uint64_t numel, uint32_t value, void* output,
                 uint64_t begin_word, uint64_t end_word) {
  if (simd::Vectorized()) {
    simd::MaskDecodeWords(Width, words, numel, value, begin_word, end_word, output);
    return;
  }
  const uint64_t end = std::min(numel, 32 * end_word);
  for (uint64_t i = 32 * begin_word; i < end; ++i) {
    const bool set = (words[i / 32] >> (i % 32)) & 1u;
    elements::StoreBits<Width>(output, i, set ? value : 0u);
  }
}

class Mask final : public Codec {
 public:
  CodecId id() const override { return CodecId::kMask; }
  absl::string_view name() const override { return "mask"; }
  bool lossless() const override { return true; }

  absl::Status CheckEncodable(const TensorSpec& spec, const CodecParams&) const override {
    if (!IsMaskable(spec.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actpack: mask encodes float32, float16, bfloat16, bool and uint8 tensors, not ",
          DTypeName(spec.dtype)));
    }
    return absl::OkStatus();
  }

  uint64_t MaxPayloadSize(const TensorSpec& spec, const CodecParams&) const override {
    return 4 * PayloadWords(spec.numel());
  }

  absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input, const CodecParams&,
                                            Header* header, uint8_t* payload,
                                            const ExecContext& context,
                                            DeviceStatus* status) const override {
    const uint64_t numel = header->numel;
    const int width = static_cast<int>(ElementSize(input.dtype));
    header->params.fill(0);
    if (input.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      // One launch: the payload, its checksum, the value, and the header before it.
      header->payload_size = 4 * PayloadWords(numel);
      absl::Status queued =
          cuda::MaskEncode(input.data, numel, static_cast<int>(input.dtype),
                           HeaderWordsOf(*header), payload - kHeaderSize, status, context.stream);
      if (!queued.ok()) return queued;
      PayloadInfo info{4 * PayloadWords(numel), 0};
      info.params_on_device = true;  // the value
      info.header_written = true;
      return info;
#else
      return internal::CudaNotCompiledIn("mask encode");
#endif
    }
    Partial total;
    {
      std::vector<Partial> partials(internal::MaxParallelChunks());
      uint32_t* words = reinterpret_cast<uint32_t*>(payload);
      const void* data = input.data;
      internal::ParallelFor(PayloadWords(numel), kWordGrain,
                            [&](int chunk, int64_t begin, int64_t end) {
                              Partial& p = partials[chunk];
                              switch (width) {
                                case 4: p = EncodeWords<4>(data, numel, words, begin, end); break;
                                case 2: p = EncodeWords<2>(data, numel, words, begin, end); break;
                                default: p = EncodeWords<1>(data, numel, words, begin, end);
                              }
                            });
      for (const Partial& p : partials) {
        total.checksum += p.checksum;
        total.max_bits = p.max_bits > total.max_bits ? p.max_bits : total.max_bits;
        total.min_bits = p.min_bits < total.min_bits ? p.min_bits : total.min_bits;
      }
    }
    const uint32_t value = total.max_bits;  // 0 when every element is zero
    std::memcpy(header->params.data(), &value, 4);
    // The counts as the GPU's kernels leave them (mask_kernels.cu): the largest nonzero bits
    // and the complement of the smallest.
    DeviceStatus counts{};
    counts.work[0] = total.max_bits;
    counts.work[1] = value == 0 ? 0 : ~static_cast<uint64_t>(total.min_bits);
    counts.unrepresentable = (value != 0 && total.min_bits != value) ||
                             IsNaNBits(input.dtype, value) ||
                             (input.dtype == DType::kBool && value > 1);
    absl::Status refused = Refusal(counts, *header);
    if (!refused.ok()) return refused;
    return PayloadInfo{4 * PayloadWords(numel), total.checksum};
  }

  // counts.work: the largest nonzero element bits and the complement of the smallest.
  absl::Status Refusal(const DeviceStatus& counts, const Header& header) const override {
    if (counts.unrepresentable == 0) return absl::OkStatus();
    const uint32_t value = static_cast<uint32_t>(counts.work[0]);
    const uint32_t smallest = value == 0 ? 0u : static_cast<uint32_t>(~counts.work[1]);
    if (smallest != value) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "actpack: mask needs a tensor of zeros and one other value; this %s tensor has at "
          "least two (bits 0x%x and 0x%x)",
          DTypeName(header.dtype), smallest, value));
    }
    if (IsNaNBits(header.dtype, value)) {
      return absl::FailedPreconditionError(
          "actpack: mask cannot encode a tensor whose nonzero value is NaN");
    }
    if (header.dtype == DType::kBool && value > 1) {
      // Only 0 and 1 are bools; the decoder refuses any other stored value.
      return absl::FailedPreconditionError(absl::StrFormat(
          "actpack: mask cannot encode a bool tensor holding byte 0x%x; keep it exact", value));
    }
    return absl::FailedPreconditionError("actpack: mask cannot encode this tensor");
  }

  bool ReadsDeviceParams() const override { return true; }

  absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                             const MutableTensorView& output, const ExecContext& context,
                             DeviceStatus* status) const override {
    absl::Status valid = CheckHeader(header);
    if (!valid.ok()) return valid;
    const int width = static_cast<int>(ElementSize(header.dtype));
    uint32_t value;
    std::memcpy(&value, header.params.data(), 4);
    const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
    const uint64_t numel = header.numel;
    internal::ParallelFor(PayloadWords(numel), kWordGrain, [&](int, int64_t begin, int64_t end) {
      switch (width) {
        case 4: DecodeWords<4>(words, numel, value, output.data, begin, end); break;
        case 2: DecodeWords<2>(words, numel, value, output.data, begin, end); break;
        default: DecodeWords<1>(words, numel, value, output.data, begin, end);
      }
    });
    return absl::OkStatus();
  }

  // Its decode launch checks the buffer, and reads and checks the value in the buffer's header
  // on the device: a deferred decode's host header does not know it (0, which passes the
  // host's checks).
  bool ChecksOwnBuffer() const override { return true; }

  absl::Status DecodeCheckedPayload(const Header& header, const DeviceBufferCheck& check,
                                    const MutableTensorView& output, const ExecContext& context,
                                    DeviceStatus* status) const override {
    absl::Status valid = CheckHeader(header);
    if (!valid.ok()) return valid;
#ifdef ACTPACK_WITH_CUDA
    return cuda::MaskDecode(check.buffer, check.capacity, check.expected, check.known,
                            header.numel, static_cast<int>(header.dtype), output.data, status,
                            context.stream);
#else
    return internal::CudaNotCompiledIn("mask decode");
#endif
  }

 private:
  // kDataLoss for a dtype, payload size or parameters no mask encode writes.
  static absl::Status CheckHeader(const Header& header) {
    if (!IsMaskable(header.dtype)) {
      return absl::DataLossError(
          absl::StrCat("actpack: corrupt mask buffer: dtype ", DTypeName(header.dtype)));
    }
    const uint64_t expected = 4 * PayloadWords(header.numel);
    if (header.payload_size != expected) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt mask buffer: payload of ",
                                              header.payload_size, " bytes, expected ",
                                              expected));
    }
    const int width = static_cast<int>(ElementSize(header.dtype));
    uint32_t value;
    std::memcpy(&value, header.params.data(), 4);
    if ((width < 4 && (value >> (8 * width)) != 0) || IsNaNBits(header.dtype, value) ||
        (header.dtype == DType::kBool && value > 1)) {
      return absl::DataLossError(
          absl::StrFormat("actpack: corrupt mask buffer: value bits 0x%x for %s", value,
                          DTypeName(header.dtype)));
    }
    return CheckParamBytesZero(header, 4, kParamBytes, "mask");
  }
};

}  // namespace

const Codec* MaskCodec() {
  static const Mask* const codec = new Mask();
  return codec;
}

}  // namespace actpack::codecs

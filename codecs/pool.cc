#include "codecs/pool.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "codecs/internal/cuda_status.h"
#include "codecs/internal/element_kind.h"
#include "codecs/internal/elements.h"
#include "codecs/internal/parallel.h"
#include "codecs/internal/pool_math.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/simd.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs {
namespace {

constexpr int kMinWindow = 2;
constexpr int kMaxWindow = 64;

// [rows, row_length] of a tensor of this shape: the last dimension is the row.
pool_math::Shape ShapeOf(absl::Span<const int64_t> shape, uint64_t numel, uint32_t window) {
  const uint64_t row_length = shape.empty() ? 1 : static_cast<uint64_t>(shape.back());
  const uint64_t rows = row_length == 0 ? 0 : numel / row_length;
  return pool_math::MakeShape(rows, row_length, window);
}

uint64_t PayloadBytes(const pool_math::Shape& s, DType dtype) {
  const uint64_t bytes = s.means * ElementSize(dtype);
  return (bytes + 3) / 4 * 4;
}

using Partial = simd::PoolTotals;

// Whether the vector kernels take this tensor: rows of whole windows they handle, so that the
// windows tile the flattened tensor.
bool PoolVectorized(const pool_math::Shape& s) {
  return simd::PoolWindowVectorized(s.window) && s.row_length % s.window == 0 &&
         simd::Vectorized();
}

template <int K>
Partial EncodeWords(const void* input, const pool_math::Shape& s, uint32_t* words,
                    uint64_t begin, uint64_t end) {
  Partial p;
  for (uint64_t w = begin; w < end; ++w) {
    words[w] = pool_math::EncodeWord<K>(input, s, w, &p.nonfinite);
    p.checksum += portable::ChecksumTerm(words[w], w);
  }
  return p;
}

// Output elements [begin, end): each is its window's mean, copied bit for bit.
template <int Width>
void DecodeElements(const uint8_t* payload, const pool_math::Shape& s, void* output,
                    uint64_t begin, uint64_t end) {
  uint64_t row = begin / s.row_length;
  uint64_t column = begin - row * s.row_length;
  for (uint64_t i = begin; i < end; ++i) {
    const uint64_t mean = row * s.means_per_row + column / s.window;
    elements::StoreBits<Width>(output, i, elements::LoadBits<Width>(payload, mean));
    if (++column == s.row_length) {
      column = 0;
      ++row;
    }
  }
}

class Pool final : public Codec {
 public:
  CodecId id() const override { return CodecId::kPool; }
  absl::string_view name() const override { return "pool"; }
  bool lossless() const override { return false; }

  absl::Status CheckEncodable(const TensorSpec& spec, const CodecParams& params) const override {
    if (!IsLossyFloat(spec.dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actpack: pool encodes float32, float16 and bfloat16 tensors, not ",
          DTypeName(spec.dtype)));
    }
    if (params.pool_window < kMinWindow || params.pool_window > kMaxWindow) {
      return absl::InvalidArgumentError(absl::StrCat("actpack: pool window k must be ",
                                                     kMinWindow, "..", kMaxWindow, ", not ",
                                                     params.pool_window));
    }
    return absl::OkStatus();
  }

  uint64_t MaxPayloadSize(const TensorSpec& spec, const CodecParams& params) const override {
    return PayloadBytes(ShapeOf(spec.shape, spec.numel(), params.pool_window), spec.dtype);
  }

  absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input, const CodecParams& params,
                                            Header* header, uint8_t* payload,
                                            const ExecContext& context,
                                            DeviceStatus* status) const override {
    const uint32_t window = static_cast<uint32_t>(params.pool_window);
    const pool_math::Shape s = ShapeOf(input.shape, header->numel, window);
    const uint64_t bytes = PayloadBytes(s, input.dtype);
    header->params.fill(0);
    std::memcpy(header->params.data(), &window, 4);
    if (input.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      // One launch: the payload, its checksum and count, and the header before it.
      header->payload_size = bytes;
      const cuda::PoolLayout layout{s.rows, s.row_length, window, elements::KindOf(input.dtype)};
      absl::Status queued = cuda::PoolEncode(input.data, layout, HeaderWordsOf(*header),
                                             payload - kHeaderSize, status, context.stream);
      if (!queued.ok()) return queued;
      PayloadInfo info{bytes, 0};
      info.header_written = true;
      return info;
#else
      return internal::CudaNotCompiledIn("pool encode");
#endif
    }
    Partial total;
    {
      std::vector<Partial> partials(internal::MaxParallelChunks());
      uint32_t* words = reinterpret_cast<uint32_t*>(payload);
      const int64_t grain = std::max<int64_t>(1, 65536 / window);
      const bool vectorized = PoolVectorized(s);
      internal::ParallelFor(bytes / 4, grain, [&](int chunk, int64_t begin, int64_t end) {
        if (vectorized) {
          simd::PoolEncodeWords(elements::KindOf(input.dtype), input.data, s.means, window, begin,
                                end, words, &partials[chunk]);
          return;
        }
        switch (input.dtype) {
          case DType::kFloat16:
            partials[chunk] = EncodeWords<elements::kF16>(input.data, s, words, begin, end);
            break;
          case DType::kBFloat16:
            partials[chunk] = EncodeWords<elements::kBF16>(input.data, s, words, begin, end);
            break;
          default:
            partials[chunk] = EncodeWords<elements::kF32>(input.data, s, words, begin, end);
        }
      });
      for (const Partial& p : partials) {
        total.checksum += p.checksum;
        total.nonfinite += p.nonfinite;
      }
    }
    DeviceStatus counts{};
    counts.nonfinite = total.nonfinite;
    absl::Status refused = Refusal(counts, *header);
    if (!refused.ok()) return refused;
    return PayloadInfo{bytes, total.checksum};
  }

  absl::Status Refusal(const DeviceStatus& counts, const Header&) const override {
    if (counts.nonfinite == 0) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("actpack: pool cannot encode a tensor with ", counts.nonfinite,
                     " non-finite window means (non-finite values or an overflowing sum); "
                     "keep it exact"));
  }

  absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                             const MutableTensorView& output, const ExecContext& context,
                             DeviceStatus* status) const override {
    absl::StatusOr<pool_math::Shape> shape = CheckedShape(header);
    if (!shape.ok()) return shape.status();
    const pool_math::Shape& s = *shape;
    const uint32_t window = s.window;
    if (PoolVectorized(s)) {
      const int width = static_cast<int>(ElementSize(header.dtype));
      internal::ParallelFor(s.means, 65536 / window, [&](int, int64_t begin, int64_t end) {
        simd::PoolDecodeMeans(width, payload, window, begin, end, output.data);
      });
      return absl::OkStatus();
    }
    internal::ParallelFor(s.rows * s.row_length, 65536, [&](int, int64_t begin, int64_t end) {
      if (header.dtype == DType::kFloat32) {
        DecodeElements<4>(payload, s, output.data, begin, end);
      } else {
        DecodeElements<2>(payload, s, output.data, begin, end);
      }
    });
    return absl::OkStatus();
  }

  bool ChecksOwnBuffer() const override { return true; }

  absl::Status DecodeCheckedPayload(const Header& header, const DeviceBufferCheck& check,
                                    const MutableTensorView& output, const ExecContext& context,
                                    DeviceStatus* status) const override {
    absl::StatusOr<pool_math::Shape> s = CheckedShape(header);
    if (!s.ok()) return s.status();
#ifdef ACTPACK_WITH_CUDA
    const cuda::PoolLayout layout{s->rows, s->row_length, s->window,
                                  elements::KindOf(header.dtype)};
    return cuda::PoolDecode(check.buffer, check.capacity, check.expected, check.known, layout,
                            output.data, status, context.stream);
#else
    return internal::CudaNotCompiledIn("pool decode");
#endif
  }

 private:
  // The means' shape from the header; kDataLoss for parameters, a dtype or a payload size no
  // pool encode writes.
  static absl::StatusOr<pool_math::Shape> CheckedShape(const Header& header) {
    if (!IsLossyFloat(header.dtype)) {
      return absl::DataLossError(
          absl::StrCat("actpack: corrupt pool buffer: dtype ", DTypeName(header.dtype)));
    }
    uint32_t window;
    std::memcpy(&window, header.params.data(), 4);
    if (window < kMinWindow || window > kMaxWindow) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt pool buffer: window ", window));
    }
    absl::Status unused = CheckParamBytesZero(header, 4, kParamBytes, "pool");
    if (!unused.ok()) return unused;
    const pool_math::Shape s = ShapeOf(header.Shape(), header.numel, window);
    const uint64_t expected = PayloadBytes(s, header.dtype);
    if (header.payload_size != expected) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt pool buffer: payload of ",
                                              header.payload_size, " bytes, expected ",
                                              expected));
    }
    return s;
  }
};

}  // namespace

const Codec* PoolCodec() {
  static const Pool* const codec = new Pool();
  return codec;
}

}  // namespace actpack::codecs

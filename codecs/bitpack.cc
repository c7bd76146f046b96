#include "codecs/bitpack.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codecs/internal/bitpack_math.h"
#include "codecs/internal/cuda_status.h"
#include "codecs/internal/parallel.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs {
namespace {

namespace bm = bitpack_math;

// The bitpack_math::Kind of an integer dtype; 0 for any other.
int KindOf(DType dtype) {
  switch (dtype) {
    case DType::kUInt8: return bm::kU8;
    case DType::kInt8: return bm::kI8;
    case DType::kInt16: return bm::kI16;
    case DType::kInt32: return bm::kI32;
    case DType::kInt64: return bm::kI64;
    default: return 0;
  }
}

// The dtype's smallest and largest value.
int64_t Lowest(DType dtype) { return bm::Lowest(KindOf(dtype)); }
int64_t Highest(DType dtype) { return bm::Highest(KindOf(dtype)); }

// Calls fn(std::integral_constant<int, K>) for the kind K.
template <typename Fn>
void DispatchKind(int kind, Fn&& fn) {
  switch (kind) {
    case bm::kU8: fn(std::integral_constant<int, bm::kU8>()); break;
    case bm::kI8: fn(std::integral_constant<int, bm::kI8>()); break;
    case bm::kI16: fn(std::integral_constant<int, bm::kI16>()); break;
    case bm::kI32: fn(std::integral_constant<int, bm::kI32>()); break;
    default: fn(std::integral_constant<int, bm::kI64>()); break;
  }
}

constexpr int64_t kElementGrain = 1 << 16;
constexpr int64_t kGroupGrain = 2048;  // 64 Ki elements

struct Range {
  int64_t lo = std::numeric_limits<int64_t>::max();
  int64_t hi = std::numeric_limits<int64_t>::min();
};

Range RangeOnCpu(const void* data, uint64_t numel, int kind) {
  std::vector<Range> partials(internal::MaxParallelChunks());
  DispatchKind(kind, [&](auto k) {
    constexpr int K = decltype(k)::value;
    internal::ParallelFor(numel, kElementGrain, [&](int chunk, int64_t begin, int64_t end) {
      int64_t lo = std::numeric_limits<int64_t>::max();
      int64_t hi = std::numeric_limits<int64_t>::min();
      for (int64_t i = begin; i < end; ++i) {
        const int64_t v = bm::Load<K>(data, i);
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
      }
      partials[chunk] = {lo, hi};
    });
  });
  Range total;
  for (const Range& p : partials) {
    total.lo = std::min(total.lo, p.lo);
    total.hi = std::max(total.hi, p.hi);
  }
  return total;
}

uint64_t PayloadBytes(uint64_t numel, uint32_t bits) { return 4 * bm::PayloadWords(numel, bits); }

struct Layout {
  int64_t base = 0;
  uint32_t bits = 0;
};

// b and base (bitpack.h) from the tensor's range, written into the header's parameters.
Layout WriteParams(const Range& range, DType dtype, Header* header) {
  const bm::Params p = bm::MakeParams(range.lo, range.hi, KindOf(dtype));
  Layout layout;
  layout.bits = p.bits;
  layout.base = p.base;
  header->params.fill(0);
  std::memcpy(header->params.data(), &layout.base, 8);
  header->params[8] = static_cast<uint8_t>(layout.bits);
  return layout;
}

class Bitpack final : public Codec {
 public:
  CodecId id() const override { return CodecId::kBitpack; }
  absl::string_view name() const override { return "bitpack"; }
  bool lossless() const override { return true; }

  absl::Status CheckEncodable(const TensorSpec& spec, const CodecParams&) const override {
    if (KindOf(spec.dtype) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "actpack: bitpack encodes uint8, int8, int16, int32 and int64 tensors, not ",
          DTypeName(spec.dtype)));
    }
    return absl::OkStatus();
  }

  uint64_t MaxPayloadSize(const TensorSpec& spec, const CodecParams&) const override {
    return PayloadBytes(spec.numel(), static_cast<uint32_t>(8 * ElementSize(spec.dtype)));
  }

  absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input, const CodecParams& params,
                                            Header* header, uint8_t* payload,
                                            const ExecContext& context,
                                            DeviceStatus* status) const override {
    const uint64_t numel = header->numel;
    const int kind = KindOf(input.dtype);
    if (input.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      header->params.fill(0);  // base and b come from the device
      absl::Status queued =
          cuda::BitpackEncode(input.data, numel, kind, payload, status, context.stream);
      if (!queued.ok()) return queued;
      PayloadInfo info{MaxPayloadSize(input.Spec(), params), 0};
      info.params_on_device = true;
      info.size_on_device = true;
      return info;
#else
      return internal::CudaNotCompiledIn("bitpack encode");
#endif
    }
    const Layout layout =
        WriteParams(numel > 0 ? RangeOnCpu(input.data, numel, kind) : Range{0, 0}, input.dtype,
                    header);
    std::vector<uint64_t> partials(internal::MaxParallelChunks(), 0);
    if (layout.bits > 0) {
      uint32_t* words = reinterpret_cast<uint32_t*>(payload);
      const void* data = input.data;
      const uint64_t groups = (numel + bm::kGroup - 1) / bm::kGroup;
      DispatchKind(kind, [&](auto k) {
        constexpr int K = decltype(k)::value;
        internal::ParallelFor(groups, kGroupGrain, [&](int chunk, int64_t begin, int64_t end) {
          uint64_t sum = 0;
          for (int64_t g = begin; g < end; ++g) {
            sum += bm::PackGroup<K>(data, numel, g, layout.base, layout.bits, words);
          }
          partials[chunk] = sum;
        });
      });
    }
    uint64_t checksum = 0;
    for (uint64_t p : partials) checksum += p;
    return PayloadInfo{PayloadBytes(numel, layout.bits), checksum};
  }

  bool ReadsDeviceParams() const override { return true; }

  absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                             const MutableTensorView& output, const ExecContext& context,
                             DeviceStatus* status) const override {
    const int kind = KindOf(header.dtype);
    if (kind == 0) {
      return absl::DataLossError(
          absl::StrCat("actpack: corrupt bitpack buffer: dtype ", DTypeName(header.dtype)));
    }
    int64_t base;
    std::memcpy(&base, header.params.data(), 8);
    const uint32_t bits = header.params[8];
    if (bits > 8 * ElementSize(header.dtype)) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt bitpack buffer: ", bits,
                                              " bits per element of ", DTypeName(header.dtype)));
    }
    // Every offset b bits hold, added to base, must be a value of the dtype.
    const int64_t lowest = Lowest(header.dtype), highest = Highest(header.dtype);
    if (base < lowest || base > highest ||
        static_cast<uint64_t>(highest) - static_cast<uint64_t>(base) < bm::Span(bits)) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt bitpack buffer: base ", base,
                                              " with ", bits, " bits leaves ",
                                              DTypeName(header.dtype)));
    }
    absl::Status unused = CheckParamBytesZero(header, 9, kParamBytes, "bitpack");
    if (!unused.ok()) return unused;
    const uint64_t expected = PayloadBytes(header.numel, bits);
    if (header.payload_size != expected) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt bitpack buffer: payload of ",
                                              header.payload_size, " bytes, expected ",
                                              expected));
    }
    const uint64_t numel = header.numel;
    if (output.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      // Base and b are read (and checked again) on the device, from the buffer's header: a
      // deferred decode's host header does not know them (0, which passes the checks above).
      return cuda::BitpackDecode(payload - kHeaderSize, numel, kind, status, output.data,
                                 context.stream);
#else
      return internal::CudaNotCompiledIn("bitpack decode");
#endif
    }
    const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
    const uint64_t groups = (numel + bm::kGroup - 1) / bm::kGroup;
    DispatchKind(kind, [&](auto k) {
      constexpr int K = decltype(k)::value;
      internal::ParallelFor(groups, kGroupGrain, [&](int, int64_t begin, int64_t end) {
        for (int64_t g = begin; g < end; ++g) {
          const uint64_t first = static_cast<uint64_t>(g) * bm::kGroup;
          const uint32_t count =
              static_cast<uint32_t>(std::min<uint64_t>(bm::kGroup, numel - first));
          const uint32_t* group = words + static_cast<uint64_t>(g) * bits;
          for (uint32_t j = 0; j < count; ++j) {
            bm::Store<K>(output.data, first + j,
                         static_cast<int64_t>(static_cast<uint64_t>(base) +
                                              bm::Extract(group, j, bits)));
          }
        }
      });
    });
    return absl::OkStatus();
  }
};

}  // namespace

const Codec* BitpackCodec() {
  static const Bitpack* const codec = new Bitpack();
  return codec;
}

}  // namespace actpack::codecs

// The self-describing format of an encoded tensor: a fixed 128-byte little-endian header
// followed by the codec's payload. codecs/FORMAT.md is the written specification.
//
//   offset size field
//        0    4 magic "APK1" (0x314b5041 little-endian)
//        4    2 format version (kFormatVersion)
//        6    2 codec id (CodecId)
//        8    1 dtype (DType)
//        9    1 ndim (0..kMaxDims)
//       10    2 flags (bit 0: the tensor held values the codec cannot represent; else 0)
//       12    4 header size (128)
//       16   64 shape, int64[kMaxDims], unused dims 0
//       80   24 codec parameters (each codec's own layout)
//      104    8 payload size in bytes
//      112    8 element count (product of the shape)
//      120    8 checksum over the header (with this field zero) and the payload
//
// Usage:
//   Header h = MakeHeader(CodecId::kQuant, DType::kFloat32, {8, 256});
//   ... write payload, then FinalizeHeader(h, payload) and WriteHeader(h, out) ...
//   absl::StatusOr<Header> parsed = ParseHeader(bytes, size);   // kDataLoss when corrupt
#ifndef ACTPACK_CODECS_FORMAT_H_
#define ACTPACK_CODECS_FORMAT_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "codecs/dtype.h"
#include "codecs/internal/device_status.h"

namespace actpack::codecs {

inline constexpr uint32_t kMagic = 0x314b5041;  // "APK1"
inline constexpr uint16_t kFormatVersion = 1;
inline constexpr size_t kHeaderSize = 128;
inline constexpr int kMaxDims = 8;
inline constexpr size_t kParamBytes = 24;

// Codec ids are pinned: they are written into buffers. Never reuse a retired id.
enum class CodecId : uint16_t {
  kIdentity = 1,
  kQuant = 2,
  kCast = 3,
  kMask = 4,
  kPool = 5,
  kEb = 6,
  kDivision = 7,
  // 8 was division_fft (a DFT low part), retired: division_dct replaced it.
  kBitpack = 9,
  kDivisionDct = 10,
};

struct Header {
  uint16_t version = kFormatVersion;
  CodecId codec = CodecId::kIdentity;
  DType dtype = DType::kFloat32;
  uint8_t ndim = 0;
  uint16_t flags = 0;
  std::array<int64_t, kMaxDims> shape{};
  std::array<uint8_t, kParamBytes> params{};
  uint64_t payload_size = 0;
  uint64_t numel = 0;
  uint64_t checksum = 0;

  std::vector<int64_t> Shape() const { return {shape.begin(), shape.begin() + ndim}; }
};

// A header for a tensor of this codec, dtype and shape; kInvalidArgument for too many dims or a
// negative dim.
absl::StatusOr<Header> MakeHeader(CodecId codec, DType dtype, absl::Span<const int64_t> shape);

// Serialises `header` into the first kHeaderSize bytes of `out`.
void WriteHeader(const Header& header, uint8_t* out);

// Parses and validates the header at the start of `bytes`: magic, version, header size, dtype,
// ndim, shape against the element count, and payload size against `size`. kDataLoss when the
// buffer is truncated or corrupt; the checksum is verified separately (VerifyChecksum).
absl::StatusOr<Header> ParseHeader(const uint8_t* bytes, size_t size);

// kDataLoss naming the codec and the byte when a codec parameter byte in [first, last), which
// the codec does not use, is not zero (FORMAT.md: unused bytes are written as zero).
absl::Status CheckParamBytesZero(const Header& header, size_t first, size_t last,
                                 absl::string_view codec);

// The checksum's contribution of the header: every header word but the checksum field.
uint64_t HeaderChecksum(const Header& header);

// The payload's contribution (host memory). Payload words are numbered from 0; a trailing
// partial word is zero-padded.
uint64_t PayloadChecksum(const uint8_t* payload, size_t size);

// Combines the two contributions into the value stored in the header.
uint64_t CombineChecksum(uint64_t header_sum, uint64_t payload_sum);

// kDataLoss naming expected and actual values when `header.checksum` does not match.
absl::Status VerifyChecksum(const Header& header, uint64_t payload_sum);

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_FORMAT_H_

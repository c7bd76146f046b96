#include "codecs/format.h"

#include <array>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "codecs/internal/parallel.h"
#include "codecs/internal/portable.h"
#include "codecs/internal/simd.h"

namespace actpack::codecs {
namespace {

// Little-endian field access; the build targets are little-endian, memcpy keeps it portable
// to unaligned buffers.
template <typename T>
void Put(uint8_t* out, size_t offset, T value) {
  std::memcpy(out + offset, &value, sizeof(T));
}

template <typename T>
T Get(const uint8_t* in, size_t offset) {
  T value;
  std::memcpy(&value, in + offset, sizeof(T));
  return value;
}

constexpr size_t kChecksumOffset = 120;
// Payload words per parallel chunk of the checksum.
constexpr int64_t kChecksumGrain = 1 << 16;
// Header words are numbered after every possible payload word so the two never mix.

}  // namespace

absl::StatusOr<Header> MakeHeader(CodecId codec, DType dtype, absl::Span<const int64_t> shape) {
  if (shape.size() > static_cast<size_t>(kMaxDims)) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: a tensor with ", shape.size(),
                                                   " dimensions cannot be encoded; at most ",
                                                   kMaxDims, " are supported"));
  }
  Header header;
  header.codec = codec;
  header.dtype = dtype;
  header.ndim = static_cast<uint8_t>(shape.size());
  uint64_t numel = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("actpack: dimension ", i, " of the shape is negative (", shape[i], ")"));
    }
    header.shape[i] = shape[i];
    numel *= static_cast<uint64_t>(shape[i]);
  }
  header.numel = numel;
  return header;
}

void WriteHeader(const Header& header, uint8_t* out) {
  std::memset(out, 0, kHeaderSize);
  Put<uint32_t>(out, 0, kMagic);
  Put<uint16_t>(out, 4, header.version);
  Put<uint16_t>(out, 6, static_cast<uint16_t>(header.codec));
  Put<uint8_t>(out, 8, static_cast<uint8_t>(header.dtype));
  Put<uint8_t>(out, 9, header.ndim);
  Put<uint16_t>(out, 10, header.flags);
  Put<uint32_t>(out, 12, static_cast<uint32_t>(kHeaderSize));
  for (int i = 0; i < kMaxDims; ++i) Put<int64_t>(out, 16 + 8 * i, header.shape[i]);
  std::memcpy(out + 80, header.params.data(), kParamBytes);
  Put<uint64_t>(out, 104, header.payload_size);
  Put<uint64_t>(out, 112, header.numel);
  Put<uint64_t>(out, kChecksumOffset, header.checksum);
}

absl::StatusOr<Header> ParseHeader(const uint8_t* bytes, size_t size) {
  if (size < kHeaderSize) {
    return absl::DataLossError(absl::StrCat("actpack: encoded buffer is truncated: ", size,
                                            " bytes, shorter than the ", kHeaderSize,
                                            "-byte header"));
  }
  const uint32_t magic = Get<uint32_t>(bytes, 0);
  if (magic != kMagic) {
    return absl::DataLossError(absl::StrFormat(
        "actpack: not an actpack buffer: magic 0x%08x, expected 0x%08x (\"APK1\")", magic,
        kMagic));
  }
  Header header;
  header.version = Get<uint16_t>(bytes, 4);
  if (header.version != kFormatVersion) {
    return absl::DataLossError(absl::StrCat("actpack: unsupported format version ",
                                            header.version, "; this build reads version ",
                                            kFormatVersion));
  }
  const uint32_t header_size = Get<uint32_t>(bytes, 12);
  if (header_size != kHeaderSize) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt header: header size ",
                                            header_size, ", expected ", kHeaderSize));
  }
  header.codec = static_cast<CodecId>(Get<uint16_t>(bytes, 6));
  const uint8_t raw_dtype = Get<uint8_t>(bytes, 8);
  if (!IsValidDType(raw_dtype)) {
    return absl::DataLossError(
        absl::StrCat("actpack: corrupt header: unknown dtype code ", raw_dtype));
  }
  header.dtype = static_cast<DType>(raw_dtype);
  header.ndim = Get<uint8_t>(bytes, 9);
  if (header.ndim > kMaxDims) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt header: ndim ", header.ndim,
                                            ", at most ", kMaxDims));
  }
  header.flags = Get<uint16_t>(bytes, 10);
  if ((header.flags & ~kFlagUnrepresentable) != 0) {
    return absl::DataLossError(
        absl::StrCat("actpack: corrupt header: unknown flags 0x", absl::Hex(header.flags)));
  }
  // The element count must match the shape, computed without overflow.
  unsigned __int128 numel = 1;
  for (int i = 0; i < kMaxDims; ++i) {
    header.shape[i] = Get<int64_t>(bytes, 16 + 8 * i);
    if (i >= header.ndim) {
      if (header.shape[i] != 0) {
        return absl::DataLossError(
            absl::StrCat("actpack: corrupt header: unused dimension ", i, " is ",
                         header.shape[i], ", expected 0"));
      }
      continue;
    }
    if (header.shape[i] < 0) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt header: dimension ", i,
                                              " is negative (", header.shape[i], ")"));
    }
    numel *= static_cast<uint64_t>(header.shape[i]);
    if (numel > (static_cast<unsigned __int128>(1) << 62)) {
      return absl::DataLossError("actpack: corrupt header: the shape's element count overflows");
    }
  }
  std::memcpy(header.params.data(), bytes + 80, kParamBytes);
  header.payload_size = Get<uint64_t>(bytes, 104);
  header.numel = Get<uint64_t>(bytes, 112);
  header.checksum = Get<uint64_t>(bytes, kChecksumOffset);
  if (header.numel != static_cast<uint64_t>(numel)) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt header: element count ",
                                            header.numel, " does not match the shape's ",
                                            static_cast<uint64_t>(numel)));
  }
  const unsigned __int128 raw_bytes =
      static_cast<unsigned __int128>(header.numel) * ElementSize(header.dtype);
  if (raw_bytes > (static_cast<unsigned __int128>(1) << 62)) {
    return absl::DataLossError(absl::StrCat("actpack: corrupt header: ", header.numel, " ",
                                            DTypeName(header.dtype),
                                            " elements are more bytes than any tensor holds"));
  }
  if (header.payload_size > size - kHeaderSize) {
    return absl::DataLossError(absl::StrCat(
        "actpack: encoded buffer is truncated: header announces ", header.payload_size,
        " payload bytes, buffer holds ", size - kHeaderSize));
  }
  return header;
}

absl::Status CheckParamBytesZero(const Header& header, size_t first, size_t last,
                                 absl::string_view codec) {
  for (size_t i = first; i < last && i < kParamBytes; ++i) {
    if (header.params[i] != 0) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt ", codec,
                                              " buffer: parameter byte ", i, " is not zero"));
    }
  }
  return absl::OkStatus();
}

uint64_t HeaderChecksum(const Header& header) {
  uint8_t bytes[kHeaderSize];
  Header copy = header;
  copy.checksum = 0;
  WriteHeader(copy, bytes);
  uint64_t sum = 0;
  for (size_t w = 0; w < kChecksumOffset / 4; ++w) {
    sum += portable::HeaderChecksumTerm(Get<uint32_t>(bytes, 4 * w), static_cast<uint32_t>(w));
  }
  return sum;
}

uint64_t PayloadChecksum(const uint8_t* payload, size_t size) {
  const size_t full_words = size / 4;
  // Payloads start 4-byte aligned (Decode refuses other buffers; encoders write whole words).
  const uint32_t* words = reinterpret_cast<const uint32_t*>(payload);
  std::array<uint64_t, internal::MaxParallelChunks()> partials{};
  internal::ParallelFor(full_words, kChecksumGrain, [&](int chunk, int64_t begin, int64_t end) {
    partials[chunk] = simd::ChecksumWords(words + begin, end - begin, begin);
  });
  uint64_t sum = 0;
  for (uint64_t partial : partials) sum += partial;
  if (size % 4 != 0) {
    uint32_t tail = 0;
    std::memcpy(&tail, payload + 4 * full_words, size % 4);
    sum += portable::ChecksumTerm(tail, full_words);
  }
  return sum;
}

uint64_t CombineChecksum(uint64_t header_sum, uint64_t payload_sum) {
  return portable::SplitMix64(header_sum + payload_sum);
}

absl::Status VerifyChecksum(const Header& header, uint64_t payload_sum) {
  const uint64_t expected = CombineChecksum(HeaderChecksum(header), payload_sum);
  if (expected != header.checksum) {
    return absl::DataLossError(absl::StrFormat(
        "actpack: corrupt buffer: checksum 0x%016x, computed 0x%016x", header.checksum,
        expected));
  }
  return absl::OkStatus();
}

}  // namespace actpack::codecs

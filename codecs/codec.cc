#include "codecs/codec.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/internal/cuda_status.h"
#include "codecs/internal/device_counters.h"
#include "codecs/registry.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs {
namespace {

absl::StatusOr<const Codec*> CodecFor(CodecId id) {
  const Codec* codec = FindCodec(id);
  if (codec == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "actpack: codec id ", static_cast<int>(id), " is not compiled into this build"));
  }
  return codec;
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// Copies between host memory and memory on the context's device.
absl::Status CopyToHost(void* dst, const void* src, size_t bytes, const ExecContext& context) {
  if (context.device == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
#ifdef ACTPACK_WITH_CUDA
  return cuda::CopyToHost(dst, src, bytes, context.stream);
#else
  return internal::CudaNotCompiledIn("reading a buffer");
#endif
}

absl::Status CopyFromHost(void* dst, const void* src, size_t bytes, const ExecContext& context) {
  if (context.device == Device::kCpu) {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
#ifdef ACTPACK_WITH_CUDA
  return cuda::CopyToDevice(dst, src, bytes, context.stream);
#else
  return internal::CudaNotCompiledIn("writing a buffer");
#endif
}

absl::StatusOr<uint64_t> ChecksumOf(const uint8_t* payload, size_t bytes,
                                    const ExecContext& context) {
  if (context.device == Device::kCpu) return PayloadChecksum(payload, bytes);
#ifdef ACTPACK_WITH_CUDA
  absl::StatusOr<internal::DeviceCounters> counters = internal::DeviceCounters::Make(context);
  if (!counters.ok()) return counters.status();
  uint64_t sum = 0;
  absl::Status status =
      cuda::PayloadChecksum(payload, bytes, counters->get(), context.stream, &sum);
  if (!status.ok()) return status;
  return sum;
#else
  return internal::CudaNotCompiledIn("verifying a buffer");
#endif
}

// The codec of a buffer's header; kDataLoss when this build has none with its id.
absl::StatusOr<const Codec*> DecoderFor(const Header& header) {
  const Codec* codec = FindCodec(header.codec);
  if (codec == nullptr) {
    return absl::DataLossError(absl::StrCat("actpack: unknown codec id ",
                                            static_cast<int>(header.codec),
                                            " in the buffer's header"));
  }
  return codec;
}

// kInvalidArgument unless `output` is where the buffer's tensor can be decoded to.
absl::Status CheckOutput(const Header& header, const MutableTensorView& output,
                         const ExecContext& context) {
  if (output.device != context.device) {
    return absl::InvalidArgumentError("actpack: decode: the output is not on the context's device");
  }
  if (output.dtype != header.dtype) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: decode: the buffer holds ",
                                                   DTypeName(header.dtype), ", output is ",
                                                   DTypeName(output.dtype)));
  }
  if (output.shape != header.Shape()) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: decode: the buffer holds shape ",
                                                   ShapeString(header.Shape()),
                                                   ", output has shape ",
                                                   ShapeString(output.shape)));
  }
  return absl::OkStatus();
}

// kDataLoss unless the payload's checksum matches the header's.
absl::Status VerifyPayload(const Header& header, const uint8_t* buffer,
                           const ExecContext& context) {
  absl::StatusOr<uint64_t> payload_sum =
      ChecksumOf(buffer + kHeaderSize, header.payload_size, context);
  if (!payload_sum.ok()) return payload_sum.status();
  return VerifyChecksum(header, *payload_sum);
}

}  // namespace

uint64_t TensorSpec::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

absl::StatusOr<size_t> MaxEncodedSize(const TensorSpec& spec, const CodecParams& params) {
  absl::StatusOr<const Codec*> codec = CodecFor(params.codec);
  if (!codec.ok()) return codec.status();
  absl::Status encodable = (*codec)->CheckEncodable(spec, params);
  if (!encodable.ok()) return encodable;
  return kHeaderSize + (*codec)->MaxPayloadSize(spec, params);
}

absl::StatusOr<size_t> Encode(const TensorView& input, const CodecParams& params, uint8_t* out,
                              size_t capacity, const ExecContext& context) {
  if (input.device != context.device) {
    return absl::InvalidArgumentError("actpack: encode: the input is not on the context's device");
  }
  absl::StatusOr<const Codec*> codec = CodecFor(params.codec);
  if (!codec.ok()) return codec.status();
  absl::StatusOr<size_t> max_size = MaxEncodedSize(input.Spec(), params);
  if (!max_size.ok()) return max_size.status();
  if (capacity < *max_size) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: encode needs ", *max_size,
                                                   " bytes of output, got ", capacity));
  }
  absl::StatusOr<Header> header = MakeHeader(params.codec, input.dtype, input.shape);
  if (!header.ok()) return header.status();
  absl::StatusOr<PayloadInfo> payload =
      (*codec)->EncodePayload(input, params, &*header, out + kHeaderSize, context);
  if (!payload.ok()) return payload.status();
  header->payload_size = payload->payload_size;
  header->checksum = CombineChecksum(HeaderChecksum(*header), payload->payload_checksum);
  uint8_t bytes[kHeaderSize];
  WriteHeader(*header, bytes);
  absl::Status written = CopyFromHost(out, bytes, kHeaderSize, context);
  if (!written.ok()) return written;
  return kHeaderSize + payload->payload_size;
}

absl::StatusOr<Header> ReadHeader(const uint8_t* buffer, size_t size, const ExecContext& context) {
  if (size < kHeaderSize) return ParseHeader(buffer, size);  // reports the truncation
  if (buffer == nullptr) return absl::InvalidArgumentError("actpack: decode: null buffer");
  // Payloads are read as 32-bit words (on the GPU a misaligned read kills the context).
  if (reinterpret_cast<uintptr_t>(buffer) % 4 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "actpack: decode: the buffer at address ", reinterpret_cast<uintptr_t>(buffer),
        " is not 4-byte aligned; copy it into a fresh tensor first"));
  }
  uint8_t bytes[kHeaderSize];
  absl::Status copied = CopyToHost(bytes, buffer, kHeaderSize, context);
  if (!copied.ok()) return copied;
  return ParseHeader(bytes, size);
}

absl::StatusOr<Header> Verify(const uint8_t* buffer, size_t size, const ExecContext& context) {
  absl::StatusOr<Header> header = ReadHeader(buffer, size, context);
  if (!header.ok()) return header.status();
  absl::StatusOr<const Codec*> codec = DecoderFor(*header);
  if (!codec.ok()) return codec.status();
  absl::Status verified = VerifyPayload(*header, buffer, context);
  if (!verified.ok()) return verified;
  return header;
}

absl::Status Decode(const uint8_t* buffer, size_t size, const MutableTensorView& output,
                    const ExecContext& context) {
  absl::StatusOr<Header> header = ReadHeader(buffer, size, context);
  if (!header.ok()) return header.status();
  absl::StatusOr<const Codec*> codec = DecoderFor(*header);
  if (!codec.ok()) return codec.status();
  absl::Status status = CheckOutput(*header, output, context);
  if (status.ok()) status = VerifyPayload(*header, buffer, context);
  if (!status.ok()) return status;
  return (*codec)->DecodePayload(*header, buffer + kHeaderSize, output, context);
}

absl::Status DecodeVerified(const Header& verified, const uint8_t* buffer,
                            const MutableTensorView& output, const ExecContext& context) {
  absl::StatusOr<const Codec*> codec = DecoderFor(verified);
  if (!codec.ok()) return codec.status();
  absl::Status status = CheckOutput(verified, output, context);
  if (!status.ok()) return status;
  return (*codec)->DecodePayload(verified, buffer + kHeaderSize, output, context);
}

}  // namespace actpack::codecs

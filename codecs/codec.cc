#include "codecs/codec.h"

#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "codecs/deferred.h"
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

// Reads device memory into host memory, waiting for the context's stream: the synchronous
// API's reads only.
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

// What a decode writes in place of a tensor it must not give back (FORMAT.md's flag, or a
// failed check on a GPU): a quiet NaN for floating-point dtypes, zero for the others.
uint64_t PoisonPattern(DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return 0x7fc00000u;
    case DType::kFloat16: return 0x7e00u;
    case DType::kBFloat16: return 0x7fc0u;
    case DType::kFloat64: return 0x7ff8000000000000ull;
    default: return 0;
  }
}

void PoisonOnHost(const Header& header, void* output) {
  const size_t width = ElementSize(header.dtype);
  const uint64_t pattern = PoisonPattern(header.dtype);
  uint8_t* out = static_cast<uint8_t*>(output);
  for (uint64_t i = 0; i < header.numel; ++i) std::memcpy(out + i * width, &pattern, width);
}

// The header words the host knows of a deferred encoding (CheckBuffer's `known`; CUDA builds).
[[maybe_unused]] uint32_t KnownWords(const DeferredEncoding& encoding) {
  uint32_t known = (1u << kChecksumWord) - 1;
  if (encoding.device_decided) {
    for (int j = 0; j < 6; ++j) known &= ~(1u << (kParamsWord + j));
    if (encoding.header.payload_size == 0) known &= ~(3u << kPayloadSizeWord);
  }
  return known;
}

absl::Status NeedsCuda(const char* what) {
#ifdef ACTPACK_WITH_CUDA
  return absl::OkStatus();
#else
  return internal::CudaNotCompiledIn(what);
#endif
}

}  // namespace

HeaderWords HeaderWordsOf(const Header& header) {
  uint8_t bytes[kHeaderSize];
  WriteHeader(header, bytes);
  HeaderWords words;
  std::memcpy(words.w, bytes, kHeaderSize);
  return words;
}

absl::Status Codec::Refusal(const DeviceStatus& counts, const Header&) const {
  if (counts.nonfinite == 0 && counts.unrepresentable == 0) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "actpack: ", name(), " cannot encode a tensor with ", counts.nonfinite,
      " non-finite values and ", counts.unrepresentable, " values out of its range; keep it exact"));
}

absl::Status Codec::DecodeVerifiedPayload(const Header& header, const uint8_t* payload,
                                          const MutableTensorView& output,
                                          const ExecContext& context,
                                          DeviceStatus* status) const {
  if (output.device != Device::kCuda || !ChecksOwnBuffer()) {
    return DecodePayload(header, payload, output, context, status);
  }
  // The buffer's check comes with the decode's launch; it passes for a verified buffer (every
  // header word known, the checksum's included).
  const DeviceBufferCheck check{payload - kHeaderSize, kHeaderSize + header.payload_size,
                                HeaderWordsOf(header), (1u << kChecksumWord) - 1};
  return DecodeCheckedPayload(header, check, output, context, status);
}

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

absl::StatusOr<DeferredEncoding> EncodeDeferred(const TensorView& input, const CodecParams& params,
                                                uint8_t* out, size_t capacity,
                                                const ExecContext& context, DeviceStatus* status) {
  if (input.device != context.device) {
    return absl::InvalidArgumentError("actpack: encode: the input is not on the context's device");
  }
  if (context.device != Device::kCuda || status == nullptr) {
    return absl::InvalidArgumentError(
        "actpack: a deferred encode takes a CUDA tensor and a DeviceStatus");
  }
  absl::Status cuda = NeedsCuda("deferred encode");
  if (!cuda.ok()) return cuda;
  absl::StatusOr<const Codec*> codec = CodecFor(params.codec);
  if (!codec.ok()) return codec.status();
  absl::StatusOr<size_t> max_size = MaxEncodedSize(input.Spec(), params);
  if (!max_size.ok()) return max_size.status();
  if (capacity < *max_size) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: encode needs ", *max_size,
                                                   " bytes of output, got ", capacity));
  }
  if (reinterpret_cast<uintptr_t>(out) % 8 != 0) {
    return absl::InvalidArgumentError("actpack: encode: the output is not 8-byte aligned");
  }
  absl::StatusOr<Header> header = MakeHeader(params.codec, input.dtype, input.shape);
  if (!header.ok()) return header.status();
  DeferredEncoding encoding;
#ifdef ACTPACK_WITH_CUDA
  if (!(*codec)->EncodeZeroesStatus()) {
    absl::Status zeroed = cuda::ZeroStatus(status, context.stream);
    if (!zeroed.ok()) return zeroed;
  }
  absl::StatusOr<PayloadInfo> payload =
      (*codec)->EncodePayload(input, params, &*header, out + kHeaderSize, context, status);
  if (!payload.ok()) return payload.status();
  // What the device decides is 0 in the host's header; FinalizeHeader ORs it in.
  header->payload_size = payload->size_on_device ? 0 : payload->payload_size;
  if (!payload->header_written) {
    absl::Status written = cuda::FinalizeHeader(HeaderWordsOf(*header), payload->size_on_device,
                                                status, out, context.stream);
    if (!written.ok()) return written;
  }
  encoding.header = *header;
  encoding.device_decided = payload->params_on_device;
  encoding.bytes = kHeaderSize + payload->payload_size;
#endif
  return encoding;
}

DeferredEncoding Resolve(const DeferredEncoding& encoding, const DeviceStatus& read_back) {
  DeferredEncoding resolved = encoding;
  Header& h = resolved.header;
  if (encoding.device_decided) {
    for (int j = 0; j < 6; ++j) {
      uint32_t word;
      std::memcpy(&word, h.params.data() + 4 * j, 4);
      word |= read_back.params[j];
      std::memcpy(h.params.data() + 4 * j, &word, 4);
    }
    if (h.payload_size == 0) h.payload_size = read_back.payload_bytes;
    resolved.device_decided = false;
    resolved.bytes = kHeaderSize + h.payload_size;
  }
  if (read_back.nonfinite != 0 || read_back.unrepresentable != 0) h.flags |= kFlagUnrepresentable;
  h.checksum = CombineChecksum(HeaderChecksum(h), read_back.payload_sum);
  return resolved;
}

absl::Status CheckEncode(const Header& header, const DeviceStatus& read_back) {
  absl::StatusOr<const Codec*> codec = CodecFor(header.codec);
  if (!codec.ok()) return codec.status();
  return (*codec)->Refusal(read_back, header);
}

absl::Status DecodeDeferred(const DeferredEncoding& encoding, const uint8_t* buffer,
                            const MutableTensorView& output, const ExecContext& context,
                            DeviceStatus* status) {
  if (context.device != Device::kCuda || status == nullptr) {
    return absl::InvalidArgumentError(
        "actpack: a deferred decode takes a CUDA output and a DeviceStatus");
  }
  absl::Status cuda = NeedsCuda("deferred decode");
  if (!cuda.ok()) return cuda;
  const Header& header = encoding.header;
  absl::StatusOr<const Codec*> codec = DecoderFor(header);
  if (!codec.ok()) return codec.status();
  absl::Status status_ok = CheckOutput(header, output, context);
  if (!status_ok.ok()) return status_ok;
  if (encoding.device_decided && !(*codec)->ReadsDeviceParams()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "actpack: decode: ", (*codec)->name(),
        " needs the parameters its encode decided on the device; Resolve the encoding first"));
  }
  if (encoding.bytes < kHeaderSize) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: decode: an encoding of ",
                                                   encoding.bytes, " bytes has no header"));
  }
#ifdef ACTPACK_WITH_CUDA
  // A codec that checks its buffer as it decodes takes a buffer whose parameters the host has
  // not read where its kernels read them from the buffer (ReadsDeviceParams).
  if ((*codec)->ChecksOwnBuffer() && (!encoding.device_decided || (*codec)->ReadsDeviceParams())) {
    const DeviceBufferCheck check{buffer, encoding.bytes, HeaderWordsOf(header),
                                  KnownWords(encoding)};
    status_ok = (*codec)->DecodeCheckedPayload(header, check, output, context, status);
    if (!status_ok.ok()) return status_ok;
    return cuda::Poison(status, output.data, header.numel,
                        static_cast<int>(ElementSize(header.dtype)), PoisonPattern(header.dtype),
                        context.stream);
  }
  status_ok = cuda::CheckBuffer(buffer, encoding.bytes, HeaderWordsOf(header), KnownWords(encoding),
                                status, context.stream);
  if (!status_ok.ok()) return status_ok;
  status_ok = encoding.device_decided
                  ? (*codec)->DecodeUnresolvedPayload(header, buffer + kHeaderSize,
                                                      encoding.bytes - kHeaderSize, output,
                                                      context, status)
                  : (*codec)->DecodePayload(header, buffer + kHeaderSize, output, context, status);
  if (!status_ok.ok()) return status_ok;
  return cuda::Poison(status, output.data, header.numel,
                      static_cast<int>(ElementSize(header.dtype)), PoisonPattern(header.dtype),
                      context.stream);
#else
  return absl::OkStatus();
#endif
}

std::string DescribeFailures(uint64_t failures) {
  std::vector<std::string> reasons;
  if (failures & kFailHeader) reasons.push_back("its header is not the one written");
  if (failures & kFailChecksum) reasons.push_back("its checksum does not match");
  if (failures & kFailUnrepresentable) {
    reasons.push_back("the encoder met values its codec cannot hold");
  }
  if (failures & kFailParams) reasons.push_back("a parameter in its header is invalid");
  if (failures & kFailEbBlockHeader) reasons.push_back("an eb block header is invalid");
  if (failures & kFailEbChunkIndex) reasons.push_back("the eb chunk index does not match");
  if (failures & kFailEbOutlier) {
    reasons.push_back("an eb outlier slot, value or count is invalid");
  }
  if (failures & kFailLost) reasons.push_back("it did not fit the room its size was given");
  return absl::StrJoin(reasons, "; ");
}

namespace {

bool Aligned8(const void* p) { return reinterpret_cast<uintptr_t>(p) % 8 == 0; }

// kInvalidArgument unless the arena is one a placement can use: none (no counter), or memory
// with a counter, 8-byte aligned.
absl::Status CheckArena(const SpillArena& arena, const char* call) {
  if (arena.used == nullptr) return absl::OkStatus();
  if ((arena.data == nullptr && arena.capacity > 0) || !Aligned8(arena.data) ||
      !Aligned8(arena.used)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "actpack: ", call, ": the spill arena needs 8-byte aligned memory and counter"));
  }
  return absl::OkStatus();
}

absl::Status CheckPlacementCall(const uint8_t* target, size_t target_capacity,
                                const SpillArena& arena, const void* status,
                                const ExecContext& context, const char* call) {
  if (context.device != Device::kCuda || status == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("actpack: ", call, " takes CUDA memory and a DeviceStatus"));
  }
  absl::Status cuda = NeedsCuda(call);
  if (!cuda.ok()) return cuda;
  if (!Aligned8(target) || (target == nullptr && target_capacity > 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "actpack: ", call, ": the target is not 8-byte aligned memory of its capacity"));
  }
  return CheckArena(arena, call);
}

// The arena as a placement sees it: no room without a counter.
[[maybe_unused]] size_t ArenaCapacity(const SpillArena& arena) {
  return arena.used == nullptr ? 0 : arena.capacity;
}

}  // namespace

absl::Status PlaceDeferred(const uint8_t* staging, size_t staging_capacity, uint8_t* target,
                           size_t target_capacity, const SpillArena& arena, DeviceStatus* status,
                           const ExecContext& context) {
  absl::Status ok =
      CheckPlacementCall(target, target_capacity, arena, status, context, "PlaceDeferred");
  if (!ok.ok()) return ok;
  if (staging == nullptr || !Aligned8(staging) || staging_capacity < kHeaderSize) {
    return absl::InvalidArgumentError(
        "actpack: PlaceDeferred: the staging buffer is not 8-byte aligned memory that holds an "
        "encoding");
  }
#ifdef ACTPACK_WITH_CUDA
  return cuda::Place(staging, staging_capacity, target, target_capacity, arena.data,
                     ArenaCapacity(arena), arena.used, status, context.stream);
#else
  return absl::OkStatus();
#endif
}

absl::Status GatherDeferred(const uint8_t* target, size_t target_capacity,
                            const SpillArena& arena, const DeviceStatus* status, uint8_t* dest,
                            size_t dest_capacity, const ExecContext& context) {
  absl::Status ok =
      CheckPlacementCall(target, target_capacity, arena, status, context, "GatherDeferred");
  if (!ok.ok()) return ok;
  if (dest == nullptr || !Aligned8(dest)) {
    return absl::InvalidArgumentError(
        "actpack: GatherDeferred: the destination is not 8-byte aligned memory");
  }
#ifdef ACTPACK_WITH_CUDA
  return cuda::Gather(target, target_capacity, arena.data, ArenaCapacity(arena), status, dest,
                      dest_capacity, context.stream);
#else
  return absl::OkStatus();
#endif
}

Placement PlacementOf(const DeviceStatus& read_back) {
  Placement placement;
  const unsigned long long kind = read_back.placement & kPlacementKindMask;
  if (kind == kPlacedInTarget) {
    placement.kind = PlacementKind::kTarget;
  } else if (kind == kPlacedInArena) {
    placement.kind = PlacementKind::kArena;
    placement.arena_offset = read_back.placement & ~kPlacementKindMask;
  } else if (kind != 0) {
    placement.kind = PlacementKind::kLost;  // what DecodeDeferred's check takes it for too
  }
  return placement;
}

const uint8_t* PlacedBytes(const Placement& placement, const uint8_t* target,
                           const SpillArena& arena) {
  switch (placement.kind) {
    case PlacementKind::kTarget: return target;
    case PlacementKind::kArena: return arena.data + placement.arena_offset;
    default: return nullptr;
  }
}

absl::Status CopyPlaced(const Placement& placement, size_t bytes, const uint8_t* target,
                        size_t target_capacity, const SpillArena& arena, uint8_t* dest,
                        size_t dest_capacity, const ExecContext& context) {
  if (context.device != Device::kCuda) {
    return absl::InvalidArgumentError("actpack: CopyPlaced copies CUDA memory");
  }
  const uint8_t* from = PlacedBytes(placement, target, arena);
  if (from == nullptr) {
    return absl::InvalidArgumentError("actpack: CopyPlaced: the encoding is in no placement");
  }
  size_t room = target_capacity;
  if (placement.kind == PlacementKind::kArena) {
    room = placement.arena_offset <= arena.capacity ? arena.capacity - placement.arena_offset : 0;
  }
  if (bytes > room || bytes > dest_capacity) {
    return absl::InvalidArgumentError(absl::StrCat("actpack: CopyPlaced: ", bytes,
                                                   " bytes, from room for ", room, " into ",
                                                   dest_capacity));
  }
#ifdef ACTPACK_WITH_CUDA
  return cuda::CopyOnDevice(dest, from, bytes, context.stream);
#else
  return NeedsCuda("CopyPlaced");
#endif
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
  if (context.device == Device::kCuda) {
    // The deferred encode, then one wait for its status.
    absl::Status runs = NeedsCuda("encode");
    if (!runs.ok()) return runs;
    absl::StatusOr<internal::DeviceCounters> status = internal::DeviceCounters::Make(context);
    if (!status.ok()) return status.status();
    absl::StatusOr<DeferredEncoding> encoding =
        EncodeDeferred(input, params, out, capacity, context, status->get());
    if (!encoding.ok()) return encoding.status();
    DeviceStatus read;
    absl::Status copied = CopyToHost(&read, status->get(), sizeof(read), context);
    if (!copied.ok()) return copied;
    absl::Status refused = (*codec)->Refusal(read, encoding->header);
    if (!refused.ok()) return refused;
    return Resolve(*encoding, read).bytes;
  }
  absl::StatusOr<Header> header = MakeHeader(params.codec, input.dtype, input.shape);
  if (!header.ok()) return header.status();
  absl::StatusOr<PayloadInfo> payload =
      (*codec)->EncodePayload(input, params, &*header, out + kHeaderSize, context, nullptr);
  if (!payload.ok()) return payload.status();
  header->payload_size = payload->payload_size;
  header->checksum = CombineChecksum(HeaderChecksum(*header), payload->payload_checksum);
  WriteHeader(*header, out);
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

namespace {

// On a GPU: the payload's checksum summed on the device and read back (a wait), checked on
// the host with the CPU's message.
absl::Status VerifyOnDevice(const Header& header, const uint8_t* buffer,
                            const ExecContext& context, DeviceStatus* status) {
#ifdef ACTPACK_WITH_CUDA
  absl::Status summed = cuda::Checksum(buffer + kHeaderSize, header.payload_size, nullptr,
                                       &status->decode_sum, context.stream);
  if (!summed.ok()) return summed;
  uint64_t payload_sum = 0;
  summed = CopyToHost(&payload_sum, &status->decode_sum, sizeof(payload_sum), context);
  if (!summed.ok()) return summed;
  return VerifyChecksum(header, payload_sum);
#else
  return internal::CudaNotCompiledIn("verifying a buffer");
#endif
}

// The failures a GPU decoder's own checks left in `status` (mask's and bitpack's parameters,
// eb's blocks and outliers), read back (a wait): kDataLoss naming them.
absl::Status DeviceDecodeFailures(const Codec& codec, const ExecContext& context,
                                  const DeviceStatus* status) {
  uint64_t failures = 0;
  absl::Status read = CopyToHost(&failures, &status->failures, sizeof(failures), context);
  if (!read.ok()) return read;
  if (failures == 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("actpack: corrupt ", codec.name(), " buffer: ",
                                          DescribeFailures(failures)));
}

// The GPU's decode of a buffer whose codec checks it in the launch that decodes it
// (ChecksOwnBuffer): that launch, then one wait for its failures and payload sum. A buffer
// whose flag says its encoder met values it could not hold is then overwritten with the poison
// pattern, as on the CPU; any other failure is kDataLoss naming it (the output is then
// unspecified, as the CPU's).
absl::Status DecodeCheckedOnDevice(const Codec& codec, const Header& header, const uint8_t* buffer,
                                   const MutableTensorView& output, const ExecContext& context) {
#ifdef ACTPACK_WITH_CUDA
  absl::StatusOr<internal::DeviceCounters> status = internal::DeviceCounters::Make(context);
  if (!status.ok()) return status.status();
  const DeviceBufferCheck check{buffer, kHeaderSize + header.payload_size, HeaderWordsOf(header),
                                ((1u << kChecksumWord) - 1) | kKnownKeepsSum};
  absl::Status decoded = codec.DecodeCheckedPayload(header, check, output, context, status->get());
  if (decoded.code() == absl::StatusCode::kDataLoss) {
    // The codec refused the header's parameters before launching: as on the CPU, a checksum
    // that does not match is the error (the payload summed on its own, a failed decode only).
    absl::Status verified = VerifyOnDevice(header, buffer, context, status->get());
    return verified.ok() ? decoded : verified;
  }
  if (!decoded.ok()) return decoded;
  // failures and decode_sum, adjacent words of the status.
  uint64_t read[2] = {0, 0};
  decoded = CopyToHost(read, &status->get()->failures, sizeof(read), context);
  if (!decoded.ok()) return decoded;
  const uint64_t failures = read[0];
  if ((failures & kFailChecksum) != 0) {
    absl::Status verified = VerifyChecksum(header, read[1]);  // the CPU's message
    if (!verified.ok()) return verified;
  }
  if (failures == kFailUnrepresentable) {
    return cuda::Poison(status->get(), output.data, header.numel,
                        static_cast<int>(ElementSize(header.dtype)), PoisonPattern(header.dtype),
                        context.stream);
  }
  if (failures == 0) return absl::OkStatus();
  return absl::DataLossError(absl::StrCat("actpack: corrupt ", codec.name(), " buffer: ",
                                          DescribeFailures(failures)));
#else
  return internal::CudaNotCompiledIn("decode");
#endif
}

// The GPU's decode of a verified buffer: the flag's overwrite, or the codec's kernels and then
// what their own checks found.
absl::Status DecodeOnDevice(const Codec& codec, const Header& header, const uint8_t* buffer,
                            const MutableTensorView& output, const ExecContext& context) {
#ifdef ACTPACK_WITH_CUDA
  absl::StatusOr<internal::DeviceCounters> status = internal::DeviceCounters::Make(context);
  if (!status.ok()) return status.status();
  if ((header.flags & kFlagUnrepresentable) != 0) {
    // Poison reads a failure bit; a one-byte memset sets it (kFailUnrepresentable is 4).
    absl::Status flagged = cuda::SetFailureByte(status->get(), kFailUnrepresentable,
                                                context.stream);
    if (!flagged.ok()) return flagged;
    return cuda::Poison(status->get(), output.data, header.numel,
                        static_cast<int>(ElementSize(header.dtype)), PoisonPattern(header.dtype),
                        context.stream);
  }
  absl::Status decoded =
      codec.DecodeVerifiedPayload(header, buffer + kHeaderSize, output, context, status->get());
  if (!decoded.ok()) return decoded;
  return DeviceDecodeFailures(codec, context, status->get());
#else
  return internal::CudaNotCompiledIn("decode");
#endif
}

}  // namespace

absl::StatusOr<Header> Verify(const uint8_t* buffer, size_t size, const ExecContext& context) {
  absl::StatusOr<Header> header = ReadHeader(buffer, size, context);
  if (!header.ok()) return header.status();
  absl::StatusOr<const Codec*> codec = DecoderFor(*header);
  if (!codec.ok()) return codec.status();
  if (context.device == Device::kCpu) {
    absl::Status verified = VerifyChecksum(
        *header, PayloadChecksum(buffer + kHeaderSize, header->payload_size));
    if (!verified.ok()) return verified;
    return header;
  }
  absl::StatusOr<internal::DeviceCounters> status = internal::DeviceCounters::Make(context);
  if (!status.ok()) return status.status();
  absl::Status verified = VerifyOnDevice(*header, buffer, context, status->get());
  if (!verified.ok()) return verified;
  return header;
}

absl::Status DecodeVerified(const Header& verified, const uint8_t* buffer,
                            const MutableTensorView& output, const ExecContext& context) {
  absl::StatusOr<const Codec*> codec = DecoderFor(verified);
  if (!codec.ok()) return codec.status();
  absl::Status status = CheckOutput(verified, output, context);
  if (!status.ok()) return status;
  if (context.device == Device::kCpu) {
    if ((verified.flags & kFlagUnrepresentable) != 0) {
      PoisonOnHost(verified, output.data);
      return absl::OkStatus();
    }
    return (*codec)->DecodePayload(verified, buffer + kHeaderSize, output, context, nullptr);
  }
  return DecodeOnDevice(**codec, verified, buffer, output, context);
}

absl::Status Decode(const uint8_t* buffer, size_t size, const MutableTensorView& output,
                    const ExecContext& context) {
  absl::StatusOr<Header> header = ReadHeader(buffer, size, context);
  if (!header.ok()) return header.status();
  absl::StatusOr<const Codec*> codec = DecoderFor(*header);
  if (!codec.ok()) return codec.status();
  absl::Status status = CheckOutput(*header, output, context);
  if (!status.ok()) return status;
  if (context.device == Device::kCpu) {
    status = VerifyChecksum(*header, PayloadChecksum(buffer + kHeaderSize, header->payload_size));
    if (!status.ok()) return status;
    return DecodeVerified(*header, buffer, output, context);
  }
  if ((*codec)->ChecksOwnBuffer()) {
    return DecodeCheckedOnDevice(**codec, *header, buffer, output, context);
  }
  absl::StatusOr<internal::DeviceCounters> device_status = internal::DeviceCounters::Make(context);
  if (!device_status.ok()) return device_status.status();
  status = VerifyOnDevice(*header, buffer, context, device_status->get());
  if (!status.ok()) return status;
  return DecodeOnDevice(**codec, *header, buffer, output, context);
}

}  // namespace actpack::codecs

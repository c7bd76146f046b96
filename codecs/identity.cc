#include "codecs/identity.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "codecs/internal/cuda_status.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs {
namespace {

class Identity final : public Codec {
 public:
  CodecId id() const override { return CodecId::kIdentity; }
  absl::string_view name() const override { return "identity"; }
  bool lossless() const override { return true; }

  absl::Status CheckEncodable(const TensorSpec&, const CodecParams&) const override {
    return absl::OkStatus();
  }

  uint64_t MaxPayloadSize(const TensorSpec& spec, const CodecParams&) const override {
    return spec.numel() * ElementSize(spec.dtype);
  }

  absl::StatusOr<PayloadInfo> EncodePayload(const TensorView& input, const CodecParams& params,
                                            Header* header, uint8_t* payload,
                                            const ExecContext& context,
                                            DeviceStatus* status) const override {
    const uint64_t bytes = MaxPayloadSize(input.Spec(), params);
    header->params.fill(0);
    if (input.device == Device::kCuda) {
#ifdef ACTPACK_WITH_CUDA
      // One launch: the copy, its checksum and the header (the payload follows it).
      header->payload_size = bytes;
      absl::Status queued = cuda::IdentityEncode(input.data, bytes, HeaderWordsOf(*header), status,
                                                 payload - kHeaderSize, context.stream);
      if (!queued.ok()) return queued;
      PayloadInfo info{bytes, 0};
      info.header_written = true;
      return info;
#else
      return internal::CudaNotCompiledIn("identity encode");
#endif
    }
    if (bytes > 0) std::memcpy(payload, input.data, bytes);
    return PayloadInfo{bytes, PayloadChecksum(payload, bytes)};
  }

  absl::Status DecodePayload(const Header& header, const uint8_t* payload,
                             const MutableTensorView& output, const ExecContext& context,
                             DeviceStatus*) const override {
    absl::Status valid = CheckHeader(header);
    if (!valid.ok()) return valid;
    const uint64_t bytes = header.payload_size;
    if (bytes > 0) std::memcpy(output.data, payload, bytes);
    return absl::OkStatus();
  }

  bool ChecksOwnBuffer() const override { return true; }

  absl::Status DecodeCheckedPayload(const Header& header, const DeviceBufferCheck& check,
                                    const MutableTensorView& output, const ExecContext& context,
                                    DeviceStatus* status) const override {
    absl::Status valid = CheckHeader(header);
    if (!valid.ok()) return valid;
#ifdef ACTPACK_WITH_CUDA
    return cuda::IdentityDecode(check.buffer, check.capacity, check.expected, check.known,
                                header.payload_size, output.data, status, context.stream);
#else
    return internal::CudaNotCompiledIn("identity decode");
#endif
  }

 private:
  // kDataLoss unless the parameters are zero and the payload is the tensor's bytes.
  static absl::Status CheckHeader(const Header& header) {
    absl::Status unused = CheckParamBytesZero(header, 0, kParamBytes, "identity");
    if (!unused.ok()) return unused;
    const uint64_t bytes = header.numel * ElementSize(header.dtype);
    if (header.payload_size != bytes) {
      return absl::DataLossError(absl::StrCat("actpack: corrupt identity buffer: payload of ",
                                              header.payload_size, " bytes, expected ", bytes));
    }
    return absl::OkStatus();
  }
};

}  // namespace

const Codec* IdentityCodec() {
  static const Identity* const codec = new Identity();
  return codec;
}

}  // namespace actpack::codecs

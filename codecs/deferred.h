// Encoding and decoding on a GPU without waiting for it.
//
// Encode and Decode (codec.h) answer with what the device computed: the bytes used, a refusal,
// a checksum mismatch. On a GPU that costs a wait for the stream at every call, several per
// saved tensor, and each wait lets the GPU run dry while the host queues the next kernels. The
// deferred calls only queue work on the context's stream. What the host would wait for goes
// into the tensor's DeviceStatus (internal/device_status.h), device memory the caller provides
// and reads back when it chooses: the runtime reads every status of a step at once, at its end.
//
// - EncodeDeferred writes the payload and the buffer's header on the device: the checksum, and
//   the fields the data decides (eb's size and bound, bitpack's bits, mask's value), are
//   completed there, so the buffer is byte for byte what Encode writes. It never refuses data:
//   where the codec meets values it cannot hold (non-finite values for quant, a range that
//   overflows), the header's flag says so (FORMAT.md) and the counts are in the status.
// - DecodeDeferred checks the buffer on the device against the header the host kept (every
//   field it knows, the checksum, the flag) and decodes. Where the check fails, or the encoder
//   flagged the data, the output is NaN (zeros for integer and bool tensors), never garbage:
//   a training step's gradients turn non-finite, as they would with those values in plain
//   training, and GradScaler skips the step. status.failures says why.
//
// Usage (status is a DeviceStatus in device memory; the host reads it after a sync):
//   absl::StatusOr<DeferredEncoding> e = EncodeDeferred(input, params, out, capacity, ctx, status);
//   ... backward ...
//   absl::Status ok = DecodeDeferred(*e, out, output, ctx, status);
//   ... end of step: read *status back, then CheckEncode(e->header, read) and
//   DescribeFailures(read.failures) ...
#ifndef ACTPACK_CODECS_DEFERRED_H_
#define ACTPACK_CODECS_DEFERRED_H_

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "codecs/codec.h"

namespace actpack::codecs {

struct DeferredEncoding {
  // The header as the host knows it: everything but the checksum and the flags, and, where
  // `device_decided`, the payload's size and the parameters the data decides (0 here).
  Header header;
  bool device_decided = false;
  // Bytes of the buffer the device wrote: exactly the encoding, or its bound where
  // `device_decided` (Resolve gives the size once the status is read).
  size_t bytes = 0;
};

// Queues the encode of `input` (on a GPU) into `out` (`capacity` bytes, at least
// MaxEncodedSize), zeroing `status` first. Errors are the caller's (kInvalidArgument) or CUDA's.
absl::StatusOr<DeferredEncoding> EncodeDeferred(const TensorView& input, const CodecParams& params,
                                                uint8_t* out, size_t capacity,
                                                const ExecContext& context, DeviceStatus* status);

// The header the device wrote, from the encode's status read back by the host: the encoding
// with nothing left to the device.
DeferredEncoding Resolve(const DeferredEncoding& encoding, const DeviceStatus& read_back);

// kFailedPrecondition naming what the codec could not hold (the encode flagged the buffer and
// its decode writes NaN), from the encode's status read back; OK otherwise.
absl::Status CheckEncode(const Header& header, const DeviceStatus& read_back);

// Queues the check and the decode of the buffer at `buffer` (encoding.bytes of it) into
// `output`, then the overwrite of the output with NaN (0 for integer and bool dtypes) should
// the check fail. `status`: the encode's, or zeroed memory. kInvalidArgument for an output of
// the wrong dtype, shape or device, and kFailedPrecondition for an encoding whose decoder needs
// what the device decided (eb: Resolve it first).
absl::Status DecodeDeferred(const DeferredEncoding& encoding, const uint8_t* buffer,
                            const MutableTensorView& output, const ExecContext& context,
                            DeviceStatus* status);

// The reasons in DecodeFailure bits, for a message ("" for none).
std::string DescribeFailures(uint64_t failures);

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_DEFERRED_H_

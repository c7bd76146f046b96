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
//
// An encoding whose size the device decides (eb, bitpack) is written into room for its bound.
// To hold it in less before the host knows its size, PlaceDeferred moves it, on the device,
// into a smaller buffer the caller predicted (a target) when it fits, else into a shared spill
// arena, and records where in the status; GatherDeferred copies it back into room for its bound
// for a decode that comes before the host has read the status (after, the host knows where it
// is: PlacementOf, CopyPlaced, or a decode straight from there with the resolved encoding):
//   EncodeDeferred(input, params, staging, bound, ctx, status);
//   PlaceDeferred(staging, bound, target, predicted, arena, status, ctx);   // staging is free
//   ... backward ...
//   GatherDeferred(target, predicted, arena, status, staging2, bound, ctx);
//   DecodeDeferred(*e, staging2, output, ctx, status);
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
// the check fail. `status`: the encode's, or a copy of it, or, for a resolved encoding, zeroed
// memory; an unresolved eb encoding takes its half-bin, outlier count and payload size from it
// on the device (and checks them against the buffer's header), and an encoding PlaceDeferred
// placed nowhere decodes as NaN with kFailLost. kInvalidArgument for an output of the wrong
// dtype, shape or device, and kFailedPrecondition for an unresolved encoding of a codec whose
// decoder needs the host to know what the device decided (none today: every codec whose encode
// decides parameters on the device reads them there, Codec::ReadsDeviceParams).
absl::Status DecodeDeferred(const DeferredEncoding& encoding, const uint8_t* buffer,
                            const MutableTensorView& output, const ExecContext& context,
                            DeviceStatus* status);

// The reasons in DecodeFailure bits, for a message ("" for none).
std::string DescribeFailures(uint64_t failures);

// Device memory the encodings that do not fit their target share, bump-allocated on the device.
// After a step's placements, *used is the room every spill asked for, those that did not fit
// too: more than `capacity` when some were lost, and the arena that would have held them all.
struct SpillArena {
  uint8_t* data = nullptr;             // 8-byte aligned (256 keeps every spill 256-aligned)
  size_t capacity = 0;
  unsigned long long* used = nullptr;  // device counter, zeroed by the caller; null: no arena
};

// Queues the move of the encoding EncodeDeferred wrote into `staging` (`staging_capacity`
// bytes: its DeferredEncoding::bytes) into `target` when it fits in `target_capacity` bytes,
// else into the arena at the next multiple of 256 bytes (an atomicAdd on *arena.used), else
// nowhere; status->placement records which (PlacementOf). Its size is the one its header gives
// on the device (header and payload), so any codec's encoding can be placed; staging may be
// reused once the move has run (stream order). Never waits. Pointers 8-byte aligned; `target`
// may be null with `target_capacity` 0. kInvalidArgument for a call that cannot be queued.
absl::Status PlaceDeferred(const uint8_t* staging, size_t staging_capacity, uint8_t* target,
                           size_t target_capacity, const SpillArena& arena, DeviceStatus* status,
                           const ExecContext& context);

// Queues the copy of a placed encoding (from `target`, `target_capacity` bytes, or the arena, as
// `status` says: the encode's, or a copy of it) into `dest` (`dest_capacity` bytes, at least
// the encoding's bound: DeferredEncoding::bytes), for DecodeDeferred(encoding, dest, ...). An
// encoding placed nowhere is not copied, and DecodeDeferred with that status writes NaN and
// sets kFailLost. Reads and writes stay within the capacities whatever the status says. Never
// waits.
absl::Status GatherDeferred(const uint8_t* target, size_t target_capacity,
                            const SpillArena& arena, const DeviceStatus* status, uint8_t* dest,
                            size_t dest_capacity, const ExecContext& context);

// Where PlaceDeferred put an encoding, as the host reads it from the status read back.
enum class PlacementKind : uint8_t {
  kNotPlaced,  // PlaceDeferred did not run on this status: the encoding is where it was written
  kTarget,
  kArena,      // at arena_offset
  kLost,       // it fitted neither: DecodeDeferred gives NaN and kFailLost
};
struct Placement {
  PlacementKind kind = PlacementKind::kNotPlaced;
  uint64_t arena_offset = 0;
};
Placement PlacementOf(const DeviceStatus& read_back);

// Where a placed encoding's bytes are: `target`, or arena.data + the offset; nullptr for one
// lost or not placed. A resolved encoding decodes from there (DecodeDeferred) as it is.
const uint8_t* PlacedBytes(const Placement& placement, const uint8_t* target,
                           const SpillArena& arena);

// Queues the copy of `bytes` bytes (a resolved encoding's DeferredEncoding::bytes) of a placed
// encoding out of the target or the arena into `dest` (a cudaMemcpyAsync). kInvalidArgument for
// an encoding lost or not placed, or bytes past the target's or the arena's capacity or past
// `dest_capacity`.
absl::Status CopyPlaced(const Placement& placement, size_t bytes, const uint8_t* target,
                        size_t target_capacity, const SpillArena& arena, uint8_t* dest,
                        size_t dest_capacity, const ExecContext& context);

}  // namespace actpack::codecs

#endif  // ACTPACK_CODECS_DEFERRED_H_

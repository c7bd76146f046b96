// The DeviceStatus of a synchronous codec call on a GPU (codec.h's Encode, Decode, Verify),
// taken zeroed from the caller's scratch allocator (ExecContext::scratch) and given back when
// the call is done. Deferred calls (deferred.h) take theirs from their caller instead.
//
// Usage:
//   absl::StatusOr<DeviceCounters> status = DeviceCounters::Make(context);
//   if (!status.ok()) return status.status();
//   EncodeDeferred(..., status->get()); ... CopyToHost(&read, status->get(), ...);
#ifndef ACTPACK_CODECS_INTERNAL_DEVICE_COUNTERS_H_
#define ACTPACK_CODECS_INTERNAL_DEVICE_COUNTERS_H_

#include "absl/status/statusor.h"
#include "codecs/codec.h"

namespace actpack::codecs::internal {

class DeviceCounters {
 public:
  // kInvalidArgument when the context has no scratch allocator (a caller's mistake: a codec's
  // kFailedPrecondition means data it cannot represent); the allocator's error (an
  // out-of-budget kResourceExhausted) when it cannot give the memory.
  static absl::StatusOr<DeviceCounters> Make(const ExecContext& context);

  DeviceCounters(DeviceCounters&& other) noexcept;
  DeviceCounters& operator=(DeviceCounters&&) = delete;
  DeviceCounters(const DeviceCounters&) = delete;
  ~DeviceCounters();

  DeviceStatus* get() const { return counters_; }

 private:
  DeviceCounters(ScratchAllocator* allocator, void* stream, DeviceStatus* counters)
      : allocator_(allocator), stream_(stream), counters_(counters) {}

  ScratchAllocator* allocator_;
  void* stream_;
  DeviceStatus* counters_;
};

}  // namespace actpack::codecs::internal

#endif  // ACTPACK_CODECS_INTERNAL_DEVICE_COUNTERS_H_

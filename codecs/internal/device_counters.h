// The counters a CUDA codec call sums into, taken from the caller's scratch allocator
// (ExecContext::scratch) and given back when the call is done.
//
// Usage (in a codec's CUDA path):
//   absl::StatusOr<DeviceCounters> counters = DeviceCounters::Make(context);
//   if (!counters.ok()) return counters.status();
//   cuda::QuantEncode(..., counters->get(), context.stream, ...);
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

  unsigned long long* get() const { return counters_; }

 private:
  DeviceCounters(ScratchAllocator* allocator, void* stream, unsigned long long* counters)
      : allocator_(allocator), stream_(stream), counters_(counters) {}

  ScratchAllocator* allocator_;
  void* stream_;
  unsigned long long* counters_;
};

}  // namespace actpack::codecs::internal

#endif  // ACTPACK_CODECS_INTERNAL_DEVICE_COUNTERS_H_

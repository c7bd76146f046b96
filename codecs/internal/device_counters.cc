#include "codecs/internal/device_counters.h"

#include "absl/status/status.h"

#ifdef ACTPACK_WITH_CUDA
#include "codecs/cuda/kernels.h"
#endif

namespace actpack::codecs::internal {
namespace {

constexpr size_t kCounterBytes = sizeof(DeviceStatus);

}  // namespace

absl::StatusOr<DeviceCounters> DeviceCounters::Make(const ExecContext& context) {
  if (context.scratch == nullptr) {
    return absl::InvalidArgumentError(
        "actpack: a codec on a CUDA tensor needs ExecContext::scratch, the allocator its "
        "counters come from");
  }
  absl::StatusOr<void*> memory = context.scratch->Allocate(kCounterBytes, context.stream);
  if (!memory.ok()) return memory.status();
  DeviceCounters counters(context.scratch, context.stream, static_cast<DeviceStatus*>(*memory));
#ifdef ACTPACK_WITH_CUDA
  absl::Status zeroed = cuda::ZeroStatus(counters.get(), context.stream);
  if (!zeroed.ok()) return zeroed;
#endif
  return counters;
}

DeviceCounters::DeviceCounters(DeviceCounters&& other) noexcept
    : allocator_(other.allocator_), stream_(other.stream_), counters_(other.counters_) {
  other.counters_ = nullptr;
}

DeviceCounters::~DeviceCounters() {
  if (counters_ != nullptr) allocator_->Deallocate(counters_, kCounterBytes, stream_);
}

}  // namespace actpack::codecs::internal

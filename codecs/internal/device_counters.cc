#include "codecs/internal/device_counters.h"

#include "absl/status/status.h"
#include "codecs/cuda/kernels.h"

namespace actpack::codecs::internal {
namespace {

constexpr size_t kCounterBytes = cuda::kCounterWords * sizeof(unsigned long long);

}  // namespace

absl::StatusOr<DeviceCounters> DeviceCounters::Make(const ExecContext& context) {
  if (context.scratch == nullptr) {
    return absl::InvalidArgumentError(
        "actpack: a codec on a CUDA tensor needs ExecContext::scratch, the allocator its "
        "counters come from");
  }
  absl::StatusOr<void*> memory = context.scratch->Allocate(kCounterBytes, context.stream);
  if (!memory.ok()) return memory.status();
  return DeviceCounters(context.scratch, context.stream,
                        static_cast<unsigned long long*>(*memory));
}

DeviceCounters::DeviceCounters(DeviceCounters&& other) noexcept
    : allocator_(other.allocator_), stream_(other.stream_), counters_(other.counters_) {
  other.counters_ = nullptr;
}

DeviceCounters::~DeviceCounters() {
  if (counters_ != nullptr) allocator_->Deallocate(counters_, kCounterBytes, stream_);
}

}  // namespace actpack::codecs::internal

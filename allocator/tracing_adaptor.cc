#include "allocator/tracing_adaptor.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace actpack::allocator {

TracingAdaptor::TracingAdaptor(MemoryResource* upstream, size_t capacity)
    : ResourceAdaptor(upstream), capacity_(std::max<size_t>(capacity, 1)) {
  upstream->AddObserver(this);
}

TracingAdaptor::~TracingAdaptor() { upstream()->RemoveObserver(this); }

std::vector<TraceEntry> TracingAdaptor::Entries() const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.size() < capacity_) return ring_;
  std::vector<TraceEntry> entries;
  entries.reserve(ring_.size());
  entries.insert(entries.end(), ring_.begin() + next_, ring_.end());
  entries.insert(entries.end(), ring_.begin(), ring_.begin() + next_);
  return entries;
}

uint64_t TracingAdaptor::dropped() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return dropped_;
}

void TracingAdaptor::Clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  ring_.clear();
  next_ = 0;
  dropped_ = 0;
}

absl::StatusOr<void*> TracingAdaptor::DoAllocate(size_t bytes, Stream stream,
                                                 size_t reserve_limit) {
  absl::StatusOr<void*> result = upstream()->AllocateWithin(bytes, stream, reserve_limit);
  if (!result.ok() && result.status().code() == absl::StatusCode::kResourceExhausted) {
    Record(MemoryAction::kOom, 0, bytes, bytes, stream);
  }
  return result;
}

void TracingAdaptor::DoDeallocate(void* ptr, size_t bytes, Stream stream) {
  upstream()->Deallocate(ptr, bytes, stream);
}

void TracingAdaptor::OnMemoryEvent(const MemoryEvent& event) {
  // Retries are counted by the statistics; torch's trace has no action for them.
  if (event.action == MemoryAction::kAllocRetry) return;
  Record(event.action, event.address, event.size, event.requested_size, event.stream);
}

void TracingAdaptor::Record(MemoryAction action, uintptr_t address, size_t size,
                            size_t requested_size, Stream stream) {
  if (!enabled()) return;
  const TraceEntry entry{action,  address, size, requested_size,
                         stream, absl::GetCurrentTimeNanos() / 1000};
  std::lock_guard<std::mutex> lock(mutex_);
  if (ring_.size() < capacity_) {
    ring_.push_back(entry);
    return;
  }
  ring_[next_] = entry;
  next_ = (next_ + 1) % capacity_;
  ++dropped_;
}

}  // namespace actpack::allocator

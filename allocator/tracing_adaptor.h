// tracing_adaptor.h — a ring buffer of the allocator's recent actions.
//
// TracingAdaptor records the actions of the stack below it — alloc, free_requested,
// free_completed, segment_alloc, segment_free — and an `oom` entry for each allocation that
// failed through it, with address, size, stream and time, keeping the most recent `capacity`
// entries.
// This is the "device_traces" part of torch.cuda.memory._snapshot(), which memory_viz draws as a
// timeline (see snapshot.h).
//
// Example:
//   TracingAdaptor trace(&stats, /*capacity=*/100000);
//   ...
//   for (const TraceEntry& e : trace.Entries()) Print(e);
#ifndef ACTPACK_ALLOCATOR_TRACING_ADAPTOR_H_
#define ACTPACK_ALLOCATOR_TRACING_ADAPTOR_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "allocator/memory_resource.h"

namespace actpack::allocator {

// TraceEntry
//
// One recorded action. `size` is the block or segment size (for oom: the request);
// `requested_size` is what the caller asked for (block actions; the segment size for segment
// actions, the request for oom), which is what a replay of the trace needs;
// `time_us` is microseconds since the Unix epoch, as in torch's trace.
struct TraceEntry {
  MemoryAction action = MemoryAction::kAlloc;
  uintptr_t address = 0;
  size_t size = 0;
  size_t requested_size = 0;
  Stream stream = nullptr;
  int64_t time_us = 0;
};

// TracingAdaptor
//
// See the file comment. Thread safe.
class TracingAdaptor final : public ResourceAdaptor, private MemoryObserver {
 public:
  static constexpr size_t kDefaultCapacity = 1 << 16;

  explicit TracingAdaptor(MemoryResource* upstream, size_t capacity = kDefaultCapacity);
  ~TracingAdaptor() override;

  // Entries
  //
  // The recorded entries, oldest first (at most `capacity`).
  std::vector<TraceEntry> Entries() const;

  // The number of entries overwritten because the buffer was full.
  uint64_t dropped() const;

  // SetEnabled
  //
  // Stops or resumes recording (torch.cuda.memory._record_memory_history(enabled=None/"all")).
  void SetEnabled(bool enabled) { enabled_.store(enabled, std::memory_order_relaxed); }
  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }

  // Forgets every entry.
  void Clear();

 private:
  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) override;
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override;
  void OnMemoryEvent(const MemoryEvent& event) override;
  void Record(MemoryAction action, uintptr_t address, size_t size, size_t requested_size,
              Stream stream);

  std::atomic<bool> enabled_{true};
  mutable std::mutex mutex_;
  std::vector<TraceEntry> ring_;  // capacity entries once full
  size_t capacity_;
  size_t next_ = 0;       // where the next entry goes once the ring is full
  uint64_t dropped_ = 0;
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_TRACING_ADAPTOR_H_

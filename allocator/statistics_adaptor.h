// statistics_adaptor.h — counters shaped like torch.cuda.memory_stats().
//
// StatisticsAdaptor watches the events of the stack below it and keeps PyTorch's counters for the
// "all" pool: blocks allocated, active and requested, segments reserved, each as
// {current, peak, allocated, freed}, plus the number of allocation retries, OOMs, allocations and
// frees. Through torch's CUDAPluggableAllocator PyTorch's own memory_stats do not work; these
// take their place, under the same names (ToTorchMemoryStats).
//
// The meaning follows PyTorch's caching allocator:
//  * allocated_bytes: blocks handed out, after rounding; drops when the caller frees;
//  * active_bytes: allocated blocks plus freed blocks still waiting for stream events;
//  * requested_bytes: what callers asked for, before rounding; drops with active_bytes;
//  * reserved_bytes: segments taken from the device;
//  * allocation / active / segment: the same as counts.
//
// Example:
//   StatisticsAdaptor stats(&pool);
//   void* p = *stats.Allocate(3_MiB);
//   MemoryStats s = stats.GetStats();  // s.reserved_bytes.current == 20 MiB
//   stats.ResetPeak();
//
// A budget measures each training step's peak without touching the peaks a user reads: it takes
// them from a window of its own (TakeWindowPeaks), which ResetPeak does not restart and which
// does not restart the user's peaks.
#ifndef ACTPACK_ALLOCATOR_STATISTICS_ADAPTOR_H_
#define ACTPACK_ALLOCATOR_STATISTICS_ADAPTOR_H_

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "allocator/memory_resource.h"

namespace actpack::allocator {

// Stat
//
// One counter, as in torch: `allocated` and `freed` accumulate increases and decreases;
// `current == allocated - freed` until ResetAccumulated.
struct Stat {
  int64_t current = 0;
  int64_t peak = 0;
  int64_t allocated = 0;
  int64_t freed = 0;

  void Increase(int64_t amount) {
    current += amount;
    allocated += amount;
    peak = std::max(peak, current);
  }
  void Decrease(int64_t amount) {
    current -= amount;
    freed += amount;
  }
};

// MemoryStats
//
// A copy of all counters at one moment.
struct MemoryStats {
  Stat allocation;  // blocks handed out
  Stat active;      // blocks handed out or waiting for stream events
  Stat segment;     // segments reserved
  Stat allocated_bytes;
  Stat active_bytes;
  Stat requested_bytes;
  Stat reserved_bytes;
  int64_t num_alloc_retries = 0;
  int64_t num_ooms = 0;
  int64_t num_allocs = 0;
  int64_t num_frees = 0;
};

// WindowPeaks
//
// The most bytes allocated and reserved at once within a measuring window.
struct WindowPeaks {
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
};

// ToTorchMemoryStats
//
// The counters as torch.cuda.memory_stats() names them: "allocated_bytes.all.current",
// "reserved_bytes.all.peak", ..., "num_alloc_retries", "num_ooms", "num_device_alloc",
// "num_device_free", plus actpack's "num_allocs" and "num_frees". Sorted by name.
std::vector<std::pair<std::string, int64_t>> ToTorchMemoryStats(const MemoryStats& stats);

// StatisticsAdaptor
//
// See the file comment. Thread safe.
class StatisticsAdaptor final : public ResourceAdaptor, private MemoryObserver {
 public:
  explicit StatisticsAdaptor(MemoryResource* upstream);
  ~StatisticsAdaptor() override;

  MemoryStats GetStats() const;

  // ResetPeak
  //
  // Sets every peak to its current value (torch.cuda.reset_peak_memory_stats).
  void ResetPeak();

  // ResetAccumulated
  //
  // Zeroes the allocated/freed totals and the event counts, keeping current and peak
  // (torch.cuda.reset_accumulated_memory_stats).
  void ResetAccumulated();

  // TakeWindowPeaks
  //
  // The allocated and reserved peaks since the last call (or construction), and a new window
  // starting at the current values. The peaks of GetStats are left as they are.
  WindowPeaks TakeWindowPeaks();

 private:
  absl::StatusOr<void*> DoAllocate(size_t bytes, Stream stream, size_t reserve_limit) override;
  void DoDeallocate(void* ptr, size_t bytes, Stream stream) override;
  void OnMemoryEvent(const MemoryEvent& event) override;

  mutable std::mutex mutex_;
  MemoryStats stats_;
  WindowPeaks window_;
};

}  // namespace actpack::allocator

#endif  // ACTPACK_ALLOCATOR_STATISTICS_ADAPTOR_H_

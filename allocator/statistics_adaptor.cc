#include "allocator/statistics_adaptor.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace actpack::allocator {

std::vector<std::pair<std::string, int64_t>> ToTorchMemoryStats(const MemoryStats& stats) {
  std::vector<std::pair<std::string, int64_t>> flat;
  auto add_stat = [&flat](const char* name, const Stat& stat) {
    flat.emplace_back(absl::StrCat(name, ".all.current"), stat.current);
    flat.emplace_back(absl::StrCat(name, ".all.peak"), stat.peak);
    flat.emplace_back(absl::StrCat(name, ".all.allocated"), stat.allocated);
    flat.emplace_back(absl::StrCat(name, ".all.freed"), stat.freed);
  };
  add_stat("allocation", stats.allocation);
  add_stat("active", stats.active);
  add_stat("segment", stats.segment);
  add_stat("allocated_bytes", stats.allocated_bytes);
  add_stat("active_bytes", stats.active_bytes);
  add_stat("requested_bytes", stats.requested_bytes);
  add_stat("reserved_bytes", stats.reserved_bytes);
  flat.emplace_back("num_alloc_retries", stats.num_alloc_retries);
  flat.emplace_back("num_ooms", stats.num_ooms);
  flat.emplace_back("num_device_alloc", stats.segment.allocated);
  flat.emplace_back("num_device_free", stats.segment.freed);
  flat.emplace_back("num_allocs", stats.num_allocs);
  flat.emplace_back("num_frees", stats.num_frees);
  std::sort(flat.begin(), flat.end());
  return flat;
}

StatisticsAdaptor::StatisticsAdaptor(MemoryResource* upstream) : ResourceAdaptor(upstream) {
  upstream->AddObserver(this);
}

StatisticsAdaptor::~StatisticsAdaptor() { upstream()->RemoveObserver(this); }

MemoryStats StatisticsAdaptor::GetStats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

void StatisticsAdaptor::ResetPeak() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* stat : {&stats_.allocation, &stats_.active, &stats_.segment, &stats_.allocated_bytes,
                     &stats_.active_bytes, &stats_.requested_bytes, &stats_.reserved_bytes}) {
    stat->peak = stat->current;
  }
}

void StatisticsAdaptor::ResetAccumulated() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (Stat* stat : {&stats_.allocation, &stats_.active, &stats_.segment, &stats_.allocated_bytes,
                     &stats_.active_bytes, &stats_.requested_bytes, &stats_.reserved_bytes}) {
    stat->allocated = 0;
    stat->freed = 0;
  }
  stats_.num_alloc_retries = 0;
  stats_.num_ooms = 0;
  stats_.num_allocs = 0;
  stats_.num_frees = 0;
}

WindowPeaks StatisticsAdaptor::TakeWindowPeaks() {
  std::lock_guard<std::mutex> lock(mutex_);
  const WindowPeaks taken = window_;
  window_ = {stats_.allocated_bytes.current, stats_.reserved_bytes.current};
  return taken;
}

absl::StatusOr<void*> StatisticsAdaptor::DoAllocate(size_t bytes, Stream stream,
                                                    size_t reserve_limit) {
  absl::StatusOr<void*> result = upstream()->AllocateWithin(bytes, stream, reserve_limit);
  if (!result.ok() && result.status().code() == absl::StatusCode::kResourceExhausted) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++stats_.num_ooms;
  }
  return result;
}

void StatisticsAdaptor::DoDeallocate(void* ptr, size_t bytes, Stream stream) {
  upstream()->Deallocate(ptr, bytes, stream);
}

void StatisticsAdaptor::OnMemoryEvent(const MemoryEvent& event) {
  const auto size = static_cast<int64_t>(event.size);
  const auto requested = static_cast<int64_t>(event.requested_size);
  std::lock_guard<std::mutex> lock(mutex_);
  switch (event.action) {
    case MemoryAction::kAlloc:
      stats_.allocation.Increase(1);
      stats_.active.Increase(1);
      stats_.allocated_bytes.Increase(size);
      window_.allocated_bytes = std::max(window_.allocated_bytes, stats_.allocated_bytes.current);
      stats_.active_bytes.Increase(size);
      stats_.requested_bytes.Increase(requested);
      ++stats_.num_allocs;
      break;
    case MemoryAction::kFreeRequested:
      stats_.allocation.Decrease(1);
      stats_.allocated_bytes.Decrease(size);
      ++stats_.num_frees;
      break;
    case MemoryAction::kFreeCompleted:
      stats_.active.Decrease(1);
      stats_.active_bytes.Decrease(size);
      stats_.requested_bytes.Decrease(requested);
      break;
    case MemoryAction::kSegmentAlloc:
      stats_.segment.Increase(1);
      stats_.reserved_bytes.Increase(size);
      window_.reserved_bytes = std::max(window_.reserved_bytes, stats_.reserved_bytes.current);
      break;
    case MemoryAction::kSegmentFree:
      stats_.segment.Decrease(1);
      stats_.reserved_bytes.Decrease(size);
      break;
    case MemoryAction::kAllocRetry:
      ++stats_.num_alloc_retries;
      break;
    case MemoryAction::kOom:  // failures are counted in DoAllocate, where they are seen
      break;
  }
}

}  // namespace actpack::allocator

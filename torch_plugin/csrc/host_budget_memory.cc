#include "torch_plugin/csrc/host_budget_memory.h"

#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "allocator/device_allocator.h"
#include "allocator/host_pool.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/units.h"
#include "report/writer.h"
#include "torch_plugin/csrc/cpu_allocator.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack::torch_plugin {

using allocator::HostPool;

void HostBudgetMemory::Start() {
  installed_here_ = !CpuAllocatorInstalled();
  if (installed_here_) InstallCpuAllocator();
  ResumeCounting();
  resident_.Start();
}

void HostBudgetMemory::ResumeCounting() {
  ThrowIfError(allocator::CountSystemMemory(allocator::kHostDevice,
                                            allocator::kHostOutsideAllowanceBytes));
}

runtime::MemoryPeaks HostBudgetMemory::TakePeaks() {
  const allocator::WindowPeaks peaks = HostPool().stats().TakeWindowPeaks();
  return {static_cast<uint64_t>(peaks.allocated_bytes),
          static_cast<uint64_t>(peaks.reserved_bytes), resident_.TakePeak()};
}

void HostBudgetMemory::ReleaseCache() { HostPool().EmptyCache(); }

uint64_t HostBudgetMemory::Cap() { return HostPool().budget().budget(); }

void HostBudgetMemory::SetCap(uint64_t bytes) { HostPool().budget().SetBudget(bytes); }

void HostBudgetMemory::RelievePressureWith(allocator::BudgetAdaptor::PressureCallback relieve) {
  absl::StatusOr<allocator::PressureCallbackId> id =
      allocator::RegisterPressureCallback(allocator::kHostDevice, std::move(relieve));
  ThrowIfError(id.status());
  pressure_id_ = *id;
}

void HostBudgetMemory::StopWatching() {
  allocator::StopCountingSystemMemory(allocator::kHostDevice);
  if (pressure_id_.has_value()) {
    (void)allocator::UnregisterPressureCallback(*pressure_id_);
    pressure_id_.reset();
  }
}

json::Value HostBudgetMemory::Stop(bool snapshot, const runtime::MemoryPeaks& run_peaks,
                                   uint64_t budget_bytes) {
  report::AllocatorRun run{"cpu", true, budget_bytes, json::Value::object(),
                           run_peaks.allocated, run_peaks.reserved, json::Value()};
  for (const auto& [name, value] : allocator::ToTorchMemoryStats(HostPool().stats().GetStats())) {
    run.stats[name] = value;
  }
  if (snapshot) run.snapshot = allocator::HostSnapshot();
  if (installed_here_) UninstallCpuAllocator();
  installed_here_ = false;
  return report::AllocatorSection(std::move(run));
}

}  // namespace actpack::torch_plugin

// actpack's host pool under torch's CPU allocator, as a budget run measures and caps it: the
// memory side of every budget on the CPU, for both front ends (the C++ guard actpack::Budget,
// and actpack.budget on a machine without CUDA, through actpack._C.HostBudgetMemory).
//
//   HostBudgetMemory memory;
//   memory.Start();                  // installs the CPU allocator unless it is; counts the
//                                    // resident set against the cap
//   runtime::BudgetRun run(config, facts, session, memory, relieve);  // caps, lifts, measures
//   memory.StopWatching();
//   json::Value section = memory.Stop(snapshot, run_peaks, budget_bytes);  // the report's
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_HOST_BUDGET_MEMORY_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_HOST_BUDGET_MEMORY_H_

#include <cstdint>
#include <optional>

#include "allocator/budget_adaptor.h"
#include "allocator/pressure_callbacks.h"
#include "allocator/system_memory.h"
#include "runtime/budget_run.h"
#include "runtime/json.h"

namespace actpack::torch_plugin {

class HostBudgetMemory final : public runtime::BudgetMemory {
 public:
  // What its system count is, for the report.
  static constexpr const char* kSystemMemory = "resident set above its size at enter (VmHWM)";

  // Installs actpack's CPU allocator unless it is (Stop uninstalls it then), has the pool count
  // against its cap what the resident set holds outside it (beyond
  // allocator::kHostOutsideAllowanceBytes), and starts the resident set's peak.
  void Start();
  // Counts the resident set against the cap again, from now, after a budget nested inside this
  // one stopped that count (the host pool has one).
  void ResumeCounting();

  // runtime::BudgetMemory. The budget's own window: the peaks a user reads
  // (max_memory_allocated) are left alone.
  runtime::MemoryPeaks TakePeaks() override;
  void ReleaseCache() override;
  uint64_t Cap() override;  // kNoCap: none
  void SetCap(uint64_t bytes) override;

  // Calls `relieve` when an allocation would cross the cap, until StopWatching.
  void RelievePressureWith(allocator::BudgetAdaptor::PressureCallback relieve);
  // No more pressure callback, and no more counting of the resident set.
  void StopWatching();

  // The report's allocator section (after the run stopped: the cap is back), with the run's
  // peaks; the CPU allocator as Start found it.
  json::Value Stop(bool snapshot, const runtime::MemoryPeaks& run_peaks, uint64_t budget_bytes);

 private:
  bool installed_here_ = false;
  allocator::ResidentPeakMeter resident_;
  std::optional<allocator::PressureCallbackId> pressure_id_;
};

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_CSRC_HOST_BUDGET_MEMORY_H_

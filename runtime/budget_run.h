// BudgetRun: one run under a memory budget, as both front ends drive it.
//
// actpack.budget (Python) and actpack::Budget (LibTorch C++) differ in how they see autograd
// (saved-tensor hooks, module names) and how they reach the allocator; what they do with the
// budget over a run is this class, so it has one behaviour:
//
//   - the cap binds from the first step on (Start);
//   - a step before the policy's first plan that does not fit even packed at the harshest may
//     run over the cap, up to LiftedCapBytes(), so that its end measures what it needs (Relieve);
//   - at the end of a step (EndStep) the session plans from the step's peaks; a step that went
//     over the cap with nothing (more) to plan, or a budget no plan fits, is out of memory with
//     the smallest budget that would work, unless the model's recompute regions can take over
//     (recompute "auto"), which they do from the next step;
//   - a new plan releases the pool's cache, so the next step's peak is the plan's footprint;
//   - the gradient guard judges each step's gradient norms (ObserveGradients): a runaway
//     under lossy packing tightens auto's fidelity floor or stops the run;
//   - the run's peaks and warnings become the report's run section (RunSection).
//
//   BudgetRun run(config, {budget_bytes, capped, outside_allowance}, session, memory, relieve);
//   run.Start();
//   ... a step; the allocator's pressure callback calls run.Relieve(needed) ...
//   absl::StatusOr<BudgetRun::StepEnd> end = run.EndStep(regions_ran);
//   ...
//   run.Stop();
//   json::Value section = run.RunSection({.torch = "2.13.0", .device = "cpu", ...});
#ifndef ACTPACK_RUNTIME_BUDGET_RUN_H_
#define ACTPACK_RUNTIME_BUDGET_RUN_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "allocator/memory_resource.h"
#include "runtime/budget_config.h"
#include "runtime/json.h"
#include "runtime/policy.h"
#include "runtime/session.h"

namespace actpack::runtime {

// Peaks over a window of a run, in bytes. `system` is the step's peak as the operating system
// (resident set) or the CUDA driver counts it, above its value at the start; 0 when unknown.
struct MemoryPeaks {
  uint64_t allocated = 0;
  uint64_t reserved = 0;
  uint64_t system = 0;
};

// The allocator pool a budget caps, as a front end reaches it (actpack's host pool, its CUDA
// allocator, or torch's CUDA allocator, which it can measure but not cap).
class BudgetMemory {
 public:
  virtual ~BudgetMemory() = default;
  // Peaks since the last call (or since the front end started measuring); restarts the window.
  virtual MemoryPeaks TakePeaks() = 0;
  // Gives the pool's cached, unused memory back.
  virtual void ReleaseCache() = 0;
  // The pool's cap now (kNoCap: none), and setting it.
  virtual uint64_t Cap() = 0;
  virtual void SetCap(uint64_t bytes) = 0;
};

using allocator::kNoCap;
static_assert(kNoCap == UINT64_MAX, "the pool's cap is a uint64_t; kNoCap must read back");

// How far over the budget a step before the first plan may go to measure itself: the larger
// of 4x the budget and the budget plus 1 GiB.
inline constexpr uint64_t kLiftedCapFactor = 4;
inline constexpr uint64_t kLiftedCapExtraBytes = uint64_t{1} << 30;
// What a lift adds beyond the bytes a request lacks: a small segment.
inline constexpr uint64_t kLiftGranuleBytes = uint64_t{2} << 20;

// What the front end found out about the memory the budget caps, beside its configuration.
struct BudgetMemoryFacts {
  uint64_t budget_bytes = 0;  // the limit resolved on the budget's device
  // Whether the memory can be capped; false where torch's own CUDA allocator serves the
  // device and the budget is a target.
  bool capped = true;
  // What the system may count outside the pool before it takes from the budget.
  uint64_t outside_allowance_bytes = 0;
  // The lift's bound beyond the budget (tests make it small).
  uint64_t lifted_cap_extra_bytes = kLiftedCapExtraBytes;
};

// The steps a run of `config` may lift the cap in, counted from its start: those before the
// policy's first plan (it plans at the end of its kPlansAfterSteps-th step; a fixed codec, or
// plain training, has nothing to plan and may lift it in its first), and with recompute
// "auto" as many again after a switch to recomputation at the end of those.
// The first step (counted from 0) a run is held to the cap from its start: what a
// largest-batch search judges (actpack.search.capped_from).
inline constexpr int64_t kPlansAfterSteps = 2;
int64_t CappedFromStep(const BudgetConfig& config);

// `facts` for a run that starts with `held_outside` bytes already outside the pool (the
// planner's tries: what their warm-up left there, torch's one-time setup among it), counted as
// a fresh process's run counts them: against the allowance, and what exceeds the allowance
// against the budget (at least a byte stays: every step then runs out).
BudgetMemoryFacts HoldingOutside(BudgetMemoryFacts facts, uint64_t held_outside);

// The gradient guard: under lossy packing, a gradient norm over kRunawayFactor x its recent
// median in kRunawaySteps of the last kRunawayOf judged steps is a runaway (two in a row would
// let one through whose norms alternate around the factor, each lower one resetting the
// count), caught in the backward that produced it, before the optimizer steps on it. Steps
// with non-finite gradients are not judged (a GradScaler makes them on purpose).
inline constexpr double kRunawayFactor = 100.0;
inline constexpr int kRunawaySteps = 2;
inline constexpr int kRunawayOf = 3;
inline constexpr size_t kGuardWindow = 16;  // the recent steps whose median is the usual size
inline constexpr size_t kGuardWarmup = 4;   // steps measured before any judgment
// Floors auto tries (0.2, 0.1, 0.05 from none) before a runaway stops the run.
inline constexpr uint64_t kFloorTightenings = 3;

class GradientGuard {
 public:
  // `codec` as messages quote it (BudgetConfig::CodecText).
  explicit GradientGuard(std::string codec) : codec_(std::move(codec)) {}

  // Judges `norm`, step `step`'s total gradient norm; `modules` (name, norm), in the front
  // end's order, name the worst layers. nullopt, or the runaway's description (one sentence).
  std::optional<std::string> Observe(int64_t step, double norm,
                                     const std::vector<std::pair<std::string, double>>& modules);

 private:
  std::string codec_;
  std::vector<double> norms_;  // the recent finite norms, oldest first
  std::vector<bool> high_;     // of the last kRunawayOf judged steps: over the factor
};

class BudgetRun {
 public:
  // `relieve` frees memory under pressure by re-packing what the plan kept exact (the plugin's
  // SavedTensorPacker::Relieve); the bytes it freed. Session and memory outlive the run.
  // `config` is valid (BudgetConfig::Validate).
  BudgetRun(BudgetConfig config, BudgetMemoryFacts memory_facts, Session& session,
            BudgetMemory& memory, std::function<size_t(size_t)> relieve);

  // Caps the memory at the budget and releases what was cached before the run.
  void Start();

  // The allocator's pressure callback: an allocation would cross the cap by `needed` bytes.
  // Re-packs what the plan kept exact; a step before the first plan that still does not fit
  // may run over the cap, for the rest of the step, by what it lacks (the room made). 0 outside
  // Start and Stop.
  size_t Relieve(size_t needed);

  // A recompute region ran in this step; whether it recomputes.
  bool NoteRegion();
  bool recomputing() const { return recomputing_; }

  struct StepEnd {
    // Set when the regions recompute from the next step on (said in the run's warnings).
    std::optional<std::string> warning;
  };

  // Ends a step (its backward pass finished): the session plans from its peaks.
  // kResourceExhausted when no plan fits the budget, or the step went over the cap with
  // nothing more to plan, naming the smallest budget that would work.
  absl::StatusOr<StepEnd> EndStep();

  // Ends the run: the cap as Start found it. Idempotent.
  void Stop();

  // The error for a step that ran out while the cap was lifted (the run stopped on it):
  // it needs more than LiftedCapBytes(). nullopt when the cap was not lifted then.
  std::optional<std::string> OutOfMemoryWhileMeasuring(absl::string_view cause) const;

  // The gradient guard's decision on a step's gradients, `modules` (name, norm of its own
  // parameters' gradients) as the front end measured them after the step's backward.
  struct GradientVerdict {
    enum Action {
      kTrainOn,    // no runaway (or the guard is off)
      kDropStep,   // auto tightened its fidelity floor: drop this step's gradients, warn
      kStop,       // raise GradientRunaway with `message`
    };
    Action action = kTrainOn;
    std::string message;
  };
  GradientVerdict ObserveGradients(const std::vector<std::pair<std::string, double>>& modules);

  // Adds `message` to the run's warnings; false when it is there already.
  bool Warn(const std::string& message);

  // What only the front end knows of a run, for its report's run section.
  struct RunFacts {
    std::string torch;               // torch's version
    std::optional<std::string> python;  // Python's version; nullopt: a C++ program
    std::string device = "cpu";      // the budget's device as the report names it
    // How the system's count was read ("resident set above its size at enter (VmHWM)");
    // nullopt: not read.
    std::optional<std::string> system_memory;
    double wall_seconds = 0;
    int64_t rank = 0;
    int64_t world_size = 1;
  };

  // The report's run section, its keys in the report's order: `facts`, the configuration's
  // budget, codec, loss bound and fidelity floor, the run's budget bytes, peaks and warnings.
  json::Value RunSection(const RunFacts& facts) const;

  // The most a step before the first plan may take.
  uint64_t LiftedCapBytes() const;
  int64_t steps() const { return steps_; }
  const MemoryPeaks& run_peaks() const { return run_peaks_; }
  const BudgetConfig& config() const { return config_; }
  const BudgetMemoryFacts& memory_facts() const { return facts_; }

 private:
  // Folds the window's peaks into the run's, restarts the window.
  MemoryPeaks TakePeaks();
  void ReleaseCache();
  // Puts back a lifted cap; whether it had been lifted.
  bool RestoreCap();
  // Steps before the policy's first plan (of the run, or since the regions recompute).
  int64_t UnplannedSteps() const;
  std::string RecomputeHint() const;

  const BudgetConfig config_;
  const BudgetMemoryFacts facts_;
  const bool automatic_;
  const RecomputeMode recompute_;
  std::optional<GradientGuard> guard_;
  Session& session_;
  BudgetMemory& memory_;
  const std::function<size_t(size_t)> relieve_;

  bool started_ = false;
  uint64_t cap_before_ = kNoCap;
  bool lifted_ = false;           // the cap is lifted for the rest of this step
  bool stopped_lifted_ = false;   // it was when the run stopped
  int64_t steps_ = 0;
  bool planned_ = false;          // the policy planned (since the regions recompute)
  bool recomputing_ = false;
  bool regions_ran_ = false;      // a recompute region ran in this step
  int64_t recompute_from_step_ = 0;
  uint64_t plans_before_recompute_ = 0;
  MemoryPeaks run_peaks_;
  bool system_measured_ = false;
  std::vector<std::string> warnings_;
};

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_BUDGET_RUN_H_

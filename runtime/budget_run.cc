#include "runtime/budget_run.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/units.h"

namespace actpack::runtime {

using allocator::FormatBytes;

namespace {

// The steps a run may lift the cap in when its policy starts (re)planning at step `from`: until
// the end of its first plan, or for a fixed codec (nothing to plan) the one step that measures.
int64_t UnplannedUntil(int64_t from, bool automatic) {
  return from + (automatic ? kPlansAfterSteps : 1);
}

}  // namespace

int64_t CappedFromStep(const BudgetConfig& config) {
  const int64_t first = UnplannedUntil(0, config.Automatic());
  // Recomputation switches on at the end of that step at the latest, and plans afresh.
  if (config.Recompute() == RecomputeMode::kAuto) return UnplannedUntil(first, config.Automatic());
  return first;
}

BudgetMemoryFacts HoldingOutside(BudgetMemoryFacts facts, uint64_t held_outside) {
  const uint64_t allowance = facts.outside_allowance_bytes;
  const uint64_t beyond = held_outside > allowance ? held_outside - allowance : 0;
  facts.budget_bytes = facts.budget_bytes > beyond ? facts.budget_bytes - beyond : 1;
  facts.outside_allowance_bytes = allowance > held_outside ? allowance - held_outside : 0;
  return facts;
}

std::optional<std::string> GradientGuard::Observe(
    int64_t step, double norm, const std::vector<std::pair<std::string, double>>& modules) {
  if (!std::isfinite(norm)) return std::nullopt;
  double usual = 0;
  const bool judged = norms_.size() >= kGuardWarmup;
  if (judged) {
    std::vector<double> sorted = norms_;
    std::sort(sorted.begin(), sorted.end());
    const size_t n = sorted.size();
    usual = n % 2 == 1 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  }
  const bool high = judged && usual != 0 && norm > kRunawayFactor * usual;
  high_.push_back(high);
  if (high_.size() > static_cast<size_t>(kRunawayOf)) high_.erase(high_.begin());
  if (high) {
    // A runaway's norms stay out of the median.
    if (std::count(high_.begin(), high_.end(), true) < kRunawaySteps) return std::nullopt;
    high_.clear();
    std::vector<std::pair<std::string, double>> worst = modules;
    std::stable_sort(worst.begin(), worst.end(),
                     [](const auto& a, const auto& b) { return a.second > b.second; });
    if (worst.size() > 3) worst.resize(3);
    std::vector<std::string> names;
    for (const auto& [name, unused] : worst) names.push_back(name.empty() ? "(top)" : name);
    return absl::StrCat(
        "actpack: the gradient norm ran away under codec ", codec_, ": ",
        absl::StrFormat("%.3g", norm), " at step ", step, ", ",
        absl::StrFormat("%.0f", norm / usual), "x its median over the last ", norms_.size(),
        " steps (", absl::StrFormat("%.3g", usual), "), in ", kRunawaySteps, " of the last ",
        kRunawayOf, " steps; largest in ", absl::StrJoin(names, ", "));
  }
  norms_.push_back(norm);
  if (norms_.size() > kGuardWindow) norms_.erase(norms_.begin());
  return std::nullopt;
}

BudgetRun::BudgetRun(BudgetConfig config, BudgetMemoryFacts memory_facts, Session& session,
                     BudgetMemory& memory, std::function<size_t(size_t)> relieve)
    : config_(std::move(config)),
      facts_(memory_facts),
      automatic_(config_.Automatic()),
      recompute_(config_.Recompute()),
      session_(session),
      memory_(memory),
      relieve_(std::move(relieve)),
      recomputing_(recompute_ == RecomputeMode::kOn) {
  if (config_.GuardsGradients()) guard_.emplace(config_.CodecText());
}

BudgetRun::GradientVerdict BudgetRun::ObserveGradients(
    const std::vector<std::pair<std::string, double>>& modules) {
  GradientVerdict verdict;
  if (!guard_.has_value() || modules.empty()) return verdict;
  double square = 0;
  for (const auto& [name, norm] : modules) square += norm * norm;
  const std::optional<std::string> runaway = guard_->Observe(steps_, std::sqrt(square), modules);
  if (!runaway.has_value()) return verdict;
  const uint64_t tightenings = session_.Policy().floor_tightenings;
  if (!config_.Chooses() || tightenings >= kFloorTightenings) {
    verdict.action = GradientVerdict::kStop;
    verdict.message =
        tightenings > 0
            ? absl::StrCat(*runaway, ", after auto had tightened its fidelity floor ",
                           tightenings,
                           " times for runaways. Stopped before the optimizer step, with the "
                           "weights still finite: use a larger budget, recompute=True, or a "
                           "smaller learning rate")
            : absl::StrCat(*runaway,
                           ". Stopped before the optimizer step, with the weights still finite: "
                           "use a finer codec (quant4, quant8, eb) or a larger budget, or "
                           "budget(..., gradient_guard=False) to train on");
    return verdict;
  }
  const double floor = session_.TightenFloor();
  verdict.action = GradientVerdict::kDropStep;
  verdict.message = absl::StrCat(
      *runaway, ". auto falls back to finer codecs: its fidelity floor is now max_rel_rms=",
      absl::StrFormat("%g", floor), " (tightening ", tightenings + 1, " of ", kFloorTightenings,
      "), and this step's gradients were dropped (the optimizer skips parameters without one)");
  Warn(verdict.message);
  return verdict;
}

void BudgetRun::Start() {
  started_ = true;
  if (facts_.capped) {
    // Capped from the first step on: what the system counts must hold then too.
    cap_before_ = memory_.Cap();
    memory_.SetCap(facts_.budget_bytes);
  }
  // A cap binds new reservations only: give back what ran before (it is not the run's either).
  memory_.ReleaseCache();
  (void)memory_.TakePeaks();
  // Peaks restart at the current values: an idle window's peak is what the pool holds now.
  const uint64_t held = memory_.TakePeaks().reserved;
  if (facts_.capped && held > facts_.budget_bytes) {
    // Segments that live tensors pin (weights, gradients, optimizer state made before the
    // run) cannot be given back, and the run's tensors fill their free space under any cap.
    Warn(absl::StrCat("the pool holds ", FormatBytes(held), " at the start of the run, over the "
                      "budget ", FormatBytes(facts_.budget_bytes), ": segments that live "
                      "tensors made before it pin cannot be given back, and a cap binds new "
                      "reservations only, so the run's steps may use them all"));
  }
}

int64_t BudgetRun::UnplannedSteps() const {
  return UnplannedUntil(recompute_from_step_, automatic_);
}

uint64_t BudgetRun::LiftedCapBytes() const {
  const uint64_t budget = facts_.budget_bytes;
  return std::max(kLiftedCapFactor * budget, budget + facts_.lifted_cap_extra_bytes);
}

size_t BudgetRun::Relieve(size_t needed) {
  // A run that stopped (or never started) makes no room: its pressure callback may outlive it
  // where a front end could not remove it, and must not lift the next run's cap.
  if (!started_) return 0;
  if (automatic_ && relieve_) {
    if (const size_t freed = relieve_(needed); freed > 0) return freed;
  }
  if (!facts_.capped || planned_ || steps_ >= UnplannedSteps()) return 0;
  // A step before the first plan does not fit even packed at the harshest: let it finish over
  // the cap so that its end measures it and says what budget it needs. By what the request
  // lacks, not at once to the bound: the pool still gives back its cache before it grows, so
  // the step's segments lie as they would under a cap; a quarter more at least, since what
  // the system counts outside the pool takes from the cap too. Not without bound: a batch far
  // too large fails fast instead of taking the machine.
  const uint64_t current = memory_.Cap();
  const uint64_t cap = current == kNoCap ? facts_.budget_bytes : current;
  const uint64_t lifted =
      std::min(LiftedCapBytes(), std::max(cap + needed + kLiftGranuleBytes, cap / 4 * 5));
  if (lifted <= cap) return 0;
  lifted_ = true;
  memory_.SetCap(lifted);
  return lifted - cap;
}

bool BudgetRun::NoteRegion() {
  regions_ran_ = true;
  return recomputing_;
}

MemoryPeaks BudgetRun::TakePeaks() {
  const MemoryPeaks peaks = memory_.TakePeaks();
  run_peaks_.allocated = std::max(run_peaks_.allocated, peaks.allocated);
  run_peaks_.reserved = std::max(run_peaks_.reserved, peaks.reserved);
  if (peaks.system > 0) {
    run_peaks_.system = std::max(run_peaks_.system, peaks.system);
    system_measured_ = true;
  }
  return peaks;
}

void BudgetRun::ReleaseCache() {
  // What the step's window saw before the cache goes back counts for the run; the next
  // window starts after it.
  (void)TakePeaks();
  memory_.ReleaseCache();
  (void)memory_.TakePeaks();
}

bool BudgetRun::RestoreCap() {
  if (!lifted_) return false;
  lifted_ = false;
  memory_.SetCap(facts_.budget_bytes);
  ReleaseCache();
  return true;
}

std::string BudgetRun::RecomputeHint() const {
  if (recomputing_) return "";
  if (regions_ran_) {
    return "; the regions this model marks with actpack.recompute would recompute instead "
           "under budget(recompute=\"auto\")";
  }
  return "; or recompute: blocks marked with actpack.recompute, under "
         "budget(recompute=\"auto\"), recompute their activations instead of holding them";
}

absl::StatusOr<BudgetRun::StepEnd> BudgetRun::EndStep() {
  ++steps_;
  StepEnd end;
  const uint64_t changed_plans = session_.Policy().changed_plans;
  const MemoryPeaks peaks = TakePeaks();
  const bool overflowed = RestoreCap();  // after the peaks: it releases the cache
  const bool can_switch =
      regions_ran_ && recompute_ == RecomputeMode::kAuto && !recomputing_;
  const absl::Status status = session_.EndStep(peaks.allocated, peaks.reserved, peaks.system);
  if (!status.ok() && status.code() != absl::StatusCode::kResourceExhausted) return status;
  const bool no_plan_fits = !status.ok();
  if (no_plan_fits && !can_switch) {
    return absl::ResourceExhaustedError(absl::StrCat(status.message(), RecomputeHint()));
  }
  const uint64_t plans_now = session_.Policy().plans;
  planned_ = plans_now > plans_before_recompute_;
  // Over the cap with nothing (more) to plan: the same step will not fit the next time.
  const bool overflowed_unplanned = overflowed && !planned_ && steps_ >= UnplannedSteps();
  // Not a plan that only eats into the headroom: that runs, and a region that cannot
  // micro-batch (a convolutional block) can need more memory recomputed than packed.
  if (can_switch && (no_plan_fits || overflowed_unplanned)) {
    // Codecs alone do not fit: the regions recompute from the next step on, which plans
    // afresh (its first steps may lift the cap again to measure).
    recomputing_ = true;
    recompute_from_step_ = steps_;
    plans_before_recompute_ = plans_now;
    planned_ = false;
    end.warning = absl::StrCat("the budget does not hold step ", steps_,
                               " with codecs alone: the regions marked with actpack.recompute "
                               "recompute from step ", steps_ + 1, " on");
    Warn(*end.warning);
    ReleaseCache();
    regions_ran_ = false;
    return end;
  }
  regions_ran_ = false;
  if (overflowed_unplanned) {
    const uint64_t system = peaks.system > facts_.outside_allowance_bytes
                                ? peaks.system - facts_.outside_allowance_bytes
                                : 0;
    const uint64_t measured = std::max(peaks.reserved, system);
    // As the policy sizes a budget: the peak is what it may use, less the headroom.
    const uint64_t needed = BudgetFor(measured, config_.headroom);
    return absl::ResourceExhaustedError(absl::StrCat(
        "actpack: a budget of ", FormatBytes(facts_.budget_bytes),
        " cannot hold this training step with ", config_.Packing(), ": step ", steps_,
        " went over it and peaked at ", FormatBytes(measured),
        "; the smallest budget that would work is ", FormatBytes(needed), " (with ",
        std::lround(config_.headroom * 100), "% headroom), or use another codec or a smaller "
        "batch"));
  }
  // The next step's peak must show a new plan's footprint, not this plan's cache. The same plan
  // again keeps its cache: given back at every step's end, it is mapped anew, and touched page
  // by page, at every step (the policy plans at every step; a GPT-2-small took 52,000 page
  // faults a step so).
  if (session_.Policy().changed_plans != changed_plans) ReleaseCache();
  return end;
}

void BudgetRun::Stop() {
  if (!started_) return;
  started_ = false;
  (void)TakePeaks();
  stopped_lifted_ = lifted_;
  lifted_ = false;
  if (facts_.capped) memory_.SetCap(cap_before_);
}

std::optional<std::string> BudgetRun::OutOfMemoryWhileMeasuring(absl::string_view cause) const {
  if (!stopped_lifted_) return std::nullopt;
  return absl::StrCat("actpack: a budget of ", FormatBytes(facts_.budget_bytes),
                      " cannot hold this training step: step ", steps_ + 1, " ran out even at ",
                      FormatBytes(LiftedCapBytes()),
                      ", the most a step before the first plan may take to measure what it "
                      "needs (",
                      cause, "); use a smaller batch");
}

bool BudgetRun::Warn(const std::string& message) {
  if (std::find(warnings_.begin(), warnings_.end(), message) != warnings_.end()) return false;
  warnings_.push_back(message);
  return true;
}

json::Value BudgetRun::RunSection(const RunFacts& facts) const {
  const uint64_t budget = facts_.budget_bytes;
  json::Value section = json::Value::object();
  section["torch"] = facts.torch;
  section["python"] = facts.python ? json::Value(*facts.python) : json::Value();
  section["device"] = facts.device;
  section["budget"] = config_.ParsedLimit().ToString();
  section["budget_bytes"] = budget;
  if (config_.rules.empty()) {
    section["codec"] = config_.codec;
  } else {
    json::Value codec = json::Value::object();
    for (const auto& [pattern, spec] : config_.rules) codec[pattern] = spec;
    if (config_.codec != "auto") codec["*"] = config_.codec;
    section["codec"] = std::move(codec);
  }
  section["allowed_loss_increase"] = config_.allowed_loss_increase
                                         ? json::Value(*config_.allowed_loss_increase)
                                         : json::Value();
  section["max_rel_rms"] =
      config_.max_rel_rms > 0 ? json::Value(config_.max_rel_rms) : json::Value();
  // From what the run did: a switch to recomputation lets the steps after it lift the cap.
  section["capped_from_step"] = facts_.capped ? json::Value(UnplannedSteps()) : json::Value();
  section["peak_allocated_bytes"] = run_peaks_.allocated;
  section["peak_reserved_bytes"] = run_peaks_.reserved;
  section["peak_system_bytes"] = system_measured_ ? json::Value(run_peaks_.system) : json::Value();
  section["system_memory"] =
      facts.system_memory ? json::Value(*facts.system_memory) : json::Value();
  section["wall_seconds"] = facts.wall_seconds;
  section["rank"] = facts.rank;
  section["world_size"] = facts.world_size;
  json::Value list = json::Value::array();
  for (const std::string& warning : warnings_) list.emplace_back(warning);
  if (run_peaks_.reserved > budget) {
    list.emplace_back(absl::StrCat("peak memory ", FormatBytes(run_peaks_.reserved),
                                   " exceeded the budget ", FormatBytes(budget)));
  }
  const uint64_t allowance = facts_.outside_allowance_bytes;
  if (system_measured_ && run_peaks_.system > budget + allowance) {
    list.emplace_back(absl::StrCat(
        "the system counted ", FormatBytes(run_peaks_.system), " at the peak (",
        facts.system_memory.value_or("unknown"), "), over the budget ", FormatBytes(budget),
        " and the ", FormatBytes(allowance), " allowed outside it"));
  }
  section["warnings"] = std::move(list);
  return section;
}

}  // namespace actpack::runtime

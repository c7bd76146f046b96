// The policy's side of the Session (session.h): which candidates a tensor may take (the
// fidelity floor, the error caps), the codec it packs with before and between plans, the
// measurements its plans rest on, and the plan at a step's end (Replan). session.cc is the
// registry those choices act on.
#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/units.h"
#include "codecs/registry.h"
#include "runtime/session.h"

namespace actpack::runtime {

namespace {

// "; the error caps hold X more than the harshest codecs would, most in m1 (X1), m2 (X2)...":
// which layers a looser bound (or recomputing them) would fit.
std::string CapCostText(const std::map<std::string, uint64_t>& cost) {
  if (cost.empty()) return "";
  std::vector<std::pair<uint64_t, std::string>> ranked;
  uint64_t total = 0;
  for (const auto& [module, bytes] : cost) {
    ranked.push_back({bytes, module.empty() ? "(no module)" : module});
    total += bytes;
  }
  std::sort(ranked.rbegin(), ranked.rend());
  std::string text = absl::StrCat("; the error caps hold ", allocator::FormatBytes(total),
                                  " more than the harshest codecs would, most in ");
  for (size_t i = 0; i < std::min<size_t>(3, ranked.size()); ++i) {
    absl::StrAppend(&text, i ? ", " : "", ranked[i].second, " (",
                    allocator::FormatBytes(ranked[i].first), ")");
  }
  return text;
}

}  // namespace

int Session::HarshestCandidate(const SavedRecord& record) const {
  // The allowed codec with the smallest bytes (measured, else the codec's bound); 0 (exact)
  // when there is none.
  int choice = 0;
  for (size_t i = 1; i < record.candidates.size(); ++i) {
    if (!Allowed(record, static_cast<int>(i))) continue;
    if (choice == 0 || record.candidates[i].bytes < record.candidates[choice].bytes) {
      choice = static_cast<int>(i);
    }
  }
  return choice;
}

bool Session::Allowed(const SavedRecord& record, int candidate) const {
  // Exact always; a measured error over the fidelity floor never; eb at the bound by
  // construction; the rest when measured within the cap. An unknown error or cap (the data not
  // measured yet) rules nothing out: the first step's safe default.
  if (candidate == 0) return true;
  const double error = record.candidates[candidate].error;
  const double floor =
      policy_.max_rel_rms * (record.recompute_input ? kRecomputeInputFloorShare : 1.0);
  if (floor > 0 && std::isfinite(error) && error > floor * floor) return false;
  if (candidate == record.bound_candidate) return true;
  return error <= record.error_cap;
}

void Session::UpdateErrorBound(SavedRecord& record) {
  const double e = options_.allowed_loss_increase;
  if (e <= 0 || record.mean_square <= 0 || record.cap_version == gradients_.version()) return;
  const ErrorCap cap =
      gradients_.CapFor(record.module, codecs::TensorSpec{record.dtype, record.shape}.numel(),
                        record.mean_square, e);
  record.error_cap = cap.relative;
  record.cap_source = cap.source;
  record.cap_version = gradients_.version();
  record.measured_step = UINT64_MAX;  // measure at the new bound
  if (!record.assigned.automatic || codecs::FindCodec(codecs::CodecId::kEb) == nullptr) return;
  // eb at the bound: every value within sqrt(cap * mean square), so the mean squared error
  // is within the cap too.
  const codecs::CodecParams params = BoundedEb(record.AllowedRms());
  const PolicyCandidate candidate{codecs::FormatCodecSpec(params), record.raw_bytes,
                                  std::numeric_limits<double>::infinity()};
  if (record.bound_candidate < 0) {
    record.candidates.push_back(candidate);
    record.codecs.push_back(params);
    record.bound_candidate = static_cast<int>(record.candidates.size() - 1);
  } else {
    record.candidates[record.bound_candidate] = candidate;
    record.codecs[record.bound_candidate - 1] = params;
  }
  absl::StatusOr<size_t> bound =
      codecs::MaxEncodedSize({record.dtype, record.shape}, params);
  if (bound.ok()) record.candidates[record.bound_candidate].bytes = *bound;
}

double SavedRecord::AllowedRms() const { return std::sqrt(error_cap * mean_square); }

void Session::PlanBoundedEb(SavedRecord& record, PackPlan& plan) {
  // A fixed eb in the error-bounded mode packs at the record's bound, exact until it is known.
  UpdateErrorBound(record);
  if (!std::isfinite(record.error_cap)) {
    plan.action = PackAction::kKeep;
    plan.reason = KeepReason::kAwaitingErrorBound;
    return;
  }
  plan.params = BoundedEb(record.AllowedRms());
}

void Session::SetModuleGradients(const std::map<std::string, ModuleGradients>& gradients) {
  CheckedLock lock(&mu_);
  gradients_.Set(gradients);
}

void Session::StartRelief() {
  CheckedLock lock(&mu_);
  if (!relieving_this_step_) ++policy_.pressure_events;
  relieving_this_step_ = true;
}

double Session::TightenFloor() {
  CheckedLock lock(&mu_);
  policy_.max_rel_rms = policy_.max_rel_rms > 0 ? policy_.max_rel_rms / 2 : kDefaultMaxRelRms;
  ++policy_.floor_tightenings;
  for (SavedRecord& record : records_) {
    if (!record.assigned.automatic || record.choice <= 0) continue;
    if (!Allowed(record, record.choice)) record.choice = HarshestCandidate(record);
  }
  profiled_since_plan_ = true;  // the next step's end plans under the new floor
  return policy_.max_rel_rms;
}

PackPlan Session::ReliefPlan(int record_index) {
  CheckedLock lock(&mu_);
  PackPlan plan;
  plan.record = record_index;
  if (record_index < 0 || static_cast<size_t>(record_index) >= records_.size()) return plan;
  const SavedRecord& record = records_[record_index];
  const int choice = HarshestCandidate(record);
  if (!record.assigned.automatic || choice == 0) return plan;  // kKeep: nothing to re-pack
  plan.action = PackAction::kPack;
  plan.params = record.codecs[choice - 1];
  plan.params.seed = options_.seed + pack_counter_++;
  plan.relief = true;
  return plan;
}

void Session::PlanAutomatic(const SavedTensorInfo& info, SavedRecord& record, PackPlan& plan) {
  if (record.candidates.empty()) {
    // Until measured, a candidate's bytes are its bound and its error unknown (infinite).
    record.candidates.push_back({std::string(kNotPacked), info.Bytes(), 0.0});
    for (const codecs::CodecParams& params : options_.ladder) {
      absl::StatusOr<size_t> bound = codecs::MaxEncodedSize({info.dtype, info.shape}, params);
      record.candidates.push_back({codecs::FormatCodecSpec(params),
                                   bound.ok() ? *bound : info.Bytes(),
                                   std::numeric_limits<double>::infinity()});
      record.codecs.push_back(params);
    }
  }
  UpdateErrorBound(record);
  int choice = record.choice;
  if (options_.budget_bytes == 0) {
    // No budget, nothing to fit: exact; in the error-bounded mode, as small as the cap allows.
    const bool bounded = options_.allowed_loss_increase > 0 && std::isfinite(record.error_cap);
    choice = bounded ? HarshestCandidate(record) : 0;
  }
  // Not planned yet, or out of memory mid-step: the safe default, the harshest codec.
  if (choice < 0 || (relieving_this_step_ && options_.budget_bytes > 0)) {
    choice = HarshestCandidate(record);
  }
  if (choice == 0) {
    plan.action = PackAction::kKeep;
    plan.reason = KeepReason::kFitsBudget;
    record.error = CodecMeasurement{};
    return;
  }
  plan.params = record.codecs[choice - 1];
}

void Session::RecordMeasurement(int record_index, size_t index,
                                const CodecMeasurement& measurement) {
  CheckedLock lock(&mu_);
  if (record_index < 0 || static_cast<size_t>(record_index) >= records_.size()) return;
  SavedRecord& record = records_[record_index];
  if (!measurement.exact && measurement.count > 0 && std::isfinite(measurement.squared_norm)) {
    record.mean_square = measurement.squared_norm / static_cast<double>(measurement.count);
  }
  if (!record.assigned.automatic) {
    record.error = measurement;
    return;
  }
  if (index + 1 >= record.candidates.size()) return;
  PolicyCandidate& candidate = record.candidates[index + 1];
  // A codec that cannot encode the tensor leaves it exact: raw bytes, no error.
  candidate.bytes = measurement.exact ? record.raw_bytes : measurement.bytes;
  candidate.error = measurement.exact ? 0.0 : measurement.RelativeError();
  if (record.codec == codecs::FormatCodecSpec(record.codecs[index])) record.error = measurement;
}

void Session::ChooseMeasured(PackPlan& plan) {
  CheckedLock lock(&mu_);
  if (plan.action != PackAction::kPack || plan.record < 0 ||
      static_cast<size_t>(plan.record) >= records_.size()) {
    return;
  }
  const SavedRecord& record = records_[plan.record];
  const bool safe_default =
      record.choice < 0 || (relieving_this_step_ && options_.budget_bytes > 0);
  if (!record.assigned.automatic || !safe_default) return;
  const std::string chosen = codecs::FormatCodecSpec(plan.params);
  for (size_t i = 0; i < record.codecs.size(); ++i) {
    if (codecs::FormatCodecSpec(record.codecs[i]) != chosen) continue;
    if (Allowed(record, static_cast<int>(i + 1))) return;
    break;
  }
  // Exact is never the harshest while a packed candidate is allowed; with none allowed the
  // default stands for this step (its keeping would be a different action), and the plan at
  // the step's end rules it out.
  const int harshest = HarshestCandidate(record);
  if (harshest == 0) return;
  const uint64_t seed = plan.params.seed;
  plan.params = record.codecs[harshest - 1];
  plan.params.seed = seed;
}

absl::Status Session::Replan(uint64_t peak_bytes, bool pool_full) {
  // The policy's tensors of this step that have measured candidates are the items; the peak
  // minus what they held is the rest of the step. Tensors not measured yet stay as they are.
  std::vector<int> planned;
  std::vector<std::vector<int>> allowed;  // per planned record, its candidates within the cap
  uint64_t capped = 0;
  std::map<std::string, uint64_t> cap_cost;  // per module: bytes the caps and floor keep
  PolicyInput input;
  input.budget_bytes = PlanningBudget();
  input.headroom = options_.headroom;
  // A pool full to its cap may have given back cache to fit this step: how a larger peak
  // would lie in its segments is unknown, so the plan grows no larger than this peak (a
  // 2-layer LM under 14 MiB peaked at 11.29 MiB with the pool at the cap for 48 steps; the
  // plan after the next profile step projected 11.85 MiB, within the headroom, and ran out,
  // a 1 MiB request with 4.58 MiB cached in pieces). Harsher plans are free to follow.
  if (pool_full) input.ceiling_bytes = peak_bytes;
  uint64_t held = current_step_.automatic_bytes;
  uint64_t unmeasured = 0;
  std::vector<bool> seen(records_.size(), false);
  for (int index : step_records_) {
    if (seen[index]) continue;
    seen[index] = true;
    const SavedRecord& record = records_[index];
    if (!record.assigned.automatic || record.candidates.empty()) continue;
    const int current = record.choice;
    const bool measured =
        std::all_of(record.candidates.begin(), record.candidates.end(),
                    [](const PolicyCandidate& c) { return std::isfinite(c.error); });
    if (!measured) {
      // Held as stored: a tensor never planned is packed by the harshest codec (PlanAutomatic),
      // not kept whole. On a GPU a profile step's measurements arrive with the step's status
      // read, after this plan: counting such tensors whole made the rest of the step larger
      // than its peak (the GPT under 8 GiB on an H200: 17.13 GiB of a 3.68 GiB peak), and
      // auto's largest batch fell below plain's.
      unmeasured += record.candidates[current >= 0 ? current : HarshestCandidate(record)].bytes;
      continue;
    }
    planned.push_back(index);
    PolicyItem item{{}, gradients_.WeightOf(record.module)};
    allowed.emplace_back();
    uint64_t smallest = UINT64_MAX, smallest_allowed = UINT64_MAX;
    for (size_t i = 0; i < record.candidates.size(); ++i) {
      smallest = std::min(smallest, record.candidates[i].bytes);
      if (!Allowed(record, static_cast<int>(i))) {
        ++capped;
        continue;
      }
      smallest_allowed = std::min(smallest_allowed, record.candidates[i].bytes);
      allowed.back().push_back(static_cast<int>(i));
      item.candidates.push_back(record.candidates[i]);
    }
    if (smallest_allowed > smallest) cap_cost[record.module] += smallest_allowed - smallest;
    input.items.push_back(std::move(item));
  }
  // The unmeasured tensors are among those held: what is not planned is the peak less the
  // planned ones' bytes, never more than the peak.
  input.other_bytes = (peak_bytes > held ? peak_bytes - held : 0) + std::min(unmeasured, held);
  if (planned.empty()) return absl::OkStatus();
  const PolicyPlan plan = SolvePolicy(input);
  bool changed = false;
  for (size_t i = 0; i < planned.size(); ++i) {
    int& choice = records_[planned[i]].choice;
    changed |= choice != allowed[i][plan.choice[i]];
    choice = allowed[i][plan.choice[i]];
  }
  ++policy_.plans;
  if (changed) ++policy_.changed_plans;
  policy_.capped_candidates = capped;
  policy_.other_bytes = input.other_bytes;
  policy_.projected_peak = plan.projected_peak;
  policy_.feasible = plan.feasible;
  policy_.smallest_feasible_budget = static_cast<uint64_t>(
      std::ceil(static_cast<double>(plan.smallest_feasible_budget) * policy_.fragmentation));
  policy_.weighted_error = plan.weighted_error;
  // Over the headroom (or what fragmentation may take) but within the budget itself: run the
  // harshest plan rather than fail; the cap has the last word.
  const uint64_t outside = policy_.outside_pool_bytes;
  if (plan.feasible || plan.projected_peak + outside <= options_.budget_bytes) {
    return absl::OkStatus();
  }
  using allocator::FormatBytes;
  return absl::ResourceExhaustedError(absl::StrCat(
      "actpack: a budget of ", FormatBytes(options_.budget_bytes),
      " cannot hold this training step: ",
      outside > 0 ? absl::StrCat(FormatBytes(outside),
                                 " of it is held outside the allocator (the system's count of "
                                 "the step exceeded the allocator's by that much); ")
                  : std::string(),
      "its tensors peaked at ", FormatBytes(peak_bytes),
      ", of which ", FormatBytes(input.other_bytes),
      " is not saved activations (parameters, gradients, optimizer state, workspace), and "
      "even the harshest codecs leave ", FormatBytes(plan.projected_peak - input.other_bytes),
      " of activations; the smallest budget that would work is ",
      FormatBytes(policy_.smallest_feasible_budget + outside), " (with ",
      static_cast<int>(std::lround(options_.headroom * 100)), "% headroom",
      policy_.fragmentation > 1.0
          ? absl::StrFormat(" and the %.2fx the allocator reserved over what it allocated",
                            policy_.fragmentation)
          : std::string(),
      options_.allowed_loss_increase > 0
          ? absl::StrCat(" and allowed_loss_increase=", options_.allowed_loss_increase,
                         "; a larger allowed increase permits harsher codecs")
          : std::string(),
      policy_.max_rel_rms > 0 && capped > 0
          ? absl::StrCat(" and max_rel_rms=", policy_.max_rel_rms,
                         ", the error each saved tensor may carry; max_rel_rms=None permits "
                         "every codec, 2-bit ones included, at the cost of gradient fidelity")
          : std::string(),
      CapCostText(cap_cost),
      "), or use a smaller batch"));
}

uint64_t Session::PoolBudget() const {
  const uint64_t outside = policy_.outside_pool_bytes;
  return options_.budget_bytes > outside ? options_.budget_bytes - outside : 0;
}

uint64_t Session::PlanningBudget() const {
  return static_cast<uint64_t>(static_cast<double>(PoolBudget()) / policy_.fragmentation);
}

}  // namespace actpack::runtime

// The budget policy: which codec each saved tensor gets so that the step's peak stays under the
// budget with the least error.
//
// The session measures, on profile steps, what every candidate codec would cost for each saved
// tensor of the step: stored bytes and relative squared error ‖x − x̂‖² / ‖x‖² (measured on
// the data, not modelled). Memory is modelled as the bytes the step needs besides the saved
// tensors (`other_bytes`: parameters, gradients, optimizer state, transients) plus the stored
// bytes of every saved tensor. SolvePolicy starts from the most exact choice for every tensor
// and, while the projection is over the budget, takes the step down with the least added error
// per byte saved — ActNN's and GACT's greedy bit allocation with bytes and measured error in
// place of bits and modelled variance. Candidates off a tensor's lower convex hull
// (bytes, error) are never worth taking and are skipped, which keeps the greedy exact for a
// convex problem.
//
// Usage:
//   PolicyInput input{.budget_bytes = 6 << 30, .other_bytes = measured_peak - stored_at_peak};
//   input.items.push_back({{{"none", raw, 0.0}, {"quant4", raw / 7, 3e-3}, ...}, weight});
//   PolicyPlan plan = SolvePolicy(input);
//   if (!plan.feasible) ... plan.smallest_feasible_budget ...
#ifndef ACTPACK_RUNTIME_POLICY_H_
#define ACTPACK_RUNTIME_POLICY_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace actpack::runtime {

struct PolicyCandidate {
  std::string spec;    // codec spec (kNotPacked, "none", for the tensor as it is)
  uint64_t bytes = 0;  // stored bytes per step
  double error = 0.0;  // relative squared error, 0 for exact codecs
};

struct PolicyItem {
  std::vector<PolicyCandidate> candidates;  // any order; at least one
  double weight = 1.0;                      // sensitivity: how much this tensor's error counts
};

// The share of a budget a plan leaves free for what its model misses (fragmentation beyond the
// measured, memory outside the allocator): the default of actpack.budget, the planner and
// actpack::BudgetOptions.
inline constexpr double kDefaultHeadroom = 0.15;

struct PolicyInput {
  uint64_t budget_bytes = 0;
  uint64_t other_bytes = 0;  // the step's peak besides the saved tensors
  double headroom = kDefaultHeadroom;
  std::vector<PolicyItem> items;
  // When nonzero, the plan also projects no more than this: a peak known to fit under a cap
  // the pool was full against, where a larger one's layout is unknown (0: no ceiling). Only
  // the choices follow it; `feasible` is still against the budget less the headroom.
  uint64_t ceiling_bytes = 0;
};

struct PolicyPlan {
  std::vector<int> choice;          // per item, an index into its candidates
  uint64_t projected_peak = 0;      // other_bytes + stored bytes of the choices
  double weighted_error = 0.0;      // Σ weight · error of the choices
  bool feasible = false;            // projected_peak fits the budget less the headroom
  // The budget the harshest plan needs (headroom included): what to ask for when infeasible.
  uint64_t smallest_feasible_budget = 0;
};

PolicyPlan SolvePolicy(const PolicyInput& input);

// The budget under which `peak` bytes fit with `headroom` free: ceil(peak / (1 - headroom)).
uint64_t BudgetFor(uint64_t peak, double headroom);

// The bytes a plan may use of `budget_bytes` with `headroom` kept free:
// floor(budget * (1 - headroom)), BudgetFor's inverse up to rounding.
uint64_t UsableBytes(uint64_t budget_bytes, double headroom);

// MaxBatchSize
//
// The largest batch that fits `budget_bytes` under the batch-size planner's model
// fixed + per_sample * b: floor((budget - fixed) / per_sample), 0 when not even one sample
// fits, and nullopt ("unbounded") when per_sample is 0 and the fixed part fits. The planner
// (actpack.plan) and `actpack plan` both ask it, at UsableBytes of their budget.
std::optional<uint64_t> MaxBatchSize(uint64_t budget_bytes, uint64_t fixed_bytes,
                                     uint64_t per_sample_bytes);

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_POLICY_H_

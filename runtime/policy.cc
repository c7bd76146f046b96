#include "runtime/policy.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <tuple>

namespace actpack::runtime {
namespace {

// The candidates worth taking, most bytes first: the lower convex hull of (bytes, error) from
// the least-error candidate down to the fewest-bytes one. Each step along it saves bytes at a
// cost in error per byte that never decreases, so taking the cheapest step first is optimal.
std::vector<int> Hull(const PolicyItem& item) {
  std::vector<int> order(item.candidates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
  const auto& c = item.candidates;
  // Most bytes first; among equal bytes the least error first.
  std::sort(order.begin(), order.end(), [&](int a, int b) {
    return std::tie(c[b].bytes, c[a].error) < std::tie(c[a].bytes, c[b].error);
  });
  // Pareto front: going down in bytes, keep a candidate only if it has strictly more error
  // than the last kept one... after first dropping everything that has more bytes *and* no
  // less error than some smaller candidate.
  std::vector<int> front;
  for (int i : order) {
    while (!front.empty() && c[i].error <= c[front.back()].error) front.pop_back();
    if (front.empty() || c[i].bytes < c[front.back()].bytes) front.push_back(i);
  }
  // Convexity: drop a middle point whose slope into it is worse than the slope out of it.
  const auto slope = [&](int from, int to) {
    return (c[to].error - c[from].error) /
           static_cast<double>(c[from].bytes - c[to].bytes);
  };
  std::vector<int> hull;
  for (int i : front) {
    while (hull.size() >= 2 &&
           slope(hull[hull.size() - 2], hull.back()) >= slope(hull.back(), i)) {
      hull.pop_back();
    }
    hull.push_back(i);
  }
  return hull;
}

}  // namespace

uint64_t BudgetFor(uint64_t peak, double headroom) {
  return static_cast<uint64_t>(std::ceil(static_cast<double>(peak) / (1.0 - headroom)));
}

uint64_t UsableBytes(uint64_t budget_bytes, double headroom) {
  return static_cast<uint64_t>(static_cast<double>(budget_bytes) * (1.0 - headroom));
}

std::optional<uint64_t> MaxBatchSize(uint64_t budget_bytes, uint64_t fixed_bytes,
                                     uint64_t per_sample_bytes) {
  if (budget_bytes < fixed_bytes) return 0;
  if (per_sample_bytes == 0) return std::nullopt;
  // (budget - fixed) / per_sample is 0 when not even one sample fits; no sum can overflow.
  return (budget_bytes - fixed_bytes) / per_sample_bytes;
}

PolicyPlan SolvePolicy(const PolicyInput& input) {
  const size_t n = input.items.size();
  std::vector<std::vector<int>> hulls(n);
  std::vector<size_t> position(n, 0);
  PolicyPlan plan;
  plan.choice.assign(n, 0);
  uint64_t projected = input.other_bytes;
  uint64_t harshest = input.other_bytes;
  for (size_t i = 0; i < n; ++i) {
    hulls[i] = Hull(input.items[i]);
    projected += input.items[i].candidates[hulls[i].front()].bytes;
    harshest += input.items[i].candidates[hulls[i].back()].bytes;
  }
  const double limit = static_cast<double>(UsableBytes(input.budget_bytes, input.headroom));
  const double target =
      input.ceiling_bytes > 0 ? std::min(limit, static_cast<double>(input.ceiling_bytes)) : limit;

  // (added error per byte saved, item): the cheapest next step of every item on top.
  using Step = std::pair<double, size_t>;
  std::priority_queue<Step, std::vector<Step>, std::greater<Step>> steps;
  const auto push_next = [&](size_t i) {
    if (position[i] + 1 >= hulls[i].size()) return;
    const PolicyCandidate& from = input.items[i].candidates[hulls[i][position[i]]];
    const PolicyCandidate& to = input.items[i].candidates[hulls[i][position[i] + 1]];
    const double cost = input.items[i].weight * (to.error - from.error) /
                        static_cast<double>(from.bytes - to.bytes);
    steps.push({cost, i});
  };
  for (size_t i = 0; i < n; ++i) push_next(i);
  while (static_cast<double>(projected) > target && !steps.empty()) {
    const size_t i = steps.top().second;
    steps.pop();
    projected -= input.items[i].candidates[hulls[i][position[i]]].bytes;
    ++position[i];
    projected += input.items[i].candidates[hulls[i][position[i]]].bytes;
    push_next(i);
  }

  for (size_t i = 0; i < n; ++i) {
    plan.choice[i] = hulls[i][position[i]];
    plan.weighted_error += input.items[i].weight * input.items[i].candidates[plan.choice[i]].error;
  }
  plan.projected_peak = projected;
  plan.feasible = static_cast<double>(projected) <= limit;
  plan.smallest_feasible_budget = BudgetFor(harshest, input.headroom);
  return plan;
}

}  // namespace actpack::runtime

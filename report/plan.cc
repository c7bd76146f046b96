#include "report/plan.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "allocator/units.h"
#include "report/text_util.h"
#include "runtime/policy.h"

namespace actpack::report {
namespace {

using allocator::FormatBytes;

// A batch size, nullopt meaning no limit from the per-sample model.
std::string BatchText(const std::optional<uint64_t>& batch) {
  return batch.has_value() ? absl::StrCat(*batch) : "unbounded";
}

// The largest batch of `choice` at `budget_bytes` less its headroom; nullopt: unbounded.
std::optional<uint64_t> BatchAt(const PlannerProfile& planner, const PlannerChoice& choice,
                                uint64_t budget_bytes) {
  return runtime::MaxBatchSize(planner.Usable(choice, budget_bytes), choice.fixed_bytes,
                               choice.per_sample_bytes);
}

// The choice with the largest batch at `budget_bytes` (unbounded beats any number, the first
// of equals wins), or nullptr when there are no choices.
const PlannerChoice* BestChoice(const PlannerProfile& planner, uint64_t budget_bytes) {
  const PlannerChoice* best = nullptr;
  std::optional<uint64_t> best_batch;
  for (const PlannerChoice& choice : planner.choices) {
    const std::optional<uint64_t> batch = BatchAt(planner, choice, budget_bytes);
    const bool better = best == nullptr || (best_batch.has_value() &&
                                            (!batch.has_value() || *batch > *best_batch));
    if (better) {
      best = &choice;
      best_batch = batch;
    }
  }
  return best;
}

// Whether a batch size at the new budget lies outside the profiled ones, where the linear
// model is extrapolated rather than measured.
bool OutsideProfiled(const PlannerProfile& planner, const std::optional<uint64_t>& batch) {
  if (!batch.has_value() || *batch == 0 || planner.batch_sizes.empty()) return false;
  const auto [smallest, largest] =
      std::minmax_element(planner.batch_sizes.begin(), planner.batch_sizes.end());
  return *batch < *smallest || *batch > *largest;
}

}  // namespace

std::string FormatPlanText(const RunReport& report, uint64_t budget_bytes) {
  const PlannerProfile& planner = *report.planner;
  const std::string budget = FormatBytes(budget_bytes);
  const std::string recorded = FormatBytes(planner.budget_bytes);
  std::string text = absl::StrCat("actpack plan: ", report.FileName(), " at a budget of ",
                                  budget, "\n", "planner profile: budget ", recorded,
                                  ", profiled batch sizes: ", JoinCounts(planner.batch_sizes),
                                  "\n\n");
  const bool gradients = GradientsMeasured(planner);
  TextTable table({1, 2, 3, 4, 5, 6});
  std::vector<std::string> header = {"choice", "fixed", "per sample", "headroom"};
  if (gradients) header.push_back("grad cos");
  header.push_back(absl::StrCat("max batch at ", budget));
  header.push_back(absl::StrCat("recorded at ", recorded));
  table.AddRow(header);
  bool extrapolated = false;
  for (const PlannerChoice& choice : planner.choices) {
    const std::optional<uint64_t> batch = BatchAt(planner, choice, budget_bytes);
    extrapolated = extrapolated || OutsideProfiled(planner, batch);
    // A share measured by real steps under the cap, or the section's default (marked *).
    std::vector<std::string> row = {
        choice.name, FormatBytes(choice.fixed_bytes), FormatBytes(choice.per_sample_bytes),
        absl::StrFormat("%.1f%%%s", 100 * choice.headroom.value_or(planner.headroom),
                        choice.headroom.has_value() ? "" : "*")};
    if (gradients) row.push_back(GradientCosineText(choice));
    row.push_back(BatchText(batch));
    row.push_back(absl::StrCat(choice.max_batch_size));
    table.AddRow(row);
  }
  if (planner.choices.empty()) {
    absl::StrAppend(&text, "  the planner profile records no choices\n");
    return text;
  }
  absl::StrAppend(&text, table.Render(), GradientNotes(planner), "\n");
  const PlannerChoice* best = BestChoice(planner, budget_bytes);
  const std::optional<uint64_t> best_batch = BatchAt(planner, *best, budget_bytes);
  if (best_batch.has_value() && *best_batch == 0) {
    absl::StrAppend(&text, "  no choice fits one sample in ", budget, "\n");
  } else {
    absl::StrAppend(&text, "  largest batch at ", budget, ": ", best->name, " (",
                    BatchText(best_batch), ")\n");
  }
  absl::StrAppend(&text, "  verified at ", recorded, ": ", VerifiedText(planner), "\n");
  if (std::any_of(planner.choices.begin(), planner.choices.end(),
                  [](const PlannerChoice& c) { return !c.headroom.has_value(); })) {
    absl::StrAppend(&text, "  ", kDefaultHeadroomNote, "\n");
  }
  if (extrapolated) {
    absl::StrAppend(&text, "  note: outside the profiled batch sizes (",
                    JoinCounts(planner.batch_sizes),
                    ") the fixed + per-sample model is extrapolated\n");
  }
  return text;
}

json::Value SummarizePlan(const RunReport& report, uint64_t budget_bytes) {
  const PlannerProfile& planner = *report.planner;
  json::Value plan = json::Value::object();
  plan["schema"] = "actpack.plan";
  plan["schema_version"] = 1;
  plan["file"] = report.file;
  plan["budget_bytes"] = budget_bytes;
  plan["recorded_budget_bytes"] = planner.budget_bytes;
  plan["batch_sizes"] = CountArray(planner.batch_sizes);
  plan["headroom"] = planner.headroom;
  json::Value choices = json::Value::object();
  bool extrapolated = false;
  for (const PlannerChoice& choice : planner.choices) {
    const std::optional<uint64_t> batch = BatchAt(planner, choice, budget_bytes);
    extrapolated = extrapolated || OutsideProfiled(planner, batch);
    json::Value entry = json::Value::object();
    entry["fixed_bytes"] = choice.fixed_bytes;
    entry["per_sample_bytes"] = choice.per_sample_bytes;
    entry["headroom"] = choice.headroom.value_or(planner.headroom);
    entry["max_batch_size"] = OptionalJson(batch);  // null: unbounded
    (entry["unbounded"] = !batch.has_value());
    entry["recorded_max_batch_size"] = choice.max_batch_size;
    choices[choice.name] = std::move(entry);
  }
  plan["choices"] = std::move(choices);
  // The choice with the largest batch, null when none fits one sample.
  const PlannerChoice* best = BestChoice(planner, budget_bytes);
  if (best != nullptr && BatchAt(planner, *best, budget_bytes) == uint64_t{0}) best = nullptr;
  plan["best"] = best == nullptr ? json::Value() : json::Value(best->name);
  plan["extrapolated"] = extrapolated;
  plan["verified"] = VerifiedJson(planner);
  return plan;
}

}  // namespace actpack::report

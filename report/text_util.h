// Pieces the text and JSON views share (text.cc: report and diff; plan.cc: plan): a table
// padded to its columns, bytes against a budget, the planner's verification and gradient
// columns, and the JSON of optional counts. Internal to report/ (its target is visible only
// there).
#ifndef ACTPACK_REPORT_TEXT_UTIL_H_
#define ACTPACK_REPORT_TEXT_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "report/reader.h"
#include "runtime/json.h"

namespace actpack::report {

// Rows of cells printed with each column padded to its widest cell. Columns listed in
// `right_aligned` are padded on the left (numbers).
class TextTable {
 public:
  explicit TextTable(std::vector<size_t> right_aligned = {})
      : right_aligned_(std::move(right_aligned)) {}

  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

  std::string Render(absl::string_view indent = "  ") const;

 private:
  std::vector<size_t> right_aligned_;
  std::vector<std::vector<std::string>> rows_;
};

// "250.00 MiB (97.7% of the budget)", with ", OVER" past it.
std::string BytesOfBudget(uint64_t bytes, std::optional<uint64_t> budget);

// "8, 16, 32", or "none".
std::string JoinCounts(const std::vector<uint64_t>& counts);

// The planner's verification step in words ("not run" when it ran none).
std::string VerifiedText(const PlannerProfile& planner);

// The worst parameter group's gradient cosine against exact training, "!" when groups fell
// below the plan's bound, "-" where it was not measured.
std::string GradientCosineText(const PlannerChoice& choice);

// Whether the plan measured any choice's gradients (reports before it did not: no column).
bool GradientsMeasured(const PlannerProfile& planner);

// Under the table: which choices turned some groups' gradients (their worst group).
std::string GradientNotes(const PlannerProfile& planner);

// A JSON array of `counts`; `value` or null; the verification step as JSON (null: not run).
json::Value CountArray(const std::vector<uint64_t>& counts);
json::Value OptionalJson(const std::optional<uint64_t>& value);
json::Value VerifiedJson(const PlannerProfile& planner);

}  // namespace actpack::report

#endif  // ACTPACK_REPORT_TEXT_UTIL_H_

#include "report/text_util.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "allocator/units.h"

namespace actpack::report {

using allocator::FormatBytes;

std::string TextTable::Render(absl::string_view indent) const {
  std::vector<size_t> widths;
  for (const auto& row : rows_) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string text;
  for (const auto& row : rows_) {
    std::string line(indent);
    for (size_t c = 0; c < row.size(); ++c) {
      const bool right =
          std::find(right_aligned_.begin(), right_aligned_.end(), c) != right_aligned_.end();
      const std::string padding(widths[c] - row[c].size(), ' ');
      absl::StrAppend(&line, c == 0 ? "" : "   ", right ? padding : "", row[c],
                      right ? "" : padding);
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    absl::StrAppend(&text, line, "\n");
  }
  return text;
}

std::string BytesOfBudget(uint64_t bytes, std::optional<uint64_t> budget) {
  std::string text = FormatBytes(bytes);
  if (budget.has_value() && *budget > 0) {
    absl::StrAppendFormat(&text, " (%.1f%% of the budget%s)",
                          100.0 * static_cast<double>(bytes) / static_cast<double>(*budget),
                          bytes > *budget ? ", OVER" : "");
  }
  return text;
}

std::string JoinCounts(const std::vector<uint64_t>& counts) {
  return counts.empty() ? "none" : absl::StrJoin(counts, ", ");
}

std::string VerifiedText(const PlannerProfile& planner) {
  if (!planner.verified.has_value()) return "not run";
  const PlannerVerified& v = *planner.verified;
  if (!v.peak_bytes.has_value()) {
    return absl::StrCat(v.codec, " did not fit the cap at any batch tried",
                        v.smallest_tried ? absl::StrCat(" (down to ", v.smallest_tried, ")") : "");
  }
  return absl::StrCat(v.codec, " at batch ", v.batch_size, ", peak ",
                      BytesOfBudget(*v.peak_bytes, planner.budget_bytes));
}

std::string GradientCosineText(const PlannerChoice& choice) {
  if (!choice.min_cosine.has_value()) return "-";
  const std::string cosine = std::isnan(*choice.min_cosine)
                                 ? std::string("non-finite")
                                 : absl::StrFormat("%.3f", *choice.min_cosine);
  return choice.groups_below_bound > 0 ? cosine + "!" : cosine;
}

bool GradientsMeasured(const PlannerProfile& planner) {
  return std::any_of(planner.choices.begin(), planner.choices.end(),
                     [](const PlannerChoice& c) { return c.min_cosine.has_value(); });
}

std::string GradientNotes(const PlannerProfile& planner) {
  std::string text;
  for (const PlannerChoice& choice : planner.choices) {
    if (choice.groups_below_bound == 0) continue;
    absl::StrAppend(&text, "  ", choice.name, ": ", choice.groups_below_bound,
                    " parameter group(s) below the gradient bound, worst ",
                    choice.worst_group.empty() ? "(root)" : choice.worst_group, " (",
                    std::isnan(*choice.min_cosine) ? std::string("non-finite")
                                                   : absl::StrFormat("%.3f", *choice.min_cosine),
                    ")\n");
  }
  return text;
}

json::Value CountArray(const std::vector<uint64_t>& counts) {
  json::Value list = json::Value::array();
  for (uint64_t count : counts) list.emplace_back(count);
  return list;
}

json::Value OptionalJson(const std::optional<uint64_t>& value) {
  return value.has_value() ? json::Value(*value) : json::Value();
}

json::Value VerifiedJson(const PlannerProfile& planner) {
  if (!planner.verified.has_value()) return json::Value();
  json::Value verified = json::Value::object();
  verified["codec"] = planner.verified->codec;
  verified["batch_size"] = planner.verified->batch_size;
  verified["peak_bytes"] = OptionalJson(planner.verified->peak_bytes);
  if (planner.verified->smallest_tried) verified["smallest_tried"] = planner.verified->smallest_tried;
  return verified;
}

}  // namespace actpack::report

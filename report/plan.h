// `actpack plan`: the batch sizes a run's planner profile gives at another budget, as text or
// (with --json) as an "actpack.plan" document. The formula is runtime/policy.h's MaxBatchSize
// at UsableBytes of the budget, the same one actpack.plan (Python) asks.
//
// Usage:
//   absl::StatusOr<RunReport> report = LoadRunReport("run.json");
//   if (report->planner.has_value()) std::cout << FormatPlanText(*report, uint64_t{12} << 30);
#ifndef ACTPACK_REPORT_PLAN_H_
#define ACTPACK_REPORT_PLAN_H_

#include <cstdint>
#include <string>

#include "report/reader.h"
#include "runtime/json.h"

namespace actpack::report {

// FormatPlanText / SummarizePlan
//
// What `actpack plan RUN.json --budget SIZE` prints for `budget_bytes` (text, and with --json
// an "actpack.plan" version 1 document): per choice the fixed and per-sample bytes, the largest
// batch at the new budget and the one recorded at the planner's budget, the best choice, the
// verification step, and a note when the new batch lies beyond the profiled sizes. Requires
// report.planner.
std::string FormatPlanText(const RunReport& report, uint64_t budget_bytes);

// The planner table's footnote for a headroom no step under the cap measured (the '*' beside
// it): `actpack plan` and actpack.plan's table (actpack._C.PLAN_DEFAULT_HEADROOM_NOTE) print it.
inline constexpr char kDefaultHeadroomNote[] =
    "* not measured by steps under the cap: the default headroom";
json::Value SummarizePlan(const RunReport& report, uint64_t budget_bytes);

}  // namespace actpack::report

#endif  // ACTPACK_REPORT_PLAN_H_

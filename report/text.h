// The text views of a run report: what `actpack report` prints (as text, or with --json as a
// stable summary for machines) and what `actpack diff` prints for two runs. `actpack plan` is
// plan.h.
//
// Usage:
//   absl::StatusOr<RunReport> report = LoadRunReport("run.json");
//   std::cout << FormatReportText(*report);
//   std::cout << FormatDiffText(*before, *after);
#ifndef ACTPACK_REPORT_TEXT_H_
#define ACTPACK_REPORT_TEXT_H_

#include <cstddef>
#include <string>

#include "report/reader.h"
#include "runtime/json.h"

namespace actpack::report {

// FormatReportText
//
// What `actpack report` prints: run metadata, budget and peak, activation bytes raw vs stored,
// the top `max_consumers` consumers by module (by producer when no record names a module) with
// their codecs and errors, the planner's batch sizes, the allocator's peaks, fragmentation,
// retries and OOMs, and warnings.
std::string FormatReportText(const RunReport& report, size_t max_consumers = 12);

// SummarizeReport
//
// What `actpack report --json` prints: a compact, stable summary ("actpack.report_summary",
// version 1) with the same facts as the text; absent facts are absent members.
json::Value SummarizeReport(const RunReport& report);

// FormatDiffText
//
// What `actpack diff a b` prints: run metadata that differs, peak, ratio, totals, allocator
// counters with their change, the planner's largest batch size per choice, and stored bytes
// per step by module (by producer when neither report names modules); consumers or choices
// missing on one side are marked.
std::string FormatDiffText(const RunReport& before, const RunReport& after);

}  // namespace actpack::report

#endif  // ACTPACK_REPORT_TEXT_H_

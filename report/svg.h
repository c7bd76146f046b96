// `actpack plot`: a run report as a picture, an SVG written by hand.
//
// Usage:
//   absl::StatusOr<RunReport> report = LoadRunReport("run.json");
//   std::string svg = RenderMemorySvg(*report);
#ifndef ACTPACK_REPORT_SVG_H_
#define ACTPACK_REPORT_SVG_H_

#include <string>

#include "report/reader.h"

namespace actpack::report {

// RenderMemorySvg
//
// A standalone SVG (no scripts, no external fonts): per-step activation bytes saved raw vs
// stored as bars, the budget as a dashed line when the report has one, and per-module (or
// per-producer) horizontal bars of raw vs stored bytes per step. Axes are labelled in
// KiB/MiB/GiB.
std::string RenderMemorySvg(const RunReport& report);

}  // namespace actpack::report

#endif  // ACTPACK_REPORT_SVG_H_

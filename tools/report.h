// The `actpack` command line: read a run report (DESIGN.md, "Report") and tell a person where
// the memory went, as text (`report`), as a comparison of two runs (`diff`), as a picture
// (`plot`, an SVG written by hand), or as a batch-size plan (`plan`, once reports carry a
// planner profile).
//
// One implementation, two doors: the Bazel binary //tools:actpack (tools/actpack_main.cc) and
// the `actpack` console command of the pip package (actpack.cli -> actpack._C.run_cli, bound in
// torch_plugin/csrc/cli_bindings.cc). Both call RunCli.
//
// A report is read defensively: the schema name and version must match (anything else is a
// foreign file), every other section is optional, and a missing or ill-typed optional field is
// simply not shown. A report that grows new sections still reads.
//
// Usage:
//   absl::StatusOr<RunReport> report = LoadRunReport("run.json");
//   if (!report.ok()) return report.status();          // names the file and the problem
//   std::cout << FormatReportText(*report);
//   std::string svg = RenderMemorySvg(*report);
//
//   std::string out, err;
//   int exit_code = RunCli({"report", "run.json", "--json"}, &out, &err);
#ifndef ACTPACK_TOOLS_REPORT_H_
#define ACTPACK_TOOLS_REPORT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/json.h"

namespace actpack::tools {

// The schema a run report declares; RunCli reads exactly this name and version.
inline constexpr absl::string_view kReportSchema = "actpack.report";
inline constexpr int64_t kReportSchemaVersion = 1;

// Exit codes of RunCli: 0 done, 2 a usage error or a file that cannot be read as a report.
inline constexpr int kExitOk = 0;
inline constexpr int kExitBadInput = 2;

// ActivationTotals
//
// "activations.totals" of a report: every field optional, absent when the report lacks it.
struct ActivationTotals {
  std::optional<uint64_t> packed_raw_bytes;
  std::optional<uint64_t> packed_stored_bytes;
  std::optional<double> ratio;
  std::optional<uint64_t> kept_bytes;
  std::optional<uint64_t> reused_bytes;
  std::optional<uint64_t> packs;
  std::optional<uint64_t> unpacks;
  std::optional<uint64_t> exact_fallbacks;
  std::optional<uint64_t> peak_live_stored_bytes;
  std::optional<uint64_t> peak_live_raw_bytes;
};

// StepUsage
//
// One entry of "activations.steps": what autograd saved in a training step (raw) and what
// actpack held instead (packed buffers plus tensors kept as they are).
struct StepUsage {
  uint64_t saved_raw_bytes = 0;
  uint64_t stored_bytes = 0;
  std::optional<uint64_t> peak_live_raw_bytes;
  std::optional<uint64_t> peak_live_stored_bytes;
};

// ProducerUsage
//
// The saved tensors of one producer (the autograd node that saved them, such as
// "ConvolutionBackward0"), summed over the run. Until reports name modules, the producer is the
// best grouping of "who uses the memory". Kept tensors count as stored at their raw size (they
// stay in memory as they are); reused occurrences (the same storage saved twice) store nothing.
struct ProducerUsage {
  std::string producer;
  uint64_t saved_tensors = 0;  // distinct saved-tensor records (ordinals) of this producer
  uint64_t raw_bytes = 0;      // over the whole run
  uint64_t stored_bytes = 0;   // over the whole run
  std::vector<std::string> codecs;  // distinct codecs, in order of first appearance
};

// RunReport
//
// A validated run report: the parsed document plus the fields the CLI shows, extracted once.
struct RunReport {
  std::string file;  // the path it was read from, for messages
  json::Value document;

  // "run"
  std::optional<std::string> torch_version;
  std::optional<std::string> device;
  std::optional<std::string> budget_text;
  std::optional<uint64_t> budget_bytes;
  std::optional<std::string> codec;
  std::optional<uint64_t> peak_allocated_bytes;
  std::optional<double> wall_seconds;
  std::vector<std::string> warnings;

  // "activations"
  bool has_activations = false;
  std::optional<std::string> activation_codec;
  ActivationTotals totals;
  std::vector<StepUsage> steps;
  std::vector<ProducerUsage> producers;  // sorted by raw bytes, largest first

  // Steps the per-producer sums are averaged over: the number of steps, or 1 when unknown.
  uint64_t StepCountForAverages() const;
  // The file name without its directory, for titles.
  std::string FileName() const;
};

// ParseRunReport
//
// Validates `text` as a run report. Errors (each message starts with `file`):
//  - kDataLoss for an empty or truncated document;
//  - kInvalidArgument for text that is not JSON, JSON that is not an actpack report (no or
//    another "schema"), or an unsupported "schema_version".
absl::StatusOr<RunReport> ParseRunReport(absl::string_view text, absl::string_view file);

// LoadRunReport
//
// Reads and validates the file at `path`; kNotFound / kPermissionDenied / kInvalidArgument when
// it cannot be read, then as ParseRunReport.
absl::StatusOr<RunReport> LoadRunReport(const std::string& path);

// FormatReportText
//
// What `actpack report` prints: run metadata, budget and peak, activation bytes raw vs stored,
// the top `max_producers` consumers by producer with their codecs, and warnings.
std::string FormatReportText(const RunReport& report, size_t max_producers = 12);

// SummarizeReport
//
// What `actpack report --json` prints: a compact, stable summary ("actpack.report_summary",
// version 1) with the same facts as the text; absent facts are absent members.
json::Value SummarizeReport(const RunReport& report);

// FormatDiffText
//
// What `actpack diff a b` prints: run metadata that differs, peak, ratio, totals with their
// change, and stored bytes per step by producer (producers missing on one side are marked).
std::string FormatDiffText(const RunReport& before, const RunReport& after);

// RenderMemorySvg
//
// A standalone SVG (no scripts, no external fonts): per-step activation bytes saved raw vs
// stored as bars, the budget as a dashed line when the report has one, and per-producer
// horizontal bars of raw vs stored bytes per step. Axes are labelled in KiB/MiB/GiB.
std::string RenderMemorySvg(const RunReport& report);

// RunCli
//
// The whole command line, without the program name: {"report", "run.json"}, ... Writes what a
// terminal shows to `out` and `err` (files such as the SVG are written directly) and returns
// the exit code: kExitOk, or kExitBadInput with one line on `err` for a usage error (followed
// by the usage), an unreadable or foreign report, or a request the report cannot answer.
int RunCli(const std::vector<std::string>& args, std::string* out, std::string* err);

}  // namespace actpack::tools

#endif  // ACTPACK_TOOLS_REPORT_H_

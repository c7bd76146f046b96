// Reading a run report (report/FORMAT.md): the types the `actpack` CLI computes with
// (RunReport and its sections) and the reader that fills them from a document.
//
// A report is read defensively: the schema name and version must match (anything else is a
// foreign file), and every section is optional. In the older sections ("run", "activations")
// a missing or ill-typed field is simply not shown. The sections added after version 1 shipped
// ("planner", "allocator", a saved tensor's "module" and "error") are checked field by field
// when present: the CLI computes with them, so an ill-typed field there is an error naming its
// path ("planner.choices.quant2.per_sample_bytes is the string \"x\", expected ..."), never a
// silently wrong plan. A null section counts as absent. Members a report adds beyond these
// are ignored, so a report that grows new sections still reads.
//
// The writer (writer.h) validates every document it writes with ReadRunReport; the views are
// text.h (report, diff), plan.h, svg.h and snapshot.h, and cli.h is the command line.
//
// Usage:
//   absl::StatusOr<RunReport> report = LoadRunReport("run.json");
//   if (!report.ok()) return report.status();          // names the file and the problem
//   for (const ConsumerUsage& c : report->modules) ...
#ifndef ACTPACK_REPORT_READER_H_
#define ACTPACK_REPORT_READER_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/json.h"

namespace actpack::report {

// The schema a run report declares: the writer writes this name and version; the reader reads
// this name, at this version or an older one down to kOldestReportSchemaVersion (FORMAT.md).
inline constexpr absl::string_view kReportSchema = "actpack.report";
inline constexpr int64_t kReportSchemaVersion = 2;
inline constexpr int64_t kOldestReportSchemaVersion = 1;
// What version 1 named a saved tensor kept as it is; the reader reads it as kNotPacked.
inline constexpr absl::string_view kVersion1NotPacked = "kept";

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
  std::optional<uint64_t> steps;  // every step the run ended (a longer run lists only some)
};

// StepUsage
//
// One entry of "activations.steps": what autograd saved in a training step (raw) and what
// actpack held instead (packed buffers plus tensors kept as they are).
struct StepUsage {
  uint64_t index = 0;  // the step's number in the run ("step"; else its place in the list)
  uint64_t saved_raw_bytes = 0;
  uint64_t stored_bytes = 0;
  std::optional<uint64_t> peak_live_raw_bytes;
  std::optional<uint64_t> peak_live_stored_bytes;
  // The allocator's peaks over the step (everything, not only activations), when recorded.
  std::optional<uint64_t> peak_allocated_bytes;
  std::optional<uint64_t> peak_reserved_bytes;
  // The step's peak as the operating system (resident set) or the CUDA driver counts it.
  std::optional<uint64_t> system_peak_bytes;
};

// CodecError
//
// A saved tensor's "error": the decoded tensor against the original. A member is absent when
// the report has none or null there (the runtime's JSON writer turns NaN into null).
struct CodecError {
  std::optional<double> rms;
  std::optional<double> max_abs;
  std::optional<double> rel_rms;  // rms of the error / rms of the tensor
};

// ConsumerUsage
//
// The saved tensors of one consumer of memory, summed over the run: a producer (the autograd
// node that made them, such as "ConvolutionBackward0") or a module ("layer1.0.conv1"; a record
// without a module is grouped under its producer). Kept tensors count as stored at their raw
// size (they stay in memory as they are); reused occurrences (the same storage saved twice)
// store nothing.
struct ConsumerUsage {
  std::string name;
  uint64_t saved_tensors = 0;  // distinct saved-tensor records (ordinals)
  uint64_t raw_bytes = 0;      // over the whole run
  uint64_t stored_bytes = 0;   // over the whole run
  std::vector<std::string> codecs;  // distinct codecs, in order of first appearance
  // Member by member the largest over the records that report an error; absent when none does.
  std::optional<CodecError> worst_error;
};

// PlannerChoice
//
// One entry of "planner.choices": memory modelled as fixed + per_sample * batch for one codec
// choice ("none", "quant2", "auto", ...), and the batch size the planner chose at its budget.
struct PlannerChoice {
  std::string name;
  uint64_t fixed_bytes = 0;
  uint64_t per_sample_bytes = 0;
  uint64_t max_batch_size = 0;  // as recorded, at PlannerProfile::budget_bytes
  // The share of the budget its answer left free, as real steps under the cap measured it;
  // nullopt where the report does not say (PlannerProfile::headroom then).
  std::optional<double> headroom;
  // "gradients" (actpack.plan(gradients=True)): the worst parameter group's gradient cosine
  // against exact training, its name and how many groups fell below the plan's bound; nullopt
  // where not measured (auto, a step that does not repeat, older reports). A cosine of NaN
  // stands for a gradient that was not finite.
  std::optional<double> min_cosine;
  std::string worst_group;
  size_t groups_below_bound = 0;
};

// PlannerVerified
//
// "planner.verified": the real step the planner ran to check its answer.
struct PlannerVerified {
  std::string codec;
  uint64_t batch_size = 0;  // 0: no batch tried fitted the cap
  std::optional<uint64_t> peak_bytes;  // absent where nothing fitted
  uint64_t smallest_tried = 0;  // where nothing fitted: the smallest batch that ran out
};

// PlannerProfile
//
// The "planner" section: the budget it planned for, the batch sizes it profiled, one
// PlannerChoice per choice (in the report's order), and the verification step if it ran one.
struct PlannerProfile {
  uint64_t budget_bytes = 0;
  // The fraction of a budget kept free for fragmentation and memory outside the pool where a
  // choice does not say its own; a batch must fit budget * (1 - headroom). 0 when the report
  // does not say.
  double headroom = 0;
  // The bytes a batch of `choice` may use at `budget`: runtime::UsableBytes at the choice's
  // headroom, else the section's.
  uint64_t Usable(const PlannerChoice& choice, uint64_t budget) const;
  std::vector<uint64_t> batch_sizes;
  std::vector<PlannerChoice> choices;
  std::optional<PlannerVerified> verified;
};

// AllocatorUsage
//
// The "allocator" section: the backend that served the run, its budget, the counters of its
// torch.cuda.memory_stats-shaped "stats" that the CLI shows, and the size of its snapshot.
struct AllocatorUsage {
  std::string backend;  // "cpu" or "cuda"
  std::optional<uint64_t> budget_bytes;
  std::optional<uint64_t> peak_allocated_bytes;  // "allocated_bytes.all.peak"
  std::optional<uint64_t> peak_reserved_bytes;   // "reserved_bytes.all.peak"
  std::optional<uint64_t> num_alloc_retries;
  std::optional<uint64_t> num_ooms;
  bool has_snapshot = false;
  uint64_t snapshot_segments = 0;
  uint64_t snapshot_trace_entries = 0;  // over all devices

  // Peak reserved / peak allocated (1.0 = no memory cached beyond what tensors use); absent
  // without both peaks or when nothing was allocated.
  std::optional<double> Fragmentation() const;
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
  std::optional<uint64_t> peak_reserved_bytes;
  // The run's peak as the system counts it, and how it was counted.
  std::optional<uint64_t> peak_system_bytes;
  std::optional<std::string> system_memory;
  std::optional<double> wall_seconds;
  std::vector<std::string> warnings;

  // "activations"
  bool has_activations = false;
  std::optional<std::string> activation_codec;
  ActivationTotals totals;
  std::vector<StepUsage> steps;
  // Saved tensors grouped by producer, and by module when any record names one (else empty);
  // each sorted by raw bytes, largest first.
  std::vector<ConsumerUsage> producers;
  std::vector<ConsumerUsage> modules;

  std::optional<PlannerProfile> planner;    // "planner"
  std::optional<AllocatorUsage> allocator;  // "allocator"

  // The steps the run ended: totals.steps, else the steps listed (a report written before
  // totals counted them, when every step was listed).
  uint64_t StepCount() const;
  // Steps the per-consumer sums are averaged over: the number of steps, or 1 when unknown.
  uint64_t StepCountForAverages() const;
  // The file name without its directory, for titles.
  std::string FileName() const;
  // "allocator.snapshot" of the document, or nullptr when the report has none.
  const json::Value* Snapshot() const;
  // The consumers a report's tables and plot show: `modules` when the report names modules,
  // else `producers`; `*kind` is set to "module" or "producer".
  const std::vector<ConsumerUsage>& ShownConsumers(absl::string_view* kind) const;
};

// ParseRunReport
//
// Validates `text` as a run report. Errors (each message starts with `file`):
//  - kDataLoss for an empty or truncated document;
//  - kInvalidArgument for text that is not JSON, JSON that is not an actpack report (no or
//    another "schema"), an unsupported "schema_version", or an ill-typed field in a checked
//    section (see the file comment), naming its path, what it is and what was expected.
absl::StatusOr<RunReport> ParseRunReport(absl::string_view text, absl::string_view file);

// ReadRunReport
//
// ParseRunReport for a document already parsed (or built in memory): the same checks and
// messages, without the JSON text.
absl::StatusOr<RunReport> ReadRunReport(json::Value document, absl::string_view file);

// LoadRunReport
//
// Reads and validates the file at `path`; kNotFound / kPermissionDenied / kInvalidArgument when
// it cannot be read, then as ParseRunReport.
absl::StatusOr<RunReport> LoadRunReport(const std::string& path);

}  // namespace actpack::report

#endif  // ACTPACK_REPORT_READER_H_

// Writing the run report (report/FORMAT.md): the one place its envelope and its "activations"
// section are made, and where a document is validated before it reaches a file. The reader and
// the format's checks are reader.h (which this depends on, never the other way), the CLI is
// cli.h.
//
// Usage:
//   json::Value document = MakeRunReport(run_metadata, ActivationsSection(session.State()));
//   document["allocator"] = allocator_section;        // and "planner" from actpack.plan
//   absl::Status written = WriteRunReport(document, "run.json");
#ifndef ACTPACK_REPORT_WRITER_H_
#define ACTPACK_REPORT_WRITER_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "runtime/json.h"
#include "runtime/session.h"

namespace actpack::report {

// The "activations" section: the session's settings, policy, totals, steps and saved tensors.
json::Value ActivationsSection(const runtime::SessionState& state);

// The "allocator" section: the device ("cpu" or "cuda"), whose allocator served it (actpack's
// or torch's), its budget, its statistics under torch.cuda.memory_stats' names with the peaks
// over the whole run (a per-step restart of the counters hides them), and its snapshot (null
// when none was taken).
struct AllocatorRun {
  std::string backend;
  bool actpack = true;
  uint64_t budget_bytes = 0;
  json::Value stats = json::Value::object();
  std::optional<uint64_t> peak_allocated_bytes;  // absent: no step ran (null)
  std::optional<uint64_t> peak_reserved_bytes;
  json::Value snapshot;
};
json::Value AllocatorSection(AllocatorRun run);

// A run report's document: the envelope (schema, schema_version, actpack_version) around the
// run metadata and the activations section. The caller may add "allocator" and "planner".
json::Value MakeRunReport(json::Value run, json::Value activations);

// Validates `document` as ReadRunReport (reader.h) does and writes it to `path`, indented,
// ending with a newline. An invalid document is kInvalidArgument naming the problem, and
// nothing is written.
absl::Status WriteRunReport(const json::Value& document, const std::string& path);

}  // namespace actpack::report

#endif  // ACTPACK_REPORT_WRITER_H_

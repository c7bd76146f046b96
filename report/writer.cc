#include "report/writer.h"

#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "codecs/registry.h"
#include "common/version.h"
#include "report/files.h"
#include "report/reader.h"

namespace actpack::report {
namespace {

double Ratio(uint64_t raw, uint64_t stored) {
  return stored == 0 ? 0.0 : static_cast<double>(raw) / static_cast<double>(stored);
}

json::Value PolicySection(const runtime::SessionState& state) {
  const runtime::SessionOptions& options = state.options;
  const runtime::PolicyState& policy = state.policy;
  json::Value section = json::Value::object();
  section["budget_bytes"] = options.budget_bytes;
  section["headroom"] = options.headroom;
  section["profile_every"] = options.profile_every;
  json::Value ladder = json::Value::array();
  for (const codecs::CodecParams& params : options.ladder) {
    ladder.push_back(codecs::FormatCodecSpec(params));
  }
  section["ladder"] = std::move(ladder);
  section["plans"] = policy.plans;
  section["other_bytes"] = policy.other_bytes;
  section["outside_pool_bytes"] = policy.outside_pool_bytes;
  section["fragmentation"] = policy.fragmentation;
  section["projected_peak_bytes"] = policy.projected_peak;
  section["feasible"] = policy.feasible;
  section["smallest_feasible_budget"] = policy.smallest_feasible_budget;
  section["weighted_error"] = policy.weighted_error;
  section["sensitivity"] = state.gradient_sensitivity ? "gradient" : "uniform";
  section["pressure_events"] = policy.pressure_events;
  section["relieved_bytes"] = policy.relieved_bytes;
  if (options.allowed_loss_increase > 0) {
    section["allowed_loss_increase"] = options.allowed_loss_increase;
  }
  // The floor in force: the one given, or tightened after gradients ran away.
  if (policy.max_rel_rms > 0) section["max_rel_rms"] = policy.max_rel_rms;
  if (policy.floor_tightenings > 0) section["floor_tightenings"] = policy.floor_tightenings;
  if (options.allowed_loss_increase > 0 || policy.max_rel_rms > 0) {
    section["capped_candidates"] = policy.capped_candidates;
  }
  return section;
}

json::Value TotalsSection(const runtime::SessionTotals& totals) {
  json::Value section = json::Value::object();
  section["packed_raw_bytes"] = totals.packed_raw_bytes;
  section["packed_stored_bytes"] = totals.packed_stored_bytes;
  section["ratio"] = Ratio(totals.packed_raw_bytes, totals.packed_stored_bytes);
  section["kept_bytes"] = totals.kept_bytes;
  section["reused_bytes"] = totals.reused_bytes;
  section["packs"] = totals.packs;
  section["unpacks"] = totals.unpacks;
  section["exact_fallbacks"] = totals.exact_fallbacks;
  section["peak_live_stored_bytes"] = totals.peak_live_stored;
  section["peak_live_raw_bytes"] = totals.peak_live_raw;
  section["steps"] = totals.steps;
  return section;
}

json::Value StepEntry(const runtime::StepRecord& step) {
  json::Value entry = json::Value::object();
  entry["step"] = step.index;
  entry["peak_bytes"] = step.peak_bytes;
  entry["peak_reserved_bytes"] = step.peak_reserved_bytes;
  entry["system_peak_bytes"] = step.system_peak_bytes;
  entry["saved_raw_bytes"] = step.saved_raw_bytes;
  entry["stored_bytes"] = step.stored_bytes;
  entry["ratio"] = Ratio(step.saved_raw_bytes, step.stored_bytes);
  entry["peak_live_stored_bytes"] = step.peak_live_stored;
  entry["peak_live_raw_bytes"] = step.peak_live_raw;
  entry["automatic_bytes"] = step.automatic_bytes;
  entry["profiled"] = step.profiled;
  return entry;
}

json::Value SavedTensorEntry(const runtime::SavedRecord& record, const double* sensitivity) {
  json::Value entry = json::Value::object();
  entry["ordinal"] = record.ordinal;
  entry["producer"] = record.producer;
  if (!record.module.empty()) entry["module"] = record.module;
  if (record.assigned.automatic && sensitivity != nullptr) entry["sensitivity"] = *sensitivity;
  entry["shape"] = record.shape;
  entry["dtype"] = codecs::DTypeName(record.dtype);
  entry["codec"] = record.codec.empty() ? std::string("reused") : record.codec;
  entry["raw_bytes"] = record.raw_bytes;
  entry["stored_bytes"] = record.stored_bytes;
  entry["ratio"] = Ratio(record.raw_bytes, record.stored_bytes);
  entry["occurrences"] = record.occurrences;
  entry["reused"] = record.reused;
  if (!record.note.empty()) entry["note"] = record.note;
  if (record.reason != runtime::KeepReason::kNone) {
    entry["reason"] = std::string(runtime::KeepReasonCode(record.reason));
  }
  if (record.error.count > 0) {
    json::Value error = json::Value::object();
    error["rms"] = record.error.RmsError();
    error["max_abs"] = record.error.max_abs_error;
    error["rel_rms"] = std::sqrt(record.error.RelativeError());
    error["sampled_elements"] = record.error.count;
    entry["error"] = std::move(error);
  }
  if (std::isfinite(record.error_cap)) {
    json::Value cap = json::Value::object();
    cap["rel_rms"] = std::sqrt(record.error_cap);
    cap["rms"] = record.AllowedRms();
    cap["source"] = record.cap_source;
    entry["error_cap"] = std::move(cap);
  }
  if (record.assigned.automatic && !record.candidates.empty()) {
    json::Value candidates = json::Value::array();
    for (size_t i = 0; i < record.candidates.size(); ++i) {
      const runtime::PolicyCandidate& c = record.candidates[i];
      json::Value candidate = json::Value::object();
      candidate["codec"] = c.spec;
      candidate["bytes"] = c.bytes;
      if (std::isfinite(c.error)) candidate["rel_error"] = c.error;
      candidate["chosen"] = static_cast<int>(i) == record.choice;
      candidates.push_back(std::move(candidate));
    }
    entry["candidates"] = std::move(candidates);
  }
  return entry;
}

}  // namespace

json::Value ActivationsSection(const runtime::SessionState& state) {
  json::Value section = json::Value::object();
  section["codec"] = state.options.codec.Name();
  if (!state.options.rules.empty()) {
    json::Value rules = json::Value::array();
    for (const runtime::CodecRule& rule : state.options.rules) {
      rules.push_back(json::Value{{"pattern", rule.pattern}, {"codec", rule.choice.Name()}});
    }
    section["rules"] = std::move(rules);
  }
  section["policy"] = PolicySection(state);
  section["min_bytes"] = state.options.min_bytes;
  section["enabled"] = state.options.enabled;
  section["totals"] = TotalsSection(state.totals);
  json::Value steps = json::Value::array();
  for (const runtime::StepRecord& step : state.steps) steps.push_back(StepEntry(step));
  section["steps"] = std::move(steps);
  json::Value saved = json::Value::array();
  for (size_t i = 0; i < state.records.size(); ++i) {
    saved.push_back(SavedTensorEntry(
        state.records[i], state.gradient_sensitivity ? &state.sensitivity[i] : nullptr));
  }
  section["saved_tensors"] = std::move(saved);
  return section;
}

json::Value AllocatorSection(AllocatorRun run) {
  const auto or_null = [](std::optional<uint64_t> v) { return v ? json::Value(*v) : json::Value(); };
  run.stats["allocated_bytes.all.peak"] = or_null(run.peak_allocated_bytes);
  run.stats["reserved_bytes.all.peak"] = or_null(run.peak_reserved_bytes);
  json::Value section = json::Value::object();
  section["backend"] = std::move(run.backend);
  section["allocator"] = run.actpack ? "actpack" : "torch";
  section["budget_bytes"] = run.budget_bytes;
  section["stats"] = std::move(run.stats);
  section["snapshot"] = std::move(run.snapshot);
  return section;
}

json::Value MakeRunReport(json::Value run, json::Value activations) {
  json::Value document = json::Value::object();
  document["schema"] = std::string(kReportSchema);
  document["schema_version"] = kReportSchemaVersion;
  document["actpack_version"] = kVersion;
  document["run"] = std::move(run);
  document["activations"] = std::move(activations);
  return document;
}

absl::Status WriteRunReport(const json::Value& document, const std::string& path) {
  if (absl::StatusOr<RunReport> valid = ReadRunReport(document, path); !valid.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not writing an invalid run report: ", valid.status().message()));
  }
  return WriteFile(path, json::Serialize(document, 2) + "\n");
}

}  // namespace actpack::report

#include "report/text.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "allocator/units.h"
#include "report/text_util.h"

namespace actpack::report {
namespace {

using allocator::FormatBytes;

std::string Ratio(double ratio) { return absl::StrFormat("%.2fx", ratio); }

// raw / stored as "4.03x", or "-" when nothing was stored.
std::string RatioOf(uint64_t raw, uint64_t stored) {
  if (stored == 0) return "-";
  return Ratio(static_cast<double>(raw) / static_cast<double>(stored));
}

std::string SignedBytes(uint64_t before, uint64_t after) {
  if (before == after) return "=";
  const bool grew = after > before;
  std::string change =
      absl::StrCat(grew ? "+" : "-", FormatBytes(grew ? after - before : before - after));
  if (before != 0) {
    const double percent =
        (static_cast<double>(after) - static_cast<double>(before)) / static_cast<double>(before);
    absl::StrAppendFormat(&change, " (%+.1f%%)", percent * 100.0);
  }
  return change;
}

std::string SignedCount(uint64_t before, uint64_t after) {
  if (before == after) return "=";
  return after > before ? absl::StrCat("+", after - before) : absl::StrCat("-", before - after);
}

std::string OrUnknown(const std::optional<std::string>& text) {
  return text.value_or("(not recorded)");
}

std::string BytesOrUnknown(const std::optional<uint64_t>& bytes) {
  return bytes.has_value() ? FormatBytes(*bytes) : "(not recorded)";
}

std::string CountOrUnknown(const std::optional<uint64_t>& count) {
  return count.has_value() ? absl::StrCat(*count) : "(not recorded)";
}

std::string PeakText(const RunReport& report) {
  if (!report.peak_allocated_bytes.has_value()) {
    return "not recorded (no device statistics, e.g. a CPU run)";
  }
  return BytesOfBudget(*report.peak_allocated_bytes, report.budget_bytes);
}

std::string BudgetText(const RunReport& report) {
  if (report.budget_bytes.has_value()) {
    std::string text = FormatBytes(*report.budget_bytes);
    if (report.budget_text.has_value() && *report.budget_text != text) {
      absl::StrAppend(&text, " (", *report.budget_text, ")");
    }
    return text;
  }
  return OrUnknown(report.budget_text);
}

// The step that saved the most bytes, or nullptr when the report has no steps.
const StepUsage* LargestStep(const RunReport& report) {
  const StepUsage* largest = nullptr;
  for (const StepUsage& step : report.steps) {
    if (largest == nullptr || step.saved_raw_bytes > largest->saved_raw_bytes) largest = &step;
  }
  return largest;
}

std::string RawToStored(uint64_t raw, uint64_t stored) {
  return absl::StrCat(FormatBytes(raw), " raw -> ", FormatBytes(stored), " stored (",
                      RatioOf(raw, stored), ")");
}

// An error magnitude with three significant digits ("0.284", "1.2e-05"), "-" when absent.
std::string ErrorText(const std::optional<double>& value) {
  return value.has_value() ? absl::StrFormat("%.3g", *value) : "-";
}

std::string StepsText(uint64_t steps) {
  return absl::StrCat(steps, steps == 1 ? " step" : " steps");
}

// ---------------------------------------------------------------------------------------------
// Sections of the text shared by `report` and `diff`.

// The top `max_rows` consumers (by module or producer) with their bytes per step, codecs and,
// when any record reports one, their worst codec error.
std::string ConsumerTable(const RunReport& report, size_t max_rows) {
  absl::string_view kind;
  const std::vector<ConsumerUsage>& consumers = report.ShownConsumers(&kind);
  if (consumers.empty()) return "";
  const uint64_t steps = report.StepCountForAverages();
  const bool with_errors =
      std::any_of(consumers.begin(), consumers.end(),
                  [](const ConsumerUsage& c) { return c.worst_error.has_value(); });
  std::string text = absl::StrCat("\ntop consumers by ", kind,
                                  " (bytes per step, average over ", StepsText(steps));
  absl::StrAppend(&text, with_errors ? "; error: the worst saved tensor)\n" : ")\n");
  TextTable table(with_errors ? std::vector<size_t>{1, 2, 3, 4, 6, 7}
                              : std::vector<size_t>{1, 2, 3, 4});
  std::vector<std::string> header = {std::string(kind), "tensors", "raw", "stored", "ratio",
                                     "codec"};
  if (with_errors) {
    header.push_back("rel rms");
    header.push_back("max abs");
  }
  table.AddRow(std::move(header));
  const size_t shown = std::min(max_rows, consumers.size());
  for (size_t i = 0; i < shown; ++i) {
    const ConsumerUsage& c = consumers[i];
    std::vector<std::string> row = {c.name,
                                    absl::StrCat(c.saved_tensors),
                                    FormatBytes(c.raw_bytes / steps),
                                    FormatBytes(c.stored_bytes / steps),
                                    RatioOf(c.raw_bytes, c.stored_bytes),
                                    absl::StrJoin(c.codecs, "+")};
    if (with_errors) {
      const CodecError error = c.worst_error.value_or(CodecError{});
      row.push_back(ErrorText(error.rel_rms));
      row.push_back(ErrorText(error.max_abs));
    }
    table.AddRow(std::move(row));
  }
  absl::StrAppend(&text, table.Render());
  if (shown < consumers.size()) {
    uint64_t rest_raw = 0;
    for (size_t i = shown; i < consumers.size(); ++i) rest_raw += consumers[i].raw_bytes;
    absl::StrAppend(&text, "  (", consumers.size() - shown, " more ", kind, "s, ",
                    FormatBytes(rest_raw / steps), " raw per step)\n");
  }
  return text;
}

std::string PlannerSection(const RunReport& report) {
  const PlannerProfile& planner = *report.planner;
  std::string text =
      absl::StrCat("\nbatch-size planner (budget ", FormatBytes(planner.budget_bytes),
                   "; profiled batch sizes: ", JoinCounts(planner.batch_sizes), ")\n");
  const bool gradients = GradientsMeasured(planner);
  TextTable table({1, 2, 3, 4});
  std::vector<std::string> header = {"choice", "fixed", "per sample", "max batch"};
  if (gradients) header.push_back("grad cos");
  table.AddRow(header);
  for (const PlannerChoice& choice : planner.choices) {
    std::vector<std::string> row = {choice.name, FormatBytes(choice.fixed_bytes),
                                    FormatBytes(choice.per_sample_bytes),
                                    absl::StrCat(choice.max_batch_size)};
    if (gradients) row.push_back(GradientCosineText(choice));
    table.AddRow(row);
  }
  if (planner.choices.empty()) table.AddRow({"(no choices recorded)"});
  absl::StrAppend(&text, table.Render());
  absl::StrAppend(&text, GradientNotes(planner));
  absl::StrAppend(&text, "  verified: ", VerifiedText(planner), "\n");
  absl::StrAppend(&text, "  (actpack plan ", report.FileName(),
                  " --budget SIZE: the batch sizes at another budget)\n");
  return text;
}

std::string AllocatorSection(const RunReport& report) {
  const AllocatorUsage& allocator = *report.allocator;
  std::string text = absl::StrCat("\nallocator (", allocator.backend, ")\n");
  TextTable table;
  table.AddRow({"budget", allocator.budget_bytes.has_value()
                              ? FormatBytes(*allocator.budget_bytes)
                              : std::string("none")});
  table.AddRow({"peak allocated",
                allocator.peak_allocated_bytes.has_value()
                    ? BytesOfBudget(*allocator.peak_allocated_bytes, allocator.budget_bytes)
                    : "(not recorded)"});
  table.AddRow({"peak reserved",
                allocator.peak_reserved_bytes.has_value()
                    ? BytesOfBudget(*allocator.peak_reserved_bytes, allocator.budget_bytes)
                    : "(not recorded)"});
  const std::optional<double> fragmentation = allocator.Fragmentation();
  table.AddRow({"fragmentation",
                fragmentation.has_value()
                    ? absl::StrCat(Ratio(*fragmentation), " (reserved / allocated, at peak)")
                    : "(not recorded)"});
  table.AddRow({"alloc retries", CountOrUnknown(allocator.num_alloc_retries)});
  table.AddRow({"OOMs", CountOrUnknown(allocator.num_ooms)});
  table.AddRow({"snapshot",
                allocator.has_snapshot
                    ? absl::StrCat(allocator.snapshot_segments, " segments, ",
                                   allocator.snapshot_trace_entries,
                                   " trace entries (actpack snapshot ", report.FileName(),
                                   " -o snap.pickle)")
                    : "none"});
  absl::StrAppend(&text, table.Render());
  return text;
}

// Stored bytes per step of each consumer in `before` and `after`: those of `before` in its
// order, then those only `after` has.
std::string ConsumerDiff(absl::string_view kind, const std::vector<ConsumerUsage>& before,
                         uint64_t steps_before, const std::vector<ConsumerUsage>& after,
                         uint64_t steps_after) {
  std::string text = absl::StrCat("\nstored bytes per step by ", kind, "\n");
  TextTable table({1, 2});
  table.AddRow({std::string(kind), "before", "after", "change"});
  std::vector<std::string> names;
  for (const ConsumerUsage& c : before) names.push_back(c.name);
  for (const ConsumerUsage& c : after) {
    if (std::find(names.begin(), names.end(), c.name) == names.end()) names.push_back(c.name);
  }
  auto find = [](const std::vector<ConsumerUsage>& consumers,
                 const std::string& name) -> const ConsumerUsage* {
    for (const ConsumerUsage& c : consumers) {
      if (c.name == name) return &c;
    }
    return nullptr;
  };
  for (const std::string& name : names) {
    const ConsumerUsage* a = find(before, name);
    const ConsumerUsage* b = find(after, name);
    const uint64_t bytes_a = a ? a->stored_bytes / steps_before : 0;
    const uint64_t bytes_b = b ? b->stored_bytes / steps_after : 0;
    table.AddRow({name, a ? FormatBytes(bytes_a) : "(absent)",
                  b ? FormatBytes(bytes_b) : "(absent)",
                  a && b ? SignedBytes(bytes_a, bytes_b) : (a ? "only before" : "only after")});
  }
  absl::StrAppend(&text, table.Render());
  return text;
}

// The largest batch size per planner choice in `before` and `after`, each at its own budget.
std::string PlannerDiff(const RunReport& before, const RunReport& after) {
  auto budget = [](const RunReport& report) {
    return report.planner ? FormatBytes(report.planner->budget_bytes) : "no planner profile";
  };
  std::string text =
      absl::StrCat("\nplanner: largest batch size by choice (before: ", budget(before),
                   ", after: ", budget(after), ")\n");
  TextTable table({1, 2});
  table.AddRow({"choice", "before", "after", "change"});
  std::vector<std::string> names;
  for (const RunReport* report : {&before, &after}) {
    if (!report->planner) continue;
    for (const PlannerChoice& choice : report->planner->choices) {
      if (std::find(names.begin(), names.end(), choice.name) == names.end()) {
        names.push_back(choice.name);
      }
    }
  }
  auto find = [](const RunReport& report, const std::string& name) -> const PlannerChoice* {
    if (!report.planner) return nullptr;
    for (const PlannerChoice& choice : report.planner->choices) {
      if (choice.name == name) return &choice;
    }
    return nullptr;
  };
  for (const std::string& name : names) {
    const PlannerChoice* a = find(before, name);
    const PlannerChoice* b = find(after, name);
    table.AddRow({name, a ? absl::StrCat(a->max_batch_size) : "(absent)",
                  b ? absl::StrCat(b->max_batch_size) : "(absent)",
                  a && b ? SignedCount(a->max_batch_size, b->max_batch_size)
                         : (a ? "only before" : "only after")});
  }
  absl::StrAppend(&text, table.Render());
  return text;
}

json::Value ConsumersJson(const std::vector<ConsumerUsage>& consumers, absl::string_view kind,
                          uint64_t steps) {
  json::Value list = json::Value::array();
  for (const ConsumerUsage& c : consumers) {
    json::Value entry = json::Value::object();
    entry[std::string(kind)] = c.name;
    entry["saved_tensors"] = c.saved_tensors;
    entry["raw_bytes_per_step"] = c.raw_bytes / steps;
    entry["stored_bytes_per_step"] = c.stored_bytes / steps;
    json::Value codecs = json::Value::array();
    for (const std::string& codec : c.codecs) codecs.emplace_back(codec);
    entry["codecs"] = std::move(codecs);
    if (c.worst_error.has_value()) {
      json::Value error = json::Value::object();
      const CodecError& e = *c.worst_error;
      for (const auto& [name, value] : {std::pair{"rms", &e.rms}, std::pair{"max_abs", &e.max_abs},
                                        std::pair{"rel_rms", &e.rel_rms}}) {
        error[name] = value->has_value() ? json::Value(**value) : json::Value();
      }
      entry["worst_error"] = std::move(error);
    }
    list.emplace_back(std::move(entry));
  }
  return list;
}

}  // namespace

std::string FormatReportText(const RunReport& report, size_t max_consumers) {
  std::string text = absl::StrCat("actpack run report: ", report.FileName(), "\n\nrun\n");
  TextTable run;
  run.AddRow({"torch", OrUnknown(report.torch_version)});
  run.AddRow({"device", OrUnknown(report.device)});
  run.AddRow({"codec", OrUnknown(report.codec)});
  run.AddRow({"budget", BudgetText(report)});
  run.AddRow({"peak allocated", PeakText(report)});
  if (report.peak_reserved_bytes.has_value()) {
    run.AddRow({"peak reserved (what the cap counts)",
                BytesOfBudget(*report.peak_reserved_bytes, report.budget_bytes)});
  }
  if (report.peak_system_bytes.has_value()) {
    run.AddRow({absl::StrCat("peak, system's count (",
                             report.system_memory.value_or("system"), ")"),
                BytesOfBudget(*report.peak_system_bytes, report.budget_bytes)});
  }
  if (report.wall_seconds.has_value()) {
    run.AddRow({"wall time", absl::StrFormat("%.2f s", *report.wall_seconds)});
  }
  absl::StrAppend(&text, run.Render());

  if (report.has_activations) {
    absl::StrAppend(&text, "\nactivations (codec ",
                    report.activation_codec.value_or(report.codec.value_or("?")), ", ",
                    StepsText(report.StepCount()), ")\n");
    TextTable activations;
    if (const StepUsage* step = LargestStep(report)) {
      activations.AddRow({"saved per step (largest)",
                          RawToStored(step->saved_raw_bytes, step->stored_bytes)});
    }
    const ActivationTotals& t = report.totals;
    if (t.peak_live_raw_bytes.has_value() && t.peak_live_stored_bytes.has_value()) {
      activations.AddRow({"packed, live at peak",
                          RawToStored(*t.peak_live_raw_bytes, *t.peak_live_stored_bytes)});
    }
    if (t.packed_raw_bytes.has_value() && t.packed_stored_bytes.has_value()) {
      std::string packed = RawToStored(*t.packed_raw_bytes, *t.packed_stored_bytes);
      if (t.packs.has_value()) absl::StrAppend(&packed, ", ", *t.packs, " packs");
      if (t.unpacks.has_value()) absl::StrAppend(&packed, ", ", *t.unpacks, " unpacks");
      activations.AddRow({"packed over the run", packed});
    }
    if (t.kept_bytes.has_value()) {
      activations.AddRow({"kept as they are (run)", FormatBytes(*t.kept_bytes)});
    }
    if (t.reused_bytes.has_value()) {
      activations.AddRow({"reused, saved twice (run)", FormatBytes(*t.reused_bytes)});
    }
    if (t.exact_fallbacks.has_value()) {
      activations.AddRow({"exact fallbacks", absl::StrCat(*t.exact_fallbacks)});
    }
    absl::StrAppend(&text, activations.Render());
  }

  absl::StrAppend(&text, ConsumerTable(report, max_consumers));
  if (report.planner.has_value()) absl::StrAppend(&text, PlannerSection(report));
  if (report.allocator.has_value()) absl::StrAppend(&text, AllocatorSection(report));

  absl::StrAppend(&text, "\nwarnings\n");
  if (report.warnings.empty()) absl::StrAppend(&text, "  none\n");
  for (const std::string& warning : report.warnings) absl::StrAppend(&text, "  ", warning, "\n");
  return text;
}

json::Value SummarizeReport(const RunReport& report) {
  json::Value summary = json::Value::object();
  summary["schema"] = "actpack.report_summary";
  summary["schema_version"] = 1;
  summary["file"] = report.file;

  json::Value run = json::Value::object();
  if (report.torch_version) (run["torch"] = *report.torch_version);
  if (report.device) (run["device"] = *report.device);
  if (report.codec) (run["codec"] = *report.codec);
  if (report.budget_text) (run["budget"] = *report.budget_text);
  if (report.budget_bytes) (run["budget_bytes"] = *report.budget_bytes);
  run["peak_allocated_bytes"] = OptionalJson(report.peak_allocated_bytes);
  run["peak_reserved_bytes"] = OptionalJson(report.peak_reserved_bytes);
  run["peak_system_bytes"] = OptionalJson(report.peak_system_bytes);
  if (report.wall_seconds) (run["wall_seconds"] = *report.wall_seconds);
  summary["run"] = std::move(run);

  if (report.has_activations) {
    json::Value activations = json::Value::object();
    if (report.activation_codec) (activations["codec"] = *report.activation_codec);
    activations["steps"] = report.StepCount();
    if (const StepUsage* step = LargestStep(report)) {
      json::Value largest = json::Value::object();
      largest["saved_raw_bytes"] = step->saved_raw_bytes;
      largest["stored_bytes"] = step->stored_bytes;
      largest["ratio"] =
          step->stored_bytes == 0
              ? json::Value()
              : json::Value(static_cast<double>(step->saved_raw_bytes) / step->stored_bytes);
      activations["largest_step"] = std::move(largest);
    }
    json::Value totals = json::Value::object();
    const ActivationTotals& t = report.totals;
    const std::pair<const char*, const std::optional<uint64_t>*> counters[] = {
        {"packed_raw_bytes", &t.packed_raw_bytes},
        {"packed_stored_bytes", &t.packed_stored_bytes},
        {"kept_bytes", &t.kept_bytes},
        {"reused_bytes", &t.reused_bytes},
        {"packs", &t.packs},
        {"unpacks", &t.unpacks},
        {"exact_fallbacks", &t.exact_fallbacks},
        {"peak_live_stored_bytes", &t.peak_live_stored_bytes},
        {"peak_live_raw_bytes", &t.peak_live_raw_bytes},
    };
    for (const auto& [name, value] : counters) {
      if (value->has_value()) (totals[name] = **value);
    }
    if (t.ratio) (totals["ratio"] = *t.ratio);
    activations["totals"] = std::move(totals);
    summary["activations"] = std::move(activations);
  }

  const uint64_t steps = report.StepCountForAverages();
  summary["producers"] = ConsumersJson(report.producers, "producer", steps);
  if (!report.modules.empty()) {
    summary["modules"] = ConsumersJson(report.modules, "module", steps);
  }

  if (report.planner.has_value()) {
    const PlannerProfile& p = *report.planner;
    json::Value planner = json::Value::object();
    planner["budget_bytes"] = p.budget_bytes;
    planner["batch_sizes"] = CountArray(p.batch_sizes);
    json::Value choices = json::Value::object();
    for (const PlannerChoice& choice : p.choices) {
      json::Value entry = json::Value::object();
      entry["fixed_bytes"] = choice.fixed_bytes;
      entry["per_sample_bytes"] = choice.per_sample_bytes;
      entry["max_batch_size"] = choice.max_batch_size;
      choices[choice.name] = std::move(entry);
    }
    planner["choices"] = std::move(choices);
    planner["verified"] = VerifiedJson(p);
    summary["planner"] = std::move(planner);
  }

  if (report.allocator.has_value()) {
    const AllocatorUsage& a = *report.allocator;
    json::Value allocator = json::Value::object();
    allocator["backend"] = a.backend;
    allocator["budget_bytes"] = OptionalJson(a.budget_bytes);
    allocator["peak_allocated_bytes"] = OptionalJson(a.peak_allocated_bytes);
    allocator["peak_reserved_bytes"] = OptionalJson(a.peak_reserved_bytes);
    const std::optional<double> fragmentation = a.Fragmentation();
    allocator["fragmentation"] =
        fragmentation.has_value() ? json::Value(*fragmentation) : json::Value();
    allocator["num_alloc_retries"] = OptionalJson(a.num_alloc_retries);
    allocator["num_ooms"] = OptionalJson(a.num_ooms);
    if (a.has_snapshot) {
      json::Value snapshot = json::Value::object();
      snapshot["segments"] = a.snapshot_segments;
      snapshot["trace_entries"] = a.snapshot_trace_entries;
      allocator["snapshot"] = std::move(snapshot);
    } else {
      allocator["snapshot"] = json::Value();
    }
    summary["allocator"] = std::move(allocator);
  }

  json::Value warnings = json::Value::array();
  for (const std::string& warning : report.warnings) warnings.emplace_back(warning);
  summary["warnings"] = std::move(warnings);
  return summary;
}

std::string FormatDiffText(const RunReport& before, const RunReport& after) {
  std::string text =
      absl::StrCat("actpack diff: ", before.FileName(), " -> ", after.FileName(), "\n\n");
  TextTable table;
  table.AddRow({"", "before", "after", "change"});
  auto add_text = [&](absl::string_view label, const std::optional<std::string>& a,
                      const std::optional<std::string>& b) {
    if (!a.has_value() && !b.has_value()) return;
    table.AddRow({std::string(label), OrUnknown(a), OrUnknown(b), a == b ? "=" : "changed"});
  };
  auto add_bytes = [&](absl::string_view label, const std::optional<uint64_t>& a,
                       const std::optional<uint64_t>& b) {
    if (!a.has_value() && !b.has_value()) return;
    table.AddRow({std::string(label), BytesOrUnknown(a), BytesOrUnknown(b),
                  a && b ? SignedBytes(*a, *b) : ""});
  };
  auto add_count = [&](absl::string_view label, const std::optional<uint64_t>& a,
                       const std::optional<uint64_t>& b) {
    if (!a.has_value() && !b.has_value()) return;
    table.AddRow({std::string(label), CountOrUnknown(a), CountOrUnknown(b),
                  a && b ? SignedCount(*a, *b) : ""});
  };
  auto add_ratio = [&](absl::string_view label, const std::optional<double>& a,
                       const std::optional<double>& b) {
    if (!a.has_value() && !b.has_value()) return;
    std::string change;
    if (a && b && *a > 0) {
      change = Ratio(*a) == Ratio(*b) ? "=" : absl::StrFormat("%+.1f%%", (*b / *a - 1.0) * 100.0);
    }
    table.AddRow({std::string(label), a ? Ratio(*a) : "(not recorded)",
                  b ? Ratio(*b) : "(not recorded)", change});
  };
  auto packed_ratio = [](const ActivationTotals& t) -> std::optional<double> {
    if (t.packed_raw_bytes && t.packed_stored_bytes && *t.packed_stored_bytes > 0) {
      return static_cast<double>(*t.packed_raw_bytes) / *t.packed_stored_bytes;
    }
    return t.ratio;
  };

  add_text("torch", before.torch_version, after.torch_version);
  add_text("device", before.device, after.device);
  add_text("codec", before.codec, after.codec);
  add_bytes("budget", before.budget_bytes, after.budget_bytes);
  add_bytes("peak allocated", before.peak_allocated_bytes, after.peak_allocated_bytes);
  add_ratio("packed ratio", packed_ratio(before.totals), packed_ratio(after.totals));
  const StepUsage* step_a = LargestStep(before);
  const StepUsage* step_b = LargestStep(after);
  auto step_field = [](const StepUsage* step, uint64_t StepUsage::*field) {
    return step == nullptr ? std::nullopt : std::optional<uint64_t>(step->*field);
  };
  add_bytes("saved raw per step (largest)", step_field(step_a, &StepUsage::saved_raw_bytes),
            step_field(step_b, &StepUsage::saved_raw_bytes));
  add_bytes("stored per step (largest)", step_field(step_a, &StepUsage::stored_bytes),
            step_field(step_b, &StepUsage::stored_bytes));
  const ActivationTotals& a = before.totals;
  const ActivationTotals& b = after.totals;
  add_bytes("packed live at peak, raw", a.peak_live_raw_bytes, b.peak_live_raw_bytes);
  add_bytes("packed live at peak, stored", a.peak_live_stored_bytes, b.peak_live_stored_bytes);
  add_bytes("packed raw (run)", a.packed_raw_bytes, b.packed_raw_bytes);
  add_bytes("packed stored (run)", a.packed_stored_bytes, b.packed_stored_bytes);
  add_bytes("kept (run)", a.kept_bytes, b.kept_bytes);
  add_bytes("reused (run)", a.reused_bytes, b.reused_bytes);
  add_count("packs", a.packs, b.packs);
  add_count("unpacks", a.unpacks, b.unpacks);
  add_count("exact fallbacks", a.exact_fallbacks, b.exact_fallbacks);
  add_count("steps", before.StepCount(), after.StepCount());
  // Allocator counters: rows appear when either report has an allocator section.
  auto allocator_field = [](const RunReport& report,
                            std::optional<uint64_t> AllocatorUsage::*field) {
    return report.allocator ? (*report.allocator).*field : std::nullopt;
  };
  add_bytes("allocator peak allocated",
            allocator_field(before, &AllocatorUsage::peak_allocated_bytes),
            allocator_field(after, &AllocatorUsage::peak_allocated_bytes));
  add_bytes("allocator peak reserved",
            allocator_field(before, &AllocatorUsage::peak_reserved_bytes),
            allocator_field(after, &AllocatorUsage::peak_reserved_bytes));
  auto fragmentation = [](const RunReport& report) {
    return report.allocator ? report.allocator->Fragmentation() : std::nullopt;
  };
  add_ratio("fragmentation", fragmentation(before), fragmentation(after));
  add_count("alloc retries", allocator_field(before, &AllocatorUsage::num_alloc_retries),
            allocator_field(after, &AllocatorUsage::num_alloc_retries));
  add_count("OOMs", allocator_field(before, &AllocatorUsage::num_ooms),
            allocator_field(after, &AllocatorUsage::num_ooms));
  add_count("warnings", before.warnings.size(), after.warnings.size());
  absl::StrAppend(&text, table.Render());

  if (before.planner || after.planner) absl::StrAppend(&text, PlannerDiff(before, after));
  // By module when either report names modules; a report without module names then lists its
  // consumers by producer, which show as on one side only.
  absl::string_view kind_before;
  absl::string_view kind_after;
  const std::vector<ConsumerUsage>& consumers_before = before.ShownConsumers(&kind_before);
  const std::vector<ConsumerUsage>& consumers_after = after.ShownConsumers(&kind_after);
  if (!consumers_before.empty() || !consumers_after.empty()) {
    const absl::string_view kind =
        kind_before == "module" || kind_after == "module" ? "module" : "producer";
    absl::StrAppend(&text, ConsumerDiff(kind, consumers_before, before.StepCountForAverages(),
                                        consumers_after, after.StepCountForAverages()));
  }
  return text;
}

}  // namespace actpack::report

#include "report/report.h"

#include "report/writer.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <utility>

#include "CLI/CLI.hpp"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "allocator/units.h"
#include "common/version.h"
#include "runtime/config.h"

namespace actpack::report {
namespace {

using allocator::FormatBytes;

// ---------------------------------------------------------------------------------------------
// Reading the older sections: typed lookups that answer "absent" for a missing or ill-typed
// member.

std::optional<uint64_t> FindBytes(const json::Value* object, absl::string_view key) {
  if (object == nullptr) return std::nullopt;
  const json::Value* value = json::Find(*object, key);
  if (value == nullptr || !value->is_number()) return std::nullopt;
  if (json::IsInt(*value)) {
    if (value->get<int64_t>() < 0) return std::nullopt;
    return static_cast<uint64_t>(value->get<int64_t>());
  }
  const double d = value->get<double>();
  if (!std::isfinite(d) || d < 0 || d >= 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(d);
}

std::optional<double> FindDouble(const json::Value* object, absl::string_view key) {
  if (object == nullptr) return std::nullopt;
  const json::Value* value = json::Find(*object, key);
  if (value == nullptr || !value->is_number()) return std::nullopt;
  return value->get<double>();
}

std::optional<std::string> FindString(const json::Value* object, absl::string_view key) {
  if (object == nullptr) return std::nullopt;
  const json::Value* value = json::Find(*object, key);
  if (value == nullptr || !value->is_string()) return std::nullopt;
  return value->get_ref<const std::string&>();
}

const json::Value* FindObject(const json::Value* object, absl::string_view key) {
  if (object == nullptr) return nullptr;
  const json::Value* value = json::Find(*object, key);
  return value != nullptr && value->is_object() ? value : nullptr;
}

ActivationTotals ReadTotals(const json::Value* totals) {
  ActivationTotals t;
  t.packed_raw_bytes = FindBytes(totals, "packed_raw_bytes");
  t.packed_stored_bytes = FindBytes(totals, "packed_stored_bytes");
  t.ratio = FindDouble(totals, "ratio");
  t.kept_bytes = FindBytes(totals, "kept_bytes");
  t.reused_bytes = FindBytes(totals, "reused_bytes");
  t.packs = FindBytes(totals, "packs");
  t.unpacks = FindBytes(totals, "unpacks");
  t.exact_fallbacks = FindBytes(totals, "exact_fallbacks");
  t.peak_live_stored_bytes = FindBytes(totals, "peak_live_stored_bytes");
  t.peak_live_raw_bytes = FindBytes(totals, "peak_live_raw_bytes");
  t.steps = FindBytes(totals, "steps");
  return t;
}

std::vector<StepUsage> ReadSteps(const json::Value* activations) {
  std::vector<StepUsage> steps;
  const json::Value* list = activations == nullptr ? nullptr : json::Find(*activations, "steps");
  if (list == nullptr) return steps;
  for (const json::Value& entry : *list) {
    const std::optional<uint64_t> raw = FindBytes(&entry, "saved_raw_bytes");
    const std::optional<uint64_t> stored = FindBytes(&entry, "stored_bytes");
    if (!raw.has_value() || !stored.has_value()) continue;
    StepUsage step;
    step.index = FindBytes(&entry, "step").value_or(steps.size());
    step.saved_raw_bytes = *raw;
    step.stored_bytes = *stored;
    step.peak_live_raw_bytes = FindBytes(&entry, "peak_live_raw_bytes");
    step.peak_live_stored_bytes = FindBytes(&entry, "peak_live_stored_bytes");
    // 0: not measured (a run without an allocator to read).
    const std::optional<uint64_t> allocated = FindBytes(&entry, "peak_bytes");
    const std::optional<uint64_t> reserved = FindBytes(&entry, "peak_reserved_bytes");
    const std::optional<uint64_t> system = FindBytes(&entry, "system_peak_bytes");
    if (allocated.value_or(0) > 0) step.peak_allocated_bytes = allocated;
    if (reserved.value_or(0) > 0) step.peak_reserved_bytes = reserved;
    if (system.value_or(0) > 0) step.system_peak_bytes = system;
    steps.push_back(step);
  }
  return steps;
}

void FoldWorst(std::optional<double>& worst, std::optional<double> value) {
  if (value.has_value() && (!worst.has_value() || *value > *worst)) worst = value;
}

// Groups "saved_tensors" by module (falling back to the producer) or by producer. A kept
// tensor stays in memory at its raw size; a reused occurrence points at an earlier buffer and
// stores nothing more.
std::vector<ConsumerUsage> GroupSavedTensors(const json::Value* activations, bool by_module) {
  std::vector<ConsumerUsage> consumers;
  const json::Value* list =
      activations == nullptr ? nullptr : json::Find(*activations, "saved_tensors");
  if (list == nullptr) return consumers;
  std::map<std::string, size_t> index;
  for (const json::Value& entry : *list) {
    const std::optional<uint64_t> raw = FindBytes(&entry, "raw_bytes");
    if (!raw.has_value()) continue;
    const std::string producer = FindString(&entry, "producer").value_or("(unknown)");
    const std::string name =
        by_module ? FindString(&entry, "module").value_or(producer) : producer;
    const std::string codec = FindString(&entry, "codec").value_or("(unknown)");
    const uint64_t occurrences = FindBytes(&entry, "occurrences").value_or(1);
    const uint64_t reused = std::min(FindBytes(&entry, "reused").value_or(0), occurrences);
    const uint64_t stored_each = FindBytes(&entry, "stored_bytes").value_or(0);

    auto [it, inserted] = index.emplace(name, consumers.size());
    if (inserted) {
      consumers.emplace_back();
      consumers.back().name = name;
    }
    ConsumerUsage& usage = consumers[it->second];
    ++usage.saved_tensors;
    usage.raw_bytes += *raw * occurrences;
    usage.stored_bytes +=
        codec == "kept" ? *raw * occurrences : stored_each * (occurrences - reused);
    if (std::find(usage.codecs.begin(), usage.codecs.end(), codec) == usage.codecs.end()) {
      usage.codecs.push_back(codec);
    }
    if (const json::Value* error = FindObject(&entry, "error")) {
      if (!usage.worst_error.has_value()) usage.worst_error.emplace();
      FoldWorst(usage.worst_error->rms, FindDouble(error, "rms"));
      FoldWorst(usage.worst_error->max_abs, FindDouble(error, "max_abs"));
      FoldWorst(usage.worst_error->rel_rms, FindDouble(error, "rel_rms"));
    }
  }
  std::stable_sort(consumers.begin(), consumers.end(),
                   [](const ConsumerUsage& a, const ConsumerUsage& b) {
                     return a.raw_bytes > b.raw_bytes;
                   });
  return consumers;
}

bool AnyRecordNamesModule(const json::Value* activations) {
  const json::Value* list =
      activations == nullptr ? nullptr : json::Find(*activations, "saved_tensors");
  if (list == nullptr) return false;
  for (const json::Value& entry : *list) {
    if (FindString(&entry, "module").has_value()) return true;
  }
  return false;
}

absl::Status ReadError(absl::string_view file, int error_number) {
  const std::string message = absl::StrCat(file, ": cannot read: ", std::strerror(error_number));
  if (error_number == ENOENT) return absl::NotFoundError(message);
  if (error_number == EACCES) return absl::PermissionDeniedError(message);
  return absl::InvalidArgumentError(message);
}

// ---------------------------------------------------------------------------------------------
// Reading the checked sections ("planner", "allocator", a saved tensor's "module" and "error").

// A member's path for messages: "planner.choices.quant2", or allocator.stats["a.b"] when the
// key is not a plain identifier (stat names have dots; choice names are free text).
std::string MemberPath(absl::string_view parent, absl::string_view key) {
  const bool plain = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_';
  });
  if (plain) return absl::StrCat(parent, ".", key);
  return absl::StrCat(parent, "[", json::Serialize(json::Value(key), 0), "]");
}

std::string ElementPath(absl::string_view parent, size_t index) {
  return absl::StrCat(parent, "[", index, "]");
}

// What a value is, in a few words on one line: `the string "x"`, `the number -3`, `an array`.
std::string Describe(const json::Value& value) {
  switch (value.type()) {
    case json::Value::value_t::null:
      return "null";
    case json::Value::value_t::boolean:
      return value.get<bool>() ? "true" : "false";
    case json::Value::value_t::number_integer:
    case json::Value::value_t::number_unsigned:
    case json::Value::value_t::number_float:
      return absl::StrCat("the number ", json::Serialize(value, 0));
    case json::Value::value_t::string: {
      std::string quoted = json::Serialize(value, 0);  // escapes control characters
      constexpr size_t kMaxShown = 40;
      if (quoted.size() > kMaxShown + 2) {
        size_t cut = kMaxShown;
        // Never inside a UTF-8 sequence, so that the message stays valid UTF-8.
        while (cut > 0 && (static_cast<unsigned char>(quoted[cut]) & 0xC0) == 0x80) --cut;
        quoted = absl::StrCat(quoted.substr(0, cut), "...\"");
      }
      return absl::StrCat("the string ", quoted);
    }
    case json::Value::value_t::array:
      return "an array";
    case json::Value::value_t::object:
      return "an object";
    default:  // binary and discarded: never in parsed text
      return "a value";
  }
}

// Reads the fields of a checked section. The first problem is kept and every read after it
// answers a default, so a reader reads straight through and asks status() at the end.
class FieldChecker {
 public:
  const absl::Status& status() const { return status_; }

  void Fail(absl::string_view path, const json::Value* value, absl::string_view expected) {
    if (!status_.ok()) return;
    status_ = absl::InvalidArgumentError(
        value == nullptr ? absl::StrCat(path, " is missing, expected ", expected)
                         : absl::StrCat(path, " is ", Describe(*value), ", expected ", expected));
  }

  // A non-negative integer (the runtime writes byte counts and sizes as exact integers).
  uint64_t Count(const json::Value* value, absl::string_view path) {
    if (value == nullptr || !json::IsInt(*value) || value->get<int64_t>() < 0) {
      Fail(path, value, "a non-negative integer");
      return 0;
    }
    return static_cast<uint64_t>(value->get<int64_t>());
  }
  uint64_t Count(const json::Value& object, absl::string_view key, absl::string_view parent) {
    return Count(json::Find(object, key), MemberPath(parent, key));
  }
  // As Count, but absent and null read as nullopt.
  std::optional<uint64_t> CountOrNull(const json::Value& object, absl::string_view key,
                                      absl::string_view parent) {
    const json::Value* value = json::Find(object, key);
    if (value == nullptr || value->is_null()) return std::nullopt;
    return Count(value, MemberPath(parent, key));
  }
  // A non-negative number; absent and null read as nullopt.
  std::optional<double> MagnitudeOrNull(const json::Value& object, absl::string_view key,
                                        absl::string_view parent) {
    const json::Value* value = json::Find(object, key);
    if (value == nullptr || value->is_null()) return std::nullopt;
    if (!value->is_number() || value->get<double>() < 0) {
      Fail(MemberPath(parent, key), value, "a non-negative number or null");
      return std::nullopt;
    }
    return value->get<double>();
  }
  // A share in [0, 1), or nullopt when absent or null.
  std::optional<double> FractionOrNull(const json::Value& object, absl::string_view key,
                                       absl::string_view parent) {
    const std::optional<double> value = MagnitudeOrNull(object, key, parent);
    if (value.has_value() && *value >= 1) {
      Fail(MemberPath(parent, key), json::Find(object, key), "a fraction below 1");
      return std::nullopt;
    }
    return value;
  }
  std::string String(const json::Value& object, absl::string_view key, absl::string_view parent) {
    const json::Value* value = json::Find(object, key);
    if (value == nullptr || !value->is_string()) {
      Fail(MemberPath(parent, key), value, "a string");
      return "";
    }
    return value->get_ref<const std::string&>();
  }
  // The member if it is an array / an object, else nullptr after a Fail.
  const json::Value* Array(const json::Value& object, absl::string_view key,
                           absl::string_view parent) {
    return Typed(object, key, parent, &json::Value::is_array, "an array");
  }
  const json::Value* Object(const json::Value& object, absl::string_view key,
                            absl::string_view parent) {
    return Typed(object, key, parent, &json::Value::is_object, "an object");
  }

 private:
  const json::Value* Typed(const json::Value& object, absl::string_view key,
                           absl::string_view parent, bool (json::Value::*is_type)() const,
                           absl::string_view expected) {
    const json::Value* value = json::Find(object, key);
    if (value == nullptr || !(value->*is_type)()) {
      Fail(MemberPath(parent, key), value, expected);
      return nullptr;
    }
    return value;
  }

  absl::Status status_;
};

// A checked section of the document: nullptr when absent or null; a Fail when not an object.
const json::Value* FindSection(const json::Value& document, absl::string_view key,
                               FieldChecker& check) {
  const json::Value* section = json::Find(document, key);
  if (section == nullptr || section->is_null()) return nullptr;
  if (!section->is_object()) {
    check.Fail(key, section, "an object or null");
    return nullptr;
  }
  return section;
}

// A choice's "gradients" (null or absent: not measured) into `choice`.
void ReadGradients(FieldChecker& check, const json::Value& entry, const std::string& path,
                   PlannerChoice* choice) {
  const json::Value* gradients = json::Find(entry, "gradients");
  if (gradients == nullptr || gradients->is_null()) return;
  const std::string at = absl::StrCat(path, ".gradients");
  if (!gradients->is_object()) {
    check.Fail(at, gradients, "an object with min_cosine, worst_group and below_bound, or null");
    return;
  }
  const json::Value* cosine = json::Find(*gradients, "min_cosine");
  if (cosine != nullptr && cosine->is_number() && cosine->get<double>() >= -1 &&
      cosine->get<double>() <= 1) {
    choice->min_cosine = cosine->get<double>();
  } else if (cosine != nullptr && cosine->is_null()) {
    choice->min_cosine = std::nan("");  // a gradient that was not finite
  } else {
    check.Fail(absl::StrCat(at, ".min_cosine"), cosine, "a cosine in [-1, 1] or null");
    return;
  }
  const json::Value* worst = json::Find(*gradients, "worst_group");
  if (worst != nullptr && worst->is_string()) choice->worst_group = worst->get<std::string>();
  if (const json::Value* below = check.Array(*gradients, "below_bound", at)) {
    choice->groups_below_bound = below->size();
  }
}

std::optional<PlannerProfile> ReadPlanner(const json::Value& document, FieldChecker& check) {
  const json::Value* section = FindSection(document, "planner", check);
  if (section == nullptr) return std::nullopt;
  PlannerProfile planner;
  planner.budget_bytes = check.Count(*section, "budget_bytes", "planner");
  planner.headroom = check.FractionOrNull(*section, "headroom", "planner").value_or(0);
  if (const json::Value* sizes = check.Array(*section, "batch_sizes", "planner")) {
    for (size_t i = 0; i < sizes->size(); ++i) {
      planner.batch_sizes.push_back(
          check.Count(&(*sizes)[i], ElementPath("planner.batch_sizes", i)));
    }
  }
  if (const json::Value* choices = check.Object(*section, "choices", "planner")) {
    for (const auto& member : choices->items()) {
      const std::string path = MemberPath("planner.choices", member.key());
      if (!member.value().is_object()) {
        check.Fail(path, &member.value(),
                   "an object with fixed_bytes, per_sample_bytes and max_batch_size");
        continue;
      }
      PlannerChoice choice;
      choice.name = member.key();
      choice.fixed_bytes = check.Count(member.value(), "fixed_bytes", path);
      choice.per_sample_bytes = check.Count(member.value(), "per_sample_bytes", path);
      choice.max_batch_size = check.Count(member.value(), "max_batch_size", path);
      choice.headroom = check.FractionOrNull(member.value(), "headroom", path);
      ReadGradients(check, member.value(), path, &choice);
      planner.choices.push_back(std::move(choice));
    }
  }
  const json::Value* verified = json::Find(*section, "verified");
  if (verified != nullptr && !verified->is_null()) {
    if (!verified->is_object()) {
      check.Fail("planner.verified", verified,
                 "null or an object with codec, batch_size and peak_bytes");
    } else {
      PlannerVerified v;
      v.codec = check.String(*verified, "codec", "planner.verified");
      v.batch_size = check.Count(*verified, "batch_size", "planner.verified");
      v.peak_bytes = check.CountOrNull(*verified, "peak_bytes", "planner.verified");
      if (const json::Value* smallest = json::Find(*verified, "smallest_tried")) {
        v.smallest_tried = check.Count(smallest, "planner.verified.smallest_tried");
      }
      planner.verified = std::move(v);
    }
  }
  return planner;
}

std::optional<AllocatorUsage> ReadAllocator(const json::Value& document, FieldChecker& check) {
  const json::Value* section = FindSection(document, "allocator", check);
  if (section == nullptr) return std::nullopt;
  AllocatorUsage usage;
  usage.backend = check.String(*section, "backend", "allocator");
  if (check.status().ok() && usage.backend != "cpu" && usage.backend != "cuda") {
    check.Fail("allocator.backend", json::Find(*section, "backend"), "\"cpu\" or \"cuda\"");
  }
  usage.budget_bytes = check.CountOrNull(*section, "budget_bytes", "allocator");
  if (const json::Value* stats = check.Object(*section, "stats", "allocator")) {
    // Flat like torch.cuda.memory_stats: every counter a number (some of torch's, such as
    // max_split_size, are -1), the ones shown here non-negative integers.
    for (const auto& member : stats->items()) {
      if (!member.value().is_number()) {
        check.Fail(MemberPath("allocator.stats", member.key()), &member.value(), "a number");
      }
    }
    usage.peak_allocated_bytes =
        check.CountOrNull(*stats, "allocated_bytes.all.peak", "allocator.stats");
    usage.peak_reserved_bytes =
        check.CountOrNull(*stats, "reserved_bytes.all.peak", "allocator.stats");
    usage.num_alloc_retries = check.CountOrNull(*stats, "num_alloc_retries", "allocator.stats");
    usage.num_ooms = check.CountOrNull(*stats, "num_ooms", "allocator.stats");
  }
  const json::Value* snapshot = json::Find(*section, "snapshot");
  if (snapshot != nullptr && !snapshot->is_null()) {
    // The shape torch's memory_viz walks: segments of objects, one trace of objects per device.
    if (!snapshot->is_object()) {
      check.Fail("allocator.snapshot", snapshot,
                 "null or an object with segments and device_traces, as "
                 "torch.cuda.memory._snapshot() returns");
    } else {
      usage.has_snapshot = true;
      if (const json::Value* segments = check.Array(*snapshot, "segments", "allocator.snapshot")) {
        for (size_t i = 0; i < segments->size(); ++i) {
          if (!(*segments)[i].is_object()) {
            check.Fail(ElementPath("allocator.snapshot.segments", i), &(*segments)[i],
                       "an object");
          }
        }
        usage.snapshot_segments = segments->size();
      }
      if (const json::Value* traces =
              check.Array(*snapshot, "device_traces", "allocator.snapshot")) {
        for (size_t d = 0; d < traces->size(); ++d) {
          const json::Value& trace = (*traces)[d];
          const std::string path = ElementPath("allocator.snapshot.device_traces", d);
          if (!trace.is_array()) {
            check.Fail(path, &trace, "an array of trace entries");
            continue;
          }
          for (size_t i = 0; i < trace.size(); ++i) {
            if (!trace[i].is_object()) check.Fail(ElementPath(path, i), &trace[i], "an object");
          }
          usage.snapshot_trace_entries += trace.size();
        }
      }
    }
  }
  return usage;
}

// The saved-tensor members added after version 1: "module" (a string) and "error" (rms,
// max_abs, rel_rms); each may be absent or null. Records that are not objects are left to the
// lenient reader, which skips them.
void CheckSavedTensorExtensions(const json::Value& document, FieldChecker& check) {
  const json::Value* activations = FindObject(&document, "activations");
  const json::Value* list =
      activations == nullptr ? nullptr : json::Find(*activations, "saved_tensors");
  if (list == nullptr) return;
  for (size_t i = 0; i < list->size() && check.status().ok(); ++i) {
    const json::Value& record = (*list)[i];
    if (!record.is_object()) continue;
    const std::string path = ElementPath("activations.saved_tensors", i);
    const json::Value* module = json::Find(record, "module");
    if (module != nullptr && !module->is_null() && !module->is_string()) {
      check.Fail(MemberPath(path, "module"), module, "a module name (a string) or null");
    }
    const json::Value* error = json::Find(record, "error");
    if (error == nullptr || error->is_null()) continue;
    const std::string error_path = MemberPath(path, "error");
    if (!error->is_object()) {
      check.Fail(error_path, error, "null or an object with rms, max_abs and rel_rms");
      continue;
    }
    for (absl::string_view key : {"rms", "max_abs", "rel_rms"}) {
      check.MagnitudeOrNull(*error, key, error_path);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Text helpers.

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

// Rows of cells printed with each column padded to its widest cell. Columns listed in
// `right_aligned` are padded on the left (numbers).
class TextTable {
 public:
  explicit TextTable(std::vector<size_t> right_aligned = {})
      : right_aligned_(std::move(right_aligned)) {}

  void AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

  std::string Render(absl::string_view indent = "  ") const {
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

 private:
  std::vector<size_t> right_aligned_;
  std::vector<std::vector<std::string>> rows_;
};

std::string OrUnknown(const std::optional<std::string>& text) {
  return text.value_or("(not recorded)");
}

// "250.00 MiB (97.7% of the budget)", with ", OVER" past it.
std::string BytesOfBudget(uint64_t bytes, std::optional<uint64_t> budget) {
  std::string text = FormatBytes(bytes);
  if (budget.has_value() && *budget > 0) {
    absl::StrAppendFormat(&text, " (%.1f%% of the budget%s)",
                          100.0 * static_cast<double>(bytes) / static_cast<double>(*budget),
                          bytes > *budget ? ", OVER" : "");
  }
  return text;
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

// A batch size, nullopt meaning no limit from the per-sample model.
std::string BatchText(const std::optional<uint64_t>& batch) {
  return batch.has_value() ? absl::StrCat(*batch) : "unbounded";
}

std::string JoinCounts(const std::vector<uint64_t>& counts) {
  return counts.empty() ? "none" : absl::StrJoin(counts, ", ");
}

// The consumers a report's tables and plot show: by module when the report names modules,
// else by producer; `kind` is "module" or "producer".
const std::vector<ConsumerUsage>& ShownConsumers(const RunReport& report,
                                                 absl::string_view* kind) {
  if (!report.modules.empty()) {
    *kind = "module";
    return report.modules;
  }
  *kind = "producer";
  return report.producers;
}

std::string StepsText(uint64_t steps) {
  return absl::StrCat(steps, steps == 1 ? " step" : " steps");
}

// ---------------------------------------------------------------------------------------------
// SVG helpers.

std::string XmlEscape(absl::string_view text) {
  std::string escaped;
  for (char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&apos;"; break;
      default: escaped += c;
    }
  }
  return escaped;
}

// A byte axis from 0 to `top` with ticks every `step`, labelled in `unit_name`.
struct ByteAxis {
  double top = 1;
  double step = 1;
  double unit = 1;
  std::string unit_name = "B";

  std::string Label(double bytes) const {
    return absl::StrFormat("%g %s", std::round(bytes / unit * 1000.0) / 1000.0, unit_name);
  }
};

// Chooses the unit (B, KiB, MiB, GiB, TiB) and a 1-2-2.5-5 tick step giving about 5 ticks.
ByteAxis NiceByteAxis(double max_bytes) {
  ByteAxis axis;
  if (!(max_bytes > 0)) max_bytes = 1;
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (unit < 4 && max_bytes / std::pow(1024.0, unit) >= 1024.0) ++unit;
  axis.unit = std::pow(1024.0, unit);
  axis.unit_name = kUnits[unit];
  const double in_unit = max_bytes / axis.unit;
  const double rough = in_unit / 5.0;
  const double magnitude = std::pow(10.0, std::floor(std::log10(rough)));
  double nice = magnitude;
  for (double factor : {1.0, 2.0, 2.5, 5.0, 10.0}) {
    nice = factor * magnitude;
    if (nice >= rough) break;
  }
  if (unit == 0) nice = std::max(1.0, std::round(nice));
  axis.step = nice * axis.unit;
  axis.top = std::ceil(in_unit / nice - 1e-9) * nice * axis.unit;
  if (axis.top <= 0) axis.top = axis.step;
  return axis;
}

constexpr absl::string_view kRawColor = "#9aa5b1";
constexpr absl::string_view kStoredColor = "#1f77b4";
constexpr absl::string_view kBudgetColor = "#d62728";
constexpr absl::string_view kReservedColor = "#2ca02c";
constexpr absl::string_view kAllocatedColor = "#ff7f0e";
constexpr absl::string_view kSystemColor = "#9467bd";

void AppendText(std::string* svg, double x, double y, absl::string_view text,
                absl::string_view anchor = "start", absl::string_view extra = "") {
  absl::StrAppendFormat(svg, "  <text x=\"%.1f\" y=\"%.1f\" text-anchor=\"%s\"%s>%s</text>\n", x,
                        y, anchor, extra, XmlEscape(text));
}

void AppendRect(std::string* svg, double x, double y, double width, double height,
                absl::string_view color, absl::string_view title) {
  absl::StrAppendFormat(svg,
                        "  <rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" "
                        "fill=\"%s\"><title>%s</title></rect>\n",
                        x, y, std::max(width, 0.0), std::max(height, 0.0), color,
                        XmlEscape(title));
}

void AppendLine(std::string* svg, double x1, double y1, double x2, double y2,
                absl::string_view color, absl::string_view extra = "") {
  absl::StrAppendFormat(svg,
                        "  <line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"%s/>\n",
                        x1, y1, x2, y2, color, extra);
}

void AppendLegendEntry(std::string* svg, double x, double y, absl::string_view color,
                       absl::string_view label, bool dashed_line = false) {
  if (dashed_line) {
    AppendLine(svg, x, y - 4, x + 18, y - 4, color,
               " stroke-width=\"2\" stroke-dasharray=\"6 3\"");
  } else if (absl::StrContains(label, "peak")) {  // a line with markers
    AppendLine(svg, x, y - 4, x + 18, y - 4, color, " stroke-width=\"2\"");
  } else {
    AppendRect(svg, x, y - 10, 18, 10, color, label);
  }
  AppendText(svg, x + 24, y, label);
}


// ---------------------------------------------------------------------------------------------
// Python pickle, protocol 2 (the opcodes of CPython's Lib/pickle.py). No memo: the unpickler
// needs one only for shared or recursive objects, and a JSON tree has neither.

constexpr char kPickleProto = '\x80';
constexpr char kPickleStop = '.';
constexpr char kPickleNone = 'N';
constexpr char kPickleTrue = '\x88';
constexpr char kPickleFalse = '\x89';
constexpr char kPickleBinInt1 = 'K';  // 1-byte unsigned
constexpr char kPickleBinInt2 = 'M';  // 2-byte unsigned, little-endian
constexpr char kPickleBinInt = 'J';   // 4-byte signed, little-endian
constexpr char kPickleLong1 = '\x8a';  // n bytes of two's complement, little-endian
constexpr char kPickleBinFloat = 'G';  // 8-byte IEEE 754, big-endian
constexpr char kPickleBinUnicode = 'X';  // 4-byte little-endian length, UTF-8
constexpr char kPickleEmptyList = ']';
constexpr char kPickleEmptyDict = '}';
constexpr char kPickleMark = '(';
constexpr char kPickleAppends = 'e';
constexpr char kPickleSetItems = 'u';

void AppendLittleEndian(uint64_t value, int bytes, std::string* out) {
  for (int i = 0; i < bytes; ++i) out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
}

void AppendPickleInt(int64_t n, std::string* out) {
  if (n >= 0 && n < 256) {
    out->push_back(kPickleBinInt1);
    AppendLittleEndian(static_cast<uint64_t>(n), 1, out);
  } else if (n >= 0 && n < 65536) {
    out->push_back(kPickleBinInt2);
    AppendLittleEndian(static_cast<uint64_t>(n), 2, out);
  } else if (n >= std::numeric_limits<int32_t>::min() && n <= std::numeric_limits<int32_t>::max()) {
    out->push_back(kPickleBinInt);
    AppendLittleEndian(static_cast<uint32_t>(static_cast<int32_t>(n)), 4, out);
  } else {
    // The shortest two's complement: drop high bytes that only repeat the sign.
    std::string bytes;
    AppendLittleEndian(static_cast<uint64_t>(n), 8, &bytes);
    while (bytes.size() > 1) {
      const unsigned char last = bytes.back();
      const bool next_negative = (static_cast<unsigned char>(bytes[bytes.size() - 2]) & 0x80) != 0;
      if ((last == 0x00 && !next_negative) || (last == 0xFF && next_negative)) {
        bytes.pop_back();
      } else {
        break;
      }
    }
    out->push_back(kPickleLong1);
    out->push_back(static_cast<char>(bytes.size()));
    out->append(bytes);
  }
}

void AppendPickleFloat(double d, std::string* out) {
  uint64_t bits = 0;
  static_assert(sizeof(bits) == sizeof(d));
  std::memcpy(&bits, &d, sizeof(d));
  out->push_back(kPickleBinFloat);
  for (int i = 7; i >= 0; --i) out->push_back(static_cast<char>((bits >> (8 * i)) & 0xFF));
}

void AppendPickleString(absl::string_view text, std::string* out) {
  // A run report is read whole into memory; no string in it comes near 4 GiB.
  out->push_back(kPickleBinUnicode);
  AppendLittleEndian(text.size(), 4, out);
  out->append(text.data(), text.size());
}

// Recursion is bounded by the JSON parser's nesting limit (json::kMaxDepth).
void AppendPickle(const json::Value& value, std::string* out) {
  switch (value.type()) {
    case json::Value::value_t::null:
    case json::Value::value_t::binary:     // never in parsed text
    case json::Value::value_t::discarded:  // never in parsed text
      out->push_back(kPickleNone);
      return;
    case json::Value::value_t::boolean:
      out->push_back(value.get<bool>() ? kPickleTrue : kPickleFalse);
      return;
    case json::Value::value_t::number_integer:
    case json::Value::value_t::number_unsigned:
    case json::Value::value_t::number_float:
      if (json::IsInt(value)) {
        AppendPickleInt(value.get<int64_t>(), out);
      } else {
        AppendPickleFloat(value.get<double>(), out);
      }
      return;
    case json::Value::value_t::string:
      AppendPickleString(value.get_ref<const std::string&>(), out);
      return;
    case json::Value::value_t::array:
      out->push_back(kPickleEmptyList);
      if (value.size() == 0) return;
      out->push_back(kPickleMark);
      for (const json::Value& element : value) AppendPickle(element, out);
      out->push_back(kPickleAppends);
      return;
    case json::Value::value_t::object:
      out->push_back(kPickleEmptyDict);
      if (value.size() == 0) return;
      out->push_back(kPickleMark);
      for (const auto& member : value.items()) {
        AppendPickleString(member.key(), out);
        AppendPickle(member.value(), out);
      }
      out->push_back(kPickleSetItems);
      return;
  }
}

// ---------------------------------------------------------------------------------------------
// Sections of the text shared by `report`, `diff` and `plan`.

// The top `max_rows` consumers (by module or producer) with their bytes per step, codecs and,
// when any record reports one, their worst codec error.
std::string ConsumerTable(const RunReport& report, size_t max_rows) {
  absl::string_view kind;
  const std::vector<ConsumerUsage>& consumers = ShownConsumers(report, &kind);
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

// The worst parameter group's gradient cosine against exact training, "!" when groups fell
// below the plan's bound, "-" where it was not measured.
std::string GradientCosineText(const PlannerChoice& choice) {
  if (!choice.min_cosine.has_value()) return "-";
  const std::string cosine = std::isnan(*choice.min_cosine)
                                 ? std::string("non-finite")
                                 : absl::StrFormat("%.3f", *choice.min_cosine);
  return choice.groups_below_bound > 0 ? cosine + "!" : cosine;
}

// Whether the plan measured any choice's gradients (reports before it did not: no column).
bool GradientsMeasured(const PlannerProfile& planner) {
  return std::any_of(planner.choices.begin(), planner.choices.end(),
                     [](const PlannerChoice& c) { return c.min_cosine.has_value(); });
}

// Under the table: which choices turned some groups' gradients (their worst group).
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

// ---------------------------------------------------------------------------------------------
// The command line, declared once with CLI11: the subcommands, their operands and options,
// bound to Args. CLI11 parses and refuses what does not fit; the usage text is read back from
// the same declarations.

// What the command line asked for.
struct Args {
  std::string run;     // RUN.json: report, plot, plan, snapshot
  std::string before;  // BEFORE.json and AFTER.json: diff
  std::string after;
  std::string output;  // -o/--output: plot, snapshot
  std::string budget;  // --budget: plan
  bool json = false;   // --json: report, plan
};

using Command = int (*)(const Args& args, std::string* out, std::string* err);

// The declarations, bound to `args`: one subcommand per command, in the usage text's order, and
// the command each runs. Parsing throws CLI::ParseError: CLI::CallForHelp for -h/--help,
// CLI::CallForVersion for --version, any other for a usage error.
struct Cli {
  explicit Cli(Args* args);

  CLI::App app;
  std::map<const CLI::App*, Command> commands;
};

// "plot RUN.json -o MEMORY.svg", "report RUN.json [--json]".
std::string Synopsis(const CLI::App& command) {
  std::string text = command.get_name();
  for (const CLI::Option* option : command.get_options()) {
    if (option == command.get_help_ptr()) continue;
    std::string usage = option->get_positional()         ? option->get_name()
                        : option->get_snames().empty() ? "--" + option->get_lnames().front()
                                                       : "-" + option->get_snames().front();
    if (!option->get_positional() && option->get_expected_max() > 0) {
      absl::StrAppend(&usage, " ", option->get_type_name());
    }
    absl::StrAppend(&text, " ", option->get_required() ? usage : absl::StrCat("[", usage, "]"));
  }
  return text;
}

std::string Usage() {
  Args unused;
  const Cli cli(&unused);
  std::string text = "usage: actpack <command> [options]\n";
  size_t width = 0;
  for (const CLI::App* command : cli.app.get_subcommands(nullptr)) {
    width = std::max(width, Synopsis(*command).size());
  }
  for (const CLI::App* command : cli.app.get_subcommands(nullptr)) {
    const std::string synopsis = Synopsis(*command);
    absl::StrAppend(&text, "  actpack ", synopsis, std::string(width - synopsis.size() + 3, ' '),
                    command->get_description(), "\n");
  }
  return text;
}

int UsageError(absl::string_view problem, std::string* err) {
  absl::StrAppend(err, "actpack: ", problem, "\n", Usage());
  return kExitBadInput;
}

int InputError(absl::string_view command, const absl::Status& status, std::string* err) {
  absl::StrAppend(err, "actpack ", command, ": ", status.message(), "\n");
  return kExitBadInput;
}

int ReportCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<RunReport> report = LoadRunReport(args.run);
  if (!report.ok()) return InputError("report", report.status(), err);
  absl::StrAppend(out, args.json ? json::Serialize(SummarizeReport(*report)) + "\n"
                                 : FormatReportText(*report));
  return kExitOk;
}

int DiffCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<RunReport> before = LoadRunReport(args.before);
  if (!before.ok()) return InputError("diff", before.status(), err);
  absl::StatusOr<RunReport> after = LoadRunReport(args.after);
  if (!after.ok()) return InputError("diff", after.status(), err);
  absl::StrAppend(out, FormatDiffText(*before, *after));
  return kExitOk;
}

int PlotCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<RunReport> report = LoadRunReport(args.run);
  if (!report.ok()) return InputError("plot", report.status(), err);
  if (absl::Status written = WriteFile(args.output, RenderMemorySvg(*report)); !written.ok()) {
    return InputError("plot", written, err);
  }
  absl::StrAppend(out, "wrote ", args.output, "\n");
  return kExitOk;
}

int PlanCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<runtime::Budget> budget = runtime::ParseBudget(args.budget);
  if (!budget.ok()) {
    absl::string_view problem = budget.status().message();
    absl::ConsumePrefix(&problem, "actpack: ");
    return UsageError(absl::StrCat("plan --budget: ", problem), err);
  }
  if (budget->bytes == 0) {
    // A share needs the device's size, which a report does not record (and this machine's
    // device need not be the run's).
    return UsageError(absl::StrCat("plan --budget ", args.budget, ": a share of the device "
                                   "needs the device's memory size, which a run report does not "
                                   "record; give a size such as 12GiB"),
                      err);
  }
  absl::StatusOr<RunReport> report = LoadRunReport(args.run);
  if (!report.ok()) return InputError("plan", report.status(), err);
  // Re-planning needs the planner's fixed and per-sample memory model; without it any batch
  // size printed here would be invented.
  if (!report->planner.has_value()) {
    absl::StrAppend(err, "actpack plan: ", report->file,
                    ": run report has no planner profile; write one with "
                    "actpack.plan(step, budget=..., report=\"run.json\")\n");
    return kExitBadInput;
  }
  absl::StrAppend(out, args.json
                           ? json::Serialize(SummarizePlan(*report, budget->bytes)) + "\n"
                           : FormatPlanText(*report, budget->bytes));
  return kExitOk;
}

int SnapshotCommand(const Args& args, std::string* out, std::string* err) {
  absl::StatusOr<RunReport> report = LoadRunReport(args.run);
  if (!report.ok()) return InputError("snapshot", report.status(), err);
  const json::Value* snapshot = report->Snapshot();
  if (snapshot == nullptr) {
    absl::StrAppend(err, "actpack snapshot: ", report->file, ": ",
                    report->allocator.has_value()
                        ? "the run report's allocator section has no snapshot (null or absent)"
                        : "run report has no allocator section, so no snapshot",
                    "; in the running process, actpack.dump_snapshot(\"snap.pickle\") writes "
                    "one\n");
    return kExitBadInput;
  }
  if (absl::Status written = WriteFile(args.output, PickleJson(*snapshot)); !written.ok()) {
    return InputError("snapshot", written, err);
  }
  absl::StrAppend(out, "wrote ", args.output, " (", report->allocator->snapshot_segments,
                  " segments, ", report->allocator->snapshot_trace_entries,
                  " trace entries); open it in https://pytorch.org/memory_viz\n");
  return kExitOk;
}

Cli::Cli(Args* args) : app("actpack") {
  // At most one command (a second command's name is an operand or an error). None is required
  // here: RunCli says "no command given" itself, after CLI11 has named any stray argument.
  app.require_subcommand(0, 1);
  app.set_version_flag("--version", absl::StrCat("actpack ", kVersion));
  auto add = [&](const char* name, const char* summary, Command run) {
    CLI::App* command = app.add_subcommand(name, summary);
    commands[command] = run;
    return command;
  };
  // A flag given twice, or given a value ("--json=yes"), is refused as an option given twice is.
  auto add_json = [&](CLI::App* command) {
    command->add_flag("--json", args->json)
        ->multi_option_policy(CLI::MultiOptionPolicy::Throw)
        ->disable_flag_override();
  };
  auto add_output = [&](CLI::App* command, const char* value_name) {
    command->add_option("-o,--output", args->output)->required()->type_name(value_name);
  };

  CLI::App* report = add("report", "where the memory went (--json: for machines)", &ReportCommand);
  report->add_option("RUN.json", args->run)->required();
  add_json(report);
  CLI::App* diff = add("diff", "what changed between two runs", &DiffCommand);
  diff->add_option("BEFORE.json", args->before)->required();
  diff->add_option("AFTER.json", args->after)->required();
  CLI::App* plot = add("plot", "per-step and per-module bytes as an SVG", &PlotCommand);
  plot->add_option("RUN.json", args->run)->required();
  add_output(plot, "MEMORY.svg");
  CLI::App* plan = add("plan", "the largest batch per choice at another budget", &PlanCommand);
  plan->add_option("RUN.json", args->run)->required();
  plan->add_option("--budget", args->budget)->required()->type_name("SIZE");
  add_json(plan);
  CLI::App* snapshot =
      add("snapshot", "the allocator snapshot for pytorch.org/memory_viz", &SnapshotCommand);
  snapshot->add_option("RUN.json", args->run)->required();
  add_output(snapshot, "SNAP.pickle");

  // A word in a command's place that names none lands here, and the error names it and the
  // commands: "command: frobnicate not in {report,diff,plot,plan,snapshot}".
  std::vector<std::string> names;
  for (const CLI::App* command : app.get_subcommands(nullptr)) names.push_back(command->get_name());
  app.add_option("command")->check(CLI::IsMember(names));
}

}  // namespace

uint64_t RunReport::StepCount() const { return totals.steps.value_or(steps.size()); }

uint64_t RunReport::StepCountForAverages() const { return std::max<uint64_t>(StepCount(), 1); }

std::string RunReport::FileName() const {
  const size_t slash = file.find_last_of('/');
  return slash == std::string::npos ? file : file.substr(slash + 1);
}

const json::Value* RunReport::Snapshot() const {
  return FindObject(FindObject(&document, "allocator"), "snapshot");
}

std::optional<double> AllocatorUsage::Fragmentation() const {
  if (!peak_allocated_bytes.has_value() || !peak_reserved_bytes.has_value() ||
      *peak_allocated_bytes == 0) {
    return std::nullopt;
  }
  return static_cast<double>(*peak_reserved_bytes) / static_cast<double>(*peak_allocated_bytes);
}

absl::StatusOr<RunReport> ParseRunReport(absl::string_view text, absl::string_view file) {
  if (text.find_first_not_of(" \t\r\n") == absl::string_view::npos) {
    return absl::DataLossError(absl::StrCat(file, ": empty file, not a run report"));
  }
  absl::StatusOr<json::Value> document = json::Parse(text);
  if (!document.ok()) {
    if (absl::IsDataLoss(document.status())) {
      return absl::DataLossError(
          absl::StrCat(file, ": truncated JSON (", document.status().message(), ")"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": not JSON (", document.status().message(), ")"));
  }
  return ReadRunReport(*std::move(document), file);
}

absl::StatusOr<RunReport> ReadRunReport(json::Value parsed, absl::string_view file) {
  const json::Value* document = &parsed;
  if (!document->is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": not an actpack run report (the document is not a JSON object)"));
  }
  const std::optional<std::string> schema = FindString(&*document, "schema");
  if (!schema.has_value()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": not an actpack run report (no \"schema\" member; expected \"",
                     kReportSchema, "\")"));
  }
  if (*schema != kReportSchema) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": not an actpack run report (schema \"",
                                                   *schema, "\", expected \"", kReportSchema,
                                                   "\")"));
  }
  const json::Value* version = json::Find(*document, "schema_version");
  if (version == nullptr || !json::IsInt(*version)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": run report without an integer \"schema_version\""));
  }
  if (version->get<int64_t>() != kReportSchemaVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": unsupported run report schema_version ", version->get<int64_t>(),
                     " (this actpack reads version ", kReportSchemaVersion, ")"));
  }

  RunReport report;
  report.file = std::string(file);
  report.document = std::move(parsed);
  const json::Value* run = FindObject(&report.document, "run");
  report.torch_version = FindString(run, "torch");
  report.device = FindString(run, "device");
  report.budget_text = FindString(run, "budget");
  report.budget_bytes = FindBytes(run, "budget_bytes");
  report.codec = FindString(run, "codec");
  report.peak_allocated_bytes = FindBytes(run, "peak_allocated_bytes");
  report.peak_reserved_bytes = FindBytes(run, "peak_reserved_bytes");
  report.peak_system_bytes = FindBytes(run, "peak_system_bytes");
  report.system_memory = FindString(run, "system_memory");
  report.wall_seconds = FindDouble(run, "wall_seconds");
  if (const json::Value* warnings = run == nullptr ? nullptr : json::Find(*run, "warnings")) {
    for (const json::Value& warning : *warnings) {
      if (warning.is_string()) report.warnings.push_back(warning.get_ref<const std::string&>());
    }
  }

  FieldChecker check;
  report.planner = ReadPlanner(report.document, check);
  report.allocator = ReadAllocator(report.document, check);
  CheckSavedTensorExtensions(report.document, check);
  if (!check.status().ok()) {
    return absl::InvalidArgumentError(absl::StrCat(file, ": bad run report: ",
                                                   check.status().message()));
  }

  const json::Value* activations = FindObject(&report.document, "activations");
  report.has_activations = activations != nullptr;
  report.activation_codec = FindString(activations, "codec");
  report.totals = ReadTotals(FindObject(activations, "totals"));
  report.steps = ReadSteps(activations);
  report.producers = GroupSavedTensors(activations, /*by_module=*/false);
  if (AnyRecordNamesModule(activations)) {
    report.modules = GroupSavedTensors(activations, /*by_module=*/true);
  }
  return report;
}

absl::StatusOr<RunReport> LoadRunReport(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return ReadError(path, errno);
  std::string text;
  char chunk[1 << 16];
  size_t got = 0;
  while ((got = std::fread(chunk, 1, sizeof(chunk), file)) > 0) text.append(chunk, got);
  const int read_errno = std::ferror(file) ? errno : 0;
  std::fclose(file);
  if (read_errno != 0) return ReadError(path, read_errno);
  return ParseRunReport(text, path);
}

std::optional<uint64_t> MaxBatchSize(uint64_t budget_bytes, uint64_t fixed_bytes,
                                     uint64_t per_sample_bytes) {
  if (budget_bytes < fixed_bytes) return 0;
  if (per_sample_bytes == 0) return std::nullopt;
  // (budget - fixed) / per_sample is 0 when not even one sample fits; no sum can overflow.
  return (budget_bytes - fixed_bytes) / per_sample_bytes;
}

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

namespace {

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

}  // namespace

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
  const std::vector<ConsumerUsage>& consumers_before = ShownConsumers(before, &kind_before);
  const std::vector<ConsumerUsage>& consumers_after = ShownConsumers(after, &kind_after);
  if (!consumers_before.empty() || !consumers_after.empty()) {
    const absl::string_view kind =
        kind_before == "module" || kind_after == "module" ? "module" : "producer";
    absl::StrAppend(&text, ConsumerDiff(kind, consumers_before, before.StepCountForAverages(),
                                        consumers_after, after.StepCountForAverages()));
  }
  return text;
}

namespace {

// The choice with the largest batch at `budget_bytes` (unbounded beats any number, the first
// of equals wins), or nullptr when there are no choices.
const PlannerChoice* BestChoice(const PlannerProfile& planner, uint64_t budget_bytes) {
  const PlannerChoice* best = nullptr;
  std::optional<uint64_t> best_batch;
  for (const PlannerChoice& choice : planner.choices) {
    const std::optional<uint64_t> batch =
        MaxBatchSize(planner.Usable(choice, budget_bytes), choice.fixed_bytes,
                     choice.per_sample_bytes);
    const bool better = best == nullptr || (best_batch.has_value() &&
                                            (!batch.has_value() || *batch > *best_batch));
    if (better) {
      best = &choice;
      best_batch = batch;
    }
  }
  return best;
}

// Whether a batch size at the new budget lies outside the profiled ones, where the linear
// model is extrapolated rather than measured.
bool OutsideProfiled(const PlannerProfile& planner, const std::optional<uint64_t>& batch) {
  if (!batch.has_value() || *batch == 0 || planner.batch_sizes.empty()) return false;
  const auto [smallest, largest] =
      std::minmax_element(planner.batch_sizes.begin(), planner.batch_sizes.end());
  return *batch < *smallest || *batch > *largest;
}

}  // namespace

std::string FormatPlanText(const RunReport& report, uint64_t budget_bytes) {
  const PlannerProfile& planner = *report.planner;
  const std::string budget = FormatBytes(budget_bytes);
  const std::string recorded = FormatBytes(planner.budget_bytes);
  std::string text = absl::StrCat("actpack plan: ", report.FileName(), " at a budget of ",
                                  budget, "\n", "planner profile: budget ", recorded,
                                  ", profiled batch sizes: ", JoinCounts(planner.batch_sizes),
                                  "\n\n");
  const bool gradients = GradientsMeasured(planner);
  TextTable table({1, 2, 3, 4, 5, 6});
  std::vector<std::string> header = {"choice", "fixed", "per sample", "headroom"};
  if (gradients) header.push_back("grad cos");
  header.push_back(absl::StrCat("max batch at ", budget));
  header.push_back(absl::StrCat("recorded at ", recorded));
  table.AddRow(header);
  bool extrapolated = false;
  for (const PlannerChoice& choice : planner.choices) {
    const std::optional<uint64_t> batch =
        MaxBatchSize(planner.Usable(choice, budget_bytes), choice.fixed_bytes,
                     choice.per_sample_bytes);
    extrapolated = extrapolated || OutsideProfiled(planner, batch);
    // A share measured by real steps under the cap, or the section's default (marked *).
    std::vector<std::string> row = {
        choice.name, FormatBytes(choice.fixed_bytes), FormatBytes(choice.per_sample_bytes),
        absl::StrFormat("%.1f%%%s", 100 * choice.headroom.value_or(planner.headroom),
                        choice.headroom.has_value() ? "" : "*")};
    if (gradients) row.push_back(GradientCosineText(choice));
    row.push_back(BatchText(batch));
    row.push_back(absl::StrCat(choice.max_batch_size));
    table.AddRow(row);
  }
  if (planner.choices.empty()) {
    absl::StrAppend(&text, "  the planner profile records no choices\n");
    return text;
  }
  absl::StrAppend(&text, table.Render(), GradientNotes(planner), "\n");
  const PlannerChoice* best = BestChoice(planner, budget_bytes);
  const std::optional<uint64_t> best_batch =
      MaxBatchSize(planner.Usable(*best, budget_bytes), best->fixed_bytes, best->per_sample_bytes);
  if (best_batch.has_value() && *best_batch == 0) {
    absl::StrAppend(&text, "  no choice fits one sample in ", budget, "\n");
  } else {
    absl::StrAppend(&text, "  largest batch at ", budget, ": ", best->name, " (",
                    BatchText(best_batch), ")\n");
  }
  absl::StrAppend(&text, "  verified at ", recorded, ": ", VerifiedText(planner), "\n");
  if (std::any_of(planner.choices.begin(), planner.choices.end(),
                  [](const PlannerChoice& c) { return !c.headroom.has_value(); })) {
    absl::StrAppend(&text, "  * not measured by steps under the cap: the profile's default\n");
  }
  if (extrapolated) {
    absl::StrAppend(&text, "  note: outside the profiled batch sizes (",
                    JoinCounts(planner.batch_sizes),
                    ") the fixed + per-sample model is extrapolated\n");
  }
  return text;
}

json::Value SummarizePlan(const RunReport& report, uint64_t budget_bytes) {
  const PlannerProfile& planner = *report.planner;
  json::Value plan = json::Value::object();
  plan["schema"] = "actpack.plan";
  plan["schema_version"] = 1;
  plan["file"] = report.file;
  plan["budget_bytes"] = budget_bytes;
  plan["recorded_budget_bytes"] = planner.budget_bytes;
  plan["batch_sizes"] = CountArray(planner.batch_sizes);
  plan["headroom"] = planner.headroom;
  json::Value choices = json::Value::object();
  bool extrapolated = false;
  for (const PlannerChoice& choice : planner.choices) {
    const std::optional<uint64_t> batch =
        MaxBatchSize(planner.Usable(choice, budget_bytes), choice.fixed_bytes,
                     choice.per_sample_bytes);
    extrapolated = extrapolated || OutsideProfiled(planner, batch);
    json::Value entry = json::Value::object();
    entry["fixed_bytes"] = choice.fixed_bytes;
    entry["per_sample_bytes"] = choice.per_sample_bytes;
    entry["headroom"] = choice.headroom.value_or(planner.headroom);
    entry["max_batch_size"] = OptionalJson(batch);  // null: unbounded
    (entry["unbounded"] = !batch.has_value());
    entry["recorded_max_batch_size"] = choice.max_batch_size;
    choices[choice.name] = std::move(entry);
  }
  plan["choices"] = std::move(choices);
  // The choice with the largest batch, null when none fits one sample.
  const PlannerChoice* best = BestChoice(planner, budget_bytes);
  if (best != nullptr &&
      MaxBatchSize(planner.Usable(*best, budget_bytes), best->fixed_bytes, best->per_sample_bytes) ==
          uint64_t{0}) {
    best = nullptr;
  }
  plan["best"] = best == nullptr ? json::Value() : json::Value(best->name);
  plan["extrapolated"] = extrapolated;
  plan["verified"] = VerifiedJson(planner);
  return plan;
}

std::string RenderMemorySvg(const RunReport& report) {
  constexpr double kWidth = 960;
  constexpr double kLeft = 100;   // room for byte tick labels
  constexpr double kRight = 40;
  constexpr double kStepTop = 96;
  constexpr double kStepHeight = 240;
  constexpr double kConsumerLeft = 220;  // room for module or producer names
  constexpr double kRowHeight = 28;
  constexpr size_t kMaxConsumers = 10;

  absl::string_view kind;
  const std::vector<ConsumerUsage>& consumers = ShownConsumers(report, &kind);
  const size_t consumer_rows = std::max<size_t>(1, std::min(kMaxConsumers, consumers.size()));
  const double consumer_top = kStepTop + kStepHeight + 110;
  const double consumer_height = consumer_rows * kRowHeight;
  const double height = consumer_top + consumer_height + 70;

  std::string svg;
  absl::StrAppendFormat(&svg,
                        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
                        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                        "viewBox=\"0 0 %.0f %.0f\" font-family=\"DejaVu Sans, Helvetica, Arial, "
                        "sans-serif\" font-size=\"12\">\n",
                        kWidth, height, kWidth, height);
  absl::StrAppendFormat(&svg, "  <rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", kWidth,
                        height);
  std::string title = absl::StrCat("actpack memory: ", report.FileName());
  std::vector<std::string> facts;
  if (report.codec) facts.push_back(absl::StrCat("codec ", *report.codec));
  if (report.device) facts.push_back(absl::StrCat("device ", *report.device));
  if (report.budget_bytes) {
    facts.push_back(absl::StrCat("budget ", FormatBytes(*report.budget_bytes)));
  }
  if (!facts.empty()) absl::StrAppend(&title, " (", absl::StrJoin(facts, ", "), ")");
  AppendText(&svg, kWidth / 2, 28, title, "middle", " font-size=\"16\" font-weight=\"bold\"");

  // Panel 1: bytes saved for backward per step, raw vs stored, with the budget line.
  const double plot_left = kLeft;
  const double plot_width = kWidth - kLeft - kRight;
  const double plot_bottom = kStepTop + kStepHeight;
  const bool has_peaks = std::any_of(report.steps.begin(), report.steps.end(), [](const auto& s) {
    return s.peak_reserved_bytes.has_value() || s.peak_allocated_bytes.has_value() ||
           s.system_peak_bytes.has_value();
  });
  const bool has_system = std::any_of(report.steps.begin(), report.steps.end(),
                                      [](const auto& s) { return s.system_peak_bytes.has_value(); });
  AppendText(&svg, plot_left, kStepTop - 44,
             has_peaks ? "memory per training step: activations saved for backward and the "
                         "step's peak"
                       : "activations saved for backward, per training step",
             "start", " font-size=\"13\" font-weight=\"bold\"");
  // Legend, one row above the plot.
  {
    double x = plot_left;
    const double y = kStepTop - 22;
    AppendLegendEntry(&svg, x, y, kRawColor, "saved raw (without actpack)");
    x += 200;
    AppendLegendEntry(&svg, x, y, kStoredColor, "stored by actpack");
    x += 140;
    if (has_peaks) {
      AppendLegendEntry(&svg, x, y, kReservedColor, "step peak reserved");
      x += 150;
      AppendLegendEntry(&svg, x, y, kAllocatedColor, "step peak allocated");
      x += 160;
    }
    if (has_system) {
      AppendLegendEntry(&svg, x, y, kSystemColor, "step peak, system's count");
      x += 190;
    }
    if (report.budget_bytes) AppendLegendEntry(&svg, x, y, kBudgetColor, "budget", true);
  }
  if (report.steps.empty()) {
    AppendText(&svg, plot_left + plot_width / 2, kStepTop + kStepHeight / 2,
               "no per-step data in this report", "middle");
  } else {
    double max_bytes = 0;
    for (const StepUsage& step : report.steps) {
      max_bytes = std::max({max_bytes, static_cast<double>(step.saved_raw_bytes),
                            static_cast<double>(step.stored_bytes),
                            static_cast<double>(step.peak_reserved_bytes.value_or(0)),
                            static_cast<double>(step.peak_allocated_bytes.value_or(0)),
                            static_cast<double>(step.system_peak_bytes.value_or(0))});
    }
    // The budget joins the scale unless it would flatten the bars; then it is stated instead.
    bool budget_on_scale = false;
    if (report.budget_bytes && *report.budget_bytes > 0 &&
        static_cast<double>(*report.budget_bytes) <= 8 * std::max(max_bytes, 1.0)) {
      max_bytes = std::max(max_bytes, static_cast<double>(*report.budget_bytes));
      budget_on_scale = true;
    }
    const ByteAxis axis = NiceByteAxis(max_bytes);
    auto y_of = [&](double bytes) { return plot_bottom - bytes / axis.top * kStepHeight; };
    for (double tick = 0; tick <= axis.top * (1 + 1e-9); tick += axis.step) {
      const double y = y_of(tick);
      AppendLine(&svg, plot_left, y, plot_left + plot_width, y, "#e5e5e5");
      AppendText(&svg, plot_left - 8, y + 4, axis.Label(tick), "end");
    }
    const size_t n = report.steps.size();
    const double slot = plot_width / n;
    const double bar = std::max(1.0, slot * 0.36);
    const size_t label_every = std::max<size_t>(1, (n + 19) / 20);
    for (size_t i = 0; i < n; ++i) {
      const StepUsage& step = report.steps[i];
      const double x = plot_left + i * slot + slot * 0.14;
      AppendRect(&svg, x, y_of(step.saved_raw_bytes), bar,
                 plot_bottom - y_of(step.saved_raw_bytes), kRawColor,
                 absl::StrCat("step ", step.index, ": saved raw ",
                              FormatBytes(step.saved_raw_bytes)));
      AppendRect(&svg, x + bar, y_of(step.stored_bytes), bar,
                 plot_bottom - y_of(step.stored_bytes), kStoredColor,
                 absl::StrCat("step ", step.index, ": stored ", FormatBytes(step.stored_bytes)));
      if (i % label_every == 0) {
        AppendText(&svg, plot_left + (i + 0.5) * slot, plot_bottom + 16,
                   absl::StrCat(step.index), "middle");
      }
    }
    // The step's peaks as lines through the slots' centres, a marker per step.
    auto draw_peaks = [&](auto peak_of, absl::string_view color, absl::string_view what) {
      std::optional<std::pair<double, double>> previous;
      for (size_t i = 0; i < n; ++i) {
        const std::optional<uint64_t> peak = peak_of(report.steps[i]);
        if (!peak.has_value()) {
          previous.reset();
          continue;
        }
        const double x = plot_left + (i + 0.5) * slot;
        const double y = y_of(static_cast<double>(*peak));
        if (previous) {
          AppendLine(&svg, previous->first, previous->second, x, y, color,
                     " stroke-width=\"2\"");
        }
        absl::StrAppendFormat(&svg,
                              "  <circle cx=\"%.1f\" cy=\"%.1f\" r=\"2.5\" fill=\"%s\">"
                              "<title>step %d: %s %s</title></circle>\n",
                              x, y, color, i, what, FormatBytes(*peak));
        previous = std::make_pair(x, y);
      }
    };
    draw_peaks([](const StepUsage& s) { return s.peak_reserved_bytes; }, kReservedColor,
               "peak reserved");
    draw_peaks([](const StepUsage& s) { return s.peak_allocated_bytes; }, kAllocatedColor,
               "peak allocated");
    draw_peaks([](const StepUsage& s) { return s.system_peak_bytes; }, kSystemColor,
               "peak, system's count");
    if (report.budget_bytes) {
      if (budget_on_scale) {
        const double y = y_of(static_cast<double>(*report.budget_bytes));
        AppendLine(&svg, plot_left, y, plot_left + plot_width, y, kBudgetColor,
                   " stroke-width=\"2\" stroke-dasharray=\"6 3\"");
        AppendText(&svg, plot_left + plot_width - 4, y - 6,
                   absl::StrCat("budget ", FormatBytes(*report.budget_bytes)), "end",
                   absl::StrCat(" fill=\"", kBudgetColor, "\""));
      } else {
        // Above the plot area, under the legend, so that it never covers a bar.
        AppendText(&svg, plot_left + plot_width, kStepTop - 8,
                   absl::StrCat("budget ", FormatBytes(*report.budget_bytes),
                                " is far above this scale"),
                   "end", absl::StrCat(" font-size=\"11\" fill=\"", kBudgetColor, "\""));
      }
    }
  }
  AppendLine(&svg, plot_left, kStepTop, plot_left, plot_bottom, "#333333");
  AppendLine(&svg, plot_left, plot_bottom, plot_left + plot_width, plot_bottom, "#333333");
  AppendText(&svg, plot_left + plot_width / 2, plot_bottom + 36, "training step", "middle");
  AppendText(&svg, 0, 0, "bytes per step", "middle",
             absl::StrFormat(" transform=\"translate(22 %.1f) rotate(-90)\"",
                             kStepTop + kStepHeight / 2));

  // Panel 2: per-module (or per-producer) bytes per step, raw vs stored, as horizontal bars.
  const uint64_t steps = report.StepCountForAverages();
  const double bars_left = kConsumerLeft;
  const double bars_width = kWidth - kConsumerLeft - kRight - 170;  // room for value labels
  const double bars_bottom = consumer_top + consumer_height;
  AppendText(&svg, plot_left, consumer_top - 30,
             absl::StrCat("top consumers by ", kind, " (bytes per step, average over ", steps,
                          steps == 1 ? " step)" : " steps)"),
             "start", " font-size=\"13\" font-weight=\"bold\"");
  if (consumers.empty()) {
    AppendText(&svg, bars_left + bars_width / 2, consumer_top + kRowHeight / 2,
               "no saved tensors in this report", "middle");
  } else {
    const ByteAxis axis =
        NiceByteAxis(static_cast<double>(consumers.front().raw_bytes) / steps);
    auto x_of = [&](double bytes) { return bars_left + bytes / axis.top * bars_width; };
    for (double tick = 0; tick <= axis.top * (1 + 1e-9); tick += axis.step) {
      const double x = x_of(tick);
      AppendLine(&svg, x, consumer_top, x, bars_bottom, "#e5e5e5");
      AppendText(&svg, x, bars_bottom + 16, axis.Label(tick), "middle");
    }
    for (size_t i = 0; i < consumer_rows; ++i) {
      const ConsumerUsage& p = consumers[i];
      const double raw = static_cast<double>(p.raw_bytes) / steps;
      const double stored = static_cast<double>(p.stored_bytes) / steps;
      const double y = consumer_top + i * kRowHeight + 4;
      AppendText(&svg, bars_left - 8, y + 14, p.name, "end");
      AppendRect(&svg, bars_left, y, x_of(raw) - bars_left, 10, kRawColor,
                 absl::StrCat(p.name, ": raw ", FormatBytes(p.raw_bytes / steps)));
      AppendRect(&svg, bars_left, y + 10, x_of(stored) - bars_left, 10, kStoredColor,
                 absl::StrCat(p.name, ": stored ", FormatBytes(p.stored_bytes / steps), " (",
                              absl::StrJoin(p.codecs, "+"), ")"));
      AppendText(&svg, x_of(raw) + 6, y + 14,
                 absl::StrCat(FormatBytes(p.stored_bytes / steps), " stored of ",
                              FormatBytes(p.raw_bytes / steps)),
                 "start", " font-size=\"10\" fill=\"#555555\"");
    }
  }
  AppendLine(&svg, bars_left, consumer_top, bars_left, bars_bottom, "#333333");
  AppendLine(&svg, bars_left, bars_bottom, bars_left + bars_width, bars_bottom, "#333333");
  AppendText(&svg, bars_left + bars_width / 2, bars_bottom + 36,
             "bytes per step (grey: saved raw, blue: stored by actpack)", "middle");
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

std::string PickleJson(const json::Value& value) {
  std::string pickle = {kPickleProto, '\x02'};
  AppendPickle(value, &pickle);
  pickle.push_back(kPickleStop);
  return pickle;
}

int RunCli(const std::vector<std::string>& args, std::string* out, std::string* err) {
  Args parsed;
  Cli cli(&parsed);
  // CLI11 takes the arguments last to first. It reads "-o=FILE" as -o with the value "=FILE"
  // (POSIX's "-oFILE"); this command line reads it as it reads "--output=FILE".
  std::vector<std::string> reversed(args.rbegin(), args.rend());
  for (std::string& arg : reversed) {
    if (arg.size() > 2 && arg[0] == '-' && arg[1] != '-' && arg[2] == '=') arg.erase(2, 1);
  }
  try {
    cli.app.parse(reversed);
  } catch (const CLI::CallForHelp&) {
    absl::StrAppend(out, Usage());
    return kExitOk;
  } catch (const CLI::CallForVersion& version) {
    absl::StrAppend(out, version.what(), "\n");
    return kExitOk;
  } catch (const CLI::ParseError& error) {
    // Led by the synopsis of the command it is about, which says what that command expects.
    const std::vector<CLI::App*> chosen = cli.app.get_subcommands();
    return UsageError(chosen.empty() ? error.what()
                                     : absl::StrCat(Synopsis(*chosen.front()), ": ", error.what()),
                      err);
  }
  const std::vector<CLI::App*> chosen = cli.app.get_subcommands();
  if (chosen.empty()) return UsageError("no command given", err);
  return cli.commands.at(chosen.front())(parsed, out, err);
}

}  // namespace actpack::report

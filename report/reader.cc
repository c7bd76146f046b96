#include "report/reader.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/not_packed.h"
#include "report/files.h"
#include "runtime/policy.h"

namespace actpack::report {
namespace {

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
        codec == kNotPacked ? *raw * occurrences : stored_each * (occurrences - reused);
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

// Version 1 named a saved tensor kept as it is "kept" (and, in its first reports, the
// candidate of keeping it "keep"); version 2 names both kNotPacked, as the settings and the
// planner do. Old reports are read in today's terms.
void RenameVersion1NotPacked(json::Value& document) {
  const auto rename = [](json::Value* codec, absl::string_view old_name) {
    if (codec != nullptr && codec->is_string() &&
        codec->get_ref<const std::string&>() == old_name) {
      *codec = std::string(kNotPacked);
    }
  };
  json::Value* activations = json::Find(document, "activations");
  json::Value* tensors =
      activations != nullptr ? json::Find(*activations, "saved_tensors") : nullptr;
  if (tensors == nullptr || !tensors->is_array()) return;
  for (json::Value& entry : *tensors) {
    rename(json::Find(entry, "codec"), kVersion1NotPacked);
    json::Value* candidates = json::Find(entry, "candidates");
    if (candidates == nullptr || !candidates->is_array()) continue;
    for (json::Value& candidate : *candidates) rename(json::Find(candidate, "codec"), "keep");
  }
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

const std::vector<ConsumerUsage>& RunReport::ShownConsumers(absl::string_view* kind) const {
  if (!modules.empty()) {
    *kind = "module";
    return modules;
  }
  *kind = "producer";
  return producers;
}

uint64_t PlannerProfile::Usable(const PlannerChoice& choice, uint64_t budget) const {
  return runtime::UsableBytes(budget, choice.headroom.value_or(headroom));
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
  const int64_t version_number = version->get<int64_t>();
  if (version_number < kOldestReportSchemaVersion || version_number > kReportSchemaVersion) {
    return absl::InvalidArgumentError(absl::StrCat(
        file, ": unsupported run report schema_version ", version_number,
        " (this actpack reads versions ", kOldestReportSchemaVersion, " to ",
        kReportSchemaVersion, ")"));
  }
  if (version_number == 1) RenameVersion1NotPacked(parsed);

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
  absl::StatusOr<std::string> text = ReadFile(path);
  if (!text.ok()) return text.status();
  return ParseRunReport(*text, path);
}

}  // namespace actpack::report

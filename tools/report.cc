#include "tools/report.h"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "allocator/units.h"
#include "runtime/config.h"

namespace actpack::tools {
namespace {

using allocator::FormatBytes;

constexpr absl::string_view kUsage =
    "usage: actpack <command> [options]\n"
    "  actpack report RUN.json [--json]       where the memory went (--json: for machines)\n"
    "  actpack diff BEFORE.json AFTER.json    what changed between two runs\n"
    "  actpack plot RUN.json -o MEMORY.svg    per-step and per-producer bytes as an SVG\n"
    "  actpack plan RUN.json --budget SIZE    batch sizes for another budget (needs a planner "
    "profile)\n";

// ---------------------------------------------------------------------------------------------
// Reading a report: typed lookups that answer "absent" for a missing or ill-typed member.

std::optional<uint64_t> FindBytes(const json::Value* object, absl::string_view key) {
  if (object == nullptr) return std::nullopt;
  const json::Value* value = object->Find(key);
  if (value == nullptr || !value->is_number()) return std::nullopt;
  if (value->is_int()) {
    if (value->as_int() < 0) return std::nullopt;
    return static_cast<uint64_t>(value->as_int());
  }
  const double d = value->as_double();
  if (!std::isfinite(d) || d < 0 || d >= 1.8e19) return std::nullopt;
  return static_cast<uint64_t>(d);
}

std::optional<double> FindDouble(const json::Value* object, absl::string_view key) {
  if (object == nullptr) return std::nullopt;
  const json::Value* value = object->Find(key);
  if (value == nullptr || !value->is_number()) return std::nullopt;
  return value->as_double();
}

std::optional<std::string> FindString(const json::Value* object, absl::string_view key) {
  if (object == nullptr) return std::nullopt;
  const json::Value* value = object->Find(key);
  if (value == nullptr || !value->is_string()) return std::nullopt;
  return value->as_string();
}

const json::Value* FindObject(const json::Value* object, absl::string_view key) {
  if (object == nullptr) return nullptr;
  const json::Value* value = object->Find(key);
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
  return t;
}

std::vector<StepUsage> ReadSteps(const json::Value* activations) {
  std::vector<StepUsage> steps;
  const json::Value* list = activations == nullptr ? nullptr : activations->Find("steps");
  if (list == nullptr) return steps;
  for (const json::Value& entry : list->elements()) {
    const std::optional<uint64_t> raw = FindBytes(&entry, "saved_raw_bytes");
    const std::optional<uint64_t> stored = FindBytes(&entry, "stored_bytes");
    if (!raw.has_value() || !stored.has_value()) continue;
    StepUsage step;
    step.saved_raw_bytes = *raw;
    step.stored_bytes = *stored;
    step.peak_live_raw_bytes = FindBytes(&entry, "peak_live_raw_bytes");
    step.peak_live_stored_bytes = FindBytes(&entry, "peak_live_stored_bytes");
    steps.push_back(step);
  }
  return steps;
}

// Groups "saved_tensors" by producer. A kept tensor stays in memory at its raw size; a reused
// occurrence points at an earlier buffer and stores nothing more.
std::vector<ProducerUsage> ReadProducers(const json::Value* activations) {
  std::vector<ProducerUsage> producers;
  const json::Value* list = activations == nullptr ? nullptr : activations->Find("saved_tensors");
  if (list == nullptr) return producers;
  std::map<std::string, size_t> index;
  for (const json::Value& entry : list->elements()) {
    const std::optional<uint64_t> raw = FindBytes(&entry, "raw_bytes");
    if (!raw.has_value()) continue;
    const std::string producer = FindString(&entry, "producer").value_or("(unknown)");
    const std::string codec = FindString(&entry, "codec").value_or("(unknown)");
    const uint64_t occurrences = FindBytes(&entry, "occurrences").value_or(1);
    const uint64_t reused = std::min(FindBytes(&entry, "reused").value_or(0), occurrences);
    const uint64_t stored_each = FindBytes(&entry, "stored_bytes").value_or(0);

    auto [it, inserted] = index.emplace(producer, producers.size());
    if (inserted) {
      producers.emplace_back();
      producers.back().producer = producer;
    }
    ProducerUsage& usage = producers[it->second];
    ++usage.saved_tensors;
    usage.raw_bytes += *raw * occurrences;
    usage.stored_bytes +=
        codec == "kept" ? *raw * occurrences : stored_each * (occurrences - reused);
    if (std::find(usage.codecs.begin(), usage.codecs.end(), codec) == usage.codecs.end()) {
      usage.codecs.push_back(codec);
    }
  }
  std::stable_sort(producers.begin(), producers.end(),
                   [](const ProducerUsage& a, const ProducerUsage& b) {
                     return a.raw_bytes > b.raw_bytes;
                   });
  return producers;
}

absl::Status ReadError(absl::string_view file, int error_number) {
  const std::string message = absl::StrCat(file, ": cannot read: ", std::strerror(error_number));
  if (error_number == ENOENT) return absl::NotFoundError(message);
  if (error_number == EACCES) return absl::PermissionDeniedError(message);
  return absl::InvalidArgumentError(message);
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

std::string PeakText(const RunReport& report) {
  if (!report.peak_allocated_bytes.has_value()) {
    return "not recorded (no device statistics, e.g. a CPU run)";
  }
  std::string text = FormatBytes(*report.peak_allocated_bytes);
  if (report.budget_bytes.has_value() && *report.budget_bytes > 0) {
    absl::StrAppendFormat(&text, " (%.1f%% of the budget%s)",
                          100.0 * static_cast<double>(*report.peak_allocated_bytes) /
                              static_cast<double>(*report.budget_bytes),
                          *report.peak_allocated_bytes > *report.budget_bytes ? ", OVER" : "");
  }
  return text;
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
  } else {
    AppendRect(svg, x, y - 10, 18, 10, color, label);
  }
  AppendText(svg, x + 24, y, label);
}

// ---------------------------------------------------------------------------------------------
// Commands.

int UsageError(absl::string_view problem, std::string* err) {
  absl::StrAppend(err, "actpack: ", problem, "\n", kUsage);
  return kExitBadInput;
}

int InputError(absl::string_view command, const absl::Status& status, std::string* err) {
  absl::StrAppend(err, "actpack ", command, ": ", status.message(), "\n");
  return kExitBadInput;
}

absl::Status WriteFile(const std::string& path, absl::string_view contents) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
  }
  const size_t written = std::fwrite(contents.data(), 1, contents.size(), file);
  const bool closed = std::fclose(file) == 0;
  if (written != contents.size() || !closed) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot write: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

int ReportCommand(const std::vector<std::string>& args, std::string* out, std::string* err) {
  std::vector<std::string> files;
  bool as_json = false;
  for (const std::string& arg : args) {
    if (arg == "--json") {
      as_json = true;
    } else if (!arg.empty() && arg[0] == '-') {
      return UsageError(absl::StrCat("report: unknown option '", arg, "'"), err);
    } else {
      files.push_back(arg);
    }
  }
  if (files.size() != 1) return UsageError("report takes one RUN.json", err);
  absl::StatusOr<RunReport> report = LoadRunReport(files[0]);
  if (!report.ok()) return InputError("report", report.status(), err);
  absl::StrAppend(out, as_json ? json::Serialize(SummarizeReport(*report)) + "\n"
                               : FormatReportText(*report));
  return kExitOk;
}

int DiffCommand(const std::vector<std::string>& args, std::string* out, std::string* err) {
  for (const std::string& arg : args) {
    if (!arg.empty() && arg[0] == '-') {
      return UsageError(absl::StrCat("diff: unknown option '", arg, "'"), err);
    }
  }
  if (args.size() != 2) return UsageError("diff takes two reports: BEFORE.json AFTER.json", err);
  absl::StatusOr<RunReport> before = LoadRunReport(args[0]);
  if (!before.ok()) return InputError("diff", before.status(), err);
  absl::StatusOr<RunReport> after = LoadRunReport(args[1]);
  if (!after.ok()) return InputError("diff", after.status(), err);
  absl::StrAppend(out, FormatDiffText(*before, *after));
  return kExitOk;
}

int PlotCommand(const std::vector<std::string>& args, std::string* out, std::string* err) {
  std::vector<std::string> files;
  std::string output;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-o" || args[i] == "--output") {
      if (i + 1 >= args.size()) return UsageError("plot: -o needs a file name", err);
      output = args[++i];
    } else if (!args[i].empty() && args[i][0] == '-') {
      return UsageError(absl::StrCat("plot: unknown option '", args[i], "'"), err);
    } else {
      files.push_back(args[i]);
    }
  }
  if (files.size() != 1) return UsageError("plot takes one RUN.json", err);
  if (output.empty()) return UsageError("plot needs -o MEMORY.svg", err);
  absl::StatusOr<RunReport> report = LoadRunReport(files[0]);
  if (!report.ok()) return InputError("plot", report.status(), err);
  if (absl::Status written = WriteFile(output, RenderMemorySvg(*report)); !written.ok()) {
    return InputError("plot", written, err);
  }
  absl::StrAppend(out, "wrote ", output, "\n");
  return kExitOk;
}

int PlanCommand(const std::vector<std::string>& args, std::string* out, std::string* err) {
  std::vector<std::string> files;
  std::string budget;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--budget") {
      if (i + 1 >= args.size()) return UsageError("plan: --budget needs a size such as 12GiB", err);
      budget = args[++i];
    } else if (!args[i].empty() && args[i][0] == '-') {
      return UsageError(absl::StrCat("plan: unknown option '", args[i], "'"), err);
    } else {
      files.push_back(args[i]);
    }
  }
  if (files.size() != 1) return UsageError("plan takes one RUN.json", err);
  if (budget.empty()) return UsageError("plan needs --budget SIZE (e.g. 12GiB)", err);
  absl::StatusOr<uint64_t> budget_bytes = runtime::ParseByteSize(budget);
  if (!budget_bytes.ok()) {
    absl::string_view problem = budget_bytes.status().message();
    absl::ConsumePrefix(&problem, "actpack: ");
    return UsageError(absl::StrCat("plan --budget: ", problem), err);
  }
  absl::StatusOr<RunReport> report = LoadRunReport(files[0]);
  if (!report.ok()) return InputError("plan", report.status(), err);
  // Re-planning needs the planner's fixed and per-sample memory model; without it any batch
  // size printed here would be invented.
  if (report->document.Find("planner") == nullptr) {
    absl::StrAppend(err, "actpack plan: ", report->file,
                    ": run report has no planner profile; re-planning for ",
                    FormatBytes(*budget_bytes),
                    " needs a run with the batch-size planner (not in this report version)\n");
    return kExitBadInput;
  }
  absl::StrAppend(err, "actpack plan: ", report->file,
                  ": the report has a planner section, but this actpack cannot re-plan from it "
                  "yet\n");
  return kExitBadInput;
}

}  // namespace

uint64_t RunReport::StepCountForAverages() const {
  if (!steps.empty()) return steps.size();
  return 1;
}

std::string RunReport::FileName() const {
  const size_t slash = file.find_last_of('/');
  return slash == std::string::npos ? file : file.substr(slash + 1);
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
  const json::Value* version = document->Find("schema_version");
  if (version == nullptr || !version->is_int()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": run report without an integer \"schema_version\""));
  }
  if (version->as_int() != kReportSchemaVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat(file, ": unsupported run report schema_version ", version->as_int(),
                     " (this actpack reads version ", kReportSchemaVersion, ")"));
  }

  RunReport report;
  report.file = std::string(file);
  report.document = *std::move(document);
  const json::Value* run = FindObject(&report.document, "run");
  report.torch_version = FindString(run, "torch");
  report.device = FindString(run, "device");
  report.budget_text = FindString(run, "budget");
  report.budget_bytes = FindBytes(run, "budget_bytes");
  report.codec = FindString(run, "codec");
  report.peak_allocated_bytes = FindBytes(run, "peak_allocated_bytes");
  report.wall_seconds = FindDouble(run, "wall_seconds");
  if (const json::Value* warnings = run == nullptr ? nullptr : run->Find("warnings")) {
    for (const json::Value& warning : warnings->elements()) {
      if (warning.is_string()) report.warnings.push_back(warning.as_string());
    }
  }
  const json::Value* activations = FindObject(&report.document, "activations");
  report.has_activations = activations != nullptr;
  report.activation_codec = FindString(activations, "codec");
  report.totals = ReadTotals(FindObject(activations, "totals"));
  report.steps = ReadSteps(activations);
  report.producers = ReadProducers(activations);
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

std::string FormatReportText(const RunReport& report, size_t max_producers) {
  std::string text = absl::StrCat("actpack run report: ", report.FileName(), "\n\nrun\n");
  TextTable run;
  run.AddRow({"torch", OrUnknown(report.torch_version)});
  run.AddRow({"device", OrUnknown(report.device)});
  run.AddRow({"codec", OrUnknown(report.codec)});
  run.AddRow({"budget", BudgetText(report)});
  run.AddRow({"peak allocated", PeakText(report)});
  if (report.wall_seconds.has_value()) {
    run.AddRow({"wall time", absl::StrFormat("%.2f s", *report.wall_seconds)});
  }
  absl::StrAppend(&text, run.Render());

  if (report.has_activations) {
    absl::StrAppend(&text, "\nactivations (codec ",
                    report.activation_codec.value_or(report.codec.value_or("?")), ", ",
                    report.steps.size(), report.steps.size() == 1 ? " step" : " steps", ")\n");
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

  if (!report.producers.empty()) {
    const uint64_t steps = report.StepCountForAverages();
    absl::StrAppend(&text, "\ntop consumers by producer (bytes per step, average over ", steps,
                    steps == 1 ? " step" : " steps", ")\n");
    TextTable table({1, 2, 3, 4});
    table.AddRow({"producer", "tensors", "raw", "stored", "ratio", "codec"});
    const size_t shown = std::min(max_producers, report.producers.size());
    for (size_t i = 0; i < shown; ++i) {
      const ProducerUsage& p = report.producers[i];
      table.AddRow({p.producer, absl::StrCat(p.saved_tensors), FormatBytes(p.raw_bytes / steps),
                    FormatBytes(p.stored_bytes / steps), RatioOf(p.raw_bytes, p.stored_bytes),
                    absl::StrJoin(p.codecs, "+")});
    }
    absl::StrAppend(&text, table.Render());
    if (shown < report.producers.size()) {
      uint64_t rest_raw = 0;
      for (size_t i = shown; i < report.producers.size(); ++i) {
        rest_raw += report.producers[i].raw_bytes;
      }
      absl::StrAppend(&text, "  (", report.producers.size() - shown, " more producers, ",
                      FormatBytes(rest_raw / steps), " raw per step)\n");
    }
  }

  absl::StrAppend(&text, "\nwarnings\n");
  if (report.warnings.empty()) absl::StrAppend(&text, "  none\n");
  for (const std::string& warning : report.warnings) absl::StrAppend(&text, "  ", warning, "\n");
  return text;
}

json::Value SummarizeReport(const RunReport& report) {
  json::Value summary = json::Value::Object();
  summary.Set("schema", "actpack.report_summary");
  summary.Set("schema_version", 1);
  summary.Set("file", report.file);

  json::Value run = json::Value::Object();
  if (report.torch_version) run.Set("torch", *report.torch_version);
  if (report.device) run.Set("device", *report.device);
  if (report.codec) run.Set("codec", *report.codec);
  if (report.budget_text) run.Set("budget", *report.budget_text);
  if (report.budget_bytes) run.Set("budget_bytes", *report.budget_bytes);
  run.Set("peak_allocated_bytes", report.peak_allocated_bytes.has_value()
                                      ? json::Value(*report.peak_allocated_bytes)
                                      : json::Value());
  if (report.wall_seconds) run.Set("wall_seconds", *report.wall_seconds);
  summary.Set("run", std::move(run));

  if (report.has_activations) {
    json::Value activations = json::Value::Object();
    if (report.activation_codec) activations.Set("codec", *report.activation_codec);
    activations.Set("steps", report.steps.size());
    if (const StepUsage* step = LargestStep(report)) {
      json::Value largest = json::Value::Object();
      largest.Set("saved_raw_bytes", step->saved_raw_bytes);
      largest.Set("stored_bytes", step->stored_bytes);
      largest.Set("ratio", step->stored_bytes == 0 ? json::Value()
                                                   : json::Value(static_cast<double>(
                                                                     step->saved_raw_bytes) /
                                                                 step->stored_bytes));
      activations.Set("largest_step", std::move(largest));
    }
    json::Value totals = json::Value::Object();
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
      if (value->has_value()) totals.Set(name, **value);
    }
    if (t.ratio) totals.Set("ratio", *t.ratio);
    activations.Set("totals", std::move(totals));
    summary.Set("activations", std::move(activations));
  }

  json::Value producers = json::Value::Array();
  const uint64_t steps = report.StepCountForAverages();
  for (const ProducerUsage& p : report.producers) {
    json::Value entry = json::Value::Object();
    entry.Set("producer", p.producer);
    entry.Set("saved_tensors", p.saved_tensors);
    entry.Set("raw_bytes_per_step", p.raw_bytes / steps);
    entry.Set("stored_bytes_per_step", p.stored_bytes / steps);
    json::Value codecs = json::Value::Array();
    for (const std::string& codec : p.codecs) codecs.Append(codec);
    entry.Set("codecs", std::move(codecs));
    producers.Append(std::move(entry));
  }
  summary.Set("producers", std::move(producers));

  json::Value warnings = json::Value::Array();
  for (const std::string& warning : report.warnings) warnings.Append(warning);
  summary.Set("warnings", std::move(warnings));
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
    table.AddRow({std::string(label), a ? FormatBytes(*a) : "(not recorded)",
                  b ? FormatBytes(*b) : "(not recorded)", a && b ? SignedBytes(*a, *b) : ""});
  };
  auto add_count = [&](absl::string_view label, const std::optional<uint64_t>& a,
                       const std::optional<uint64_t>& b) {
    if (!a.has_value() && !b.has_value()) return;
    table.AddRow({std::string(label), a ? absl::StrCat(*a) : "(not recorded)",
                  b ? absl::StrCat(*b) : "(not recorded)", a && b ? SignedCount(*a, *b) : ""});
  };
  auto optional_ratio = [](const ActivationTotals& t) -> std::optional<double> {
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
  const std::optional<double> ratio_a = optional_ratio(before.totals);
  const std::optional<double> ratio_b = optional_ratio(after.totals);
  if (ratio_a || ratio_b) {
    std::string change;
    if (ratio_a && ratio_b && *ratio_a > 0) {
      change = Ratio(*ratio_a) == Ratio(*ratio_b)
                   ? "="
                   : absl::StrFormat("%+.1f%%", (*ratio_b / *ratio_a - 1.0) * 100.0);
    }
    table.AddRow({"packed ratio", ratio_a ? Ratio(*ratio_a) : "(not recorded)",
                  ratio_b ? Ratio(*ratio_b) : "(not recorded)", change});
  }
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
  add_count("steps", before.steps.size(), after.steps.size());
  add_count("warnings", before.warnings.size(), after.warnings.size());
  absl::StrAppend(&text, table.Render());

  if (!before.producers.empty() || !after.producers.empty()) {
    absl::StrAppend(&text, "\nstored bytes per step by producer\n");
    TextTable producers({1, 2});
    producers.AddRow({"producer", "before", "after", "change"});
    const uint64_t steps_a = before.StepCountForAverages();
    const uint64_t steps_b = after.StepCountForAverages();
    // Producers of `before` in its order, then those only `after` has.
    std::vector<std::string> names;
    for (const ProducerUsage& p : before.producers) names.push_back(p.producer);
    for (const ProducerUsage& p : after.producers) {
      if (std::find(names.begin(), names.end(), p.producer) == names.end()) {
        names.push_back(p.producer);
      }
    }
    auto find = [](const RunReport& report, const std::string& name) -> const ProducerUsage* {
      for (const ProducerUsage& p : report.producers) {
        if (p.producer == name) return &p;
      }
      return nullptr;
    };
    for (const std::string& name : names) {
      const ProducerUsage* pa = find(before, name);
      const ProducerUsage* pb = find(after, name);
      const std::string cell_a = pa ? FormatBytes(pa->stored_bytes / steps_a) : "(absent)";
      const std::string cell_b = pb ? FormatBytes(pb->stored_bytes / steps_b) : "(absent)";
      std::string change = pa && pb ? SignedBytes(pa->stored_bytes / steps_a,
                                                  pb->stored_bytes / steps_b)
                                    : (pa ? "only before" : "only after");
      producers.AddRow({name, cell_a, cell_b, change});
    }
    absl::StrAppend(&text, producers.Render());
  }
  return text;
}

std::string RenderMemorySvg(const RunReport& report) {
  constexpr double kWidth = 960;
  constexpr double kLeft = 100;   // room for byte tick labels
  constexpr double kRight = 40;
  constexpr double kStepTop = 80;
  constexpr double kStepHeight = 240;
  constexpr double kProducerLeft = 220;  // room for producer names
  constexpr double kRowHeight = 28;
  constexpr size_t kMaxProducers = 10;

  const size_t producer_rows = std::max<size_t>(1, std::min(kMaxProducers, report.producers.size()));
  const double producer_top = kStepTop + kStepHeight + 110;
  const double producer_height = producer_rows * kRowHeight;
  const double height = producer_top + producer_height + 70;

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
  if (report.budget_bytes) facts.push_back(absl::StrCat("budget ", FormatBytes(*report.budget_bytes)));
  if (!facts.empty()) absl::StrAppend(&title, " (", absl::StrJoin(facts, ", "), ")");
  AppendText(&svg, kWidth / 2, 28, title, "middle", " font-size=\"16\" font-weight=\"bold\"");

  // Panel 1: bytes saved for backward per step, raw vs stored, with the budget line.
  const double plot_left = kLeft;
  const double plot_width = kWidth - kLeft - kRight;
  const double plot_bottom = kStepTop + kStepHeight;
  AppendText(&svg, plot_left, kStepTop - 26, "activations saved for backward, per training step",
             "start", " font-size=\"13\" font-weight=\"bold\"");
  // Legend, right-aligned above the plot.
  {
    double x = kWidth - kRight - 430;
    AppendLegendEntry(&svg, x, kStepTop - 24, kRawColor, "saved raw (without actpack)");
    AppendLegendEntry(&svg, x + 200, kStepTop - 24, kStoredColor, "stored by actpack");
    if (report.budget_bytes) {
      AppendLegendEntry(&svg, x + 340, kStepTop - 24, kBudgetColor, "budget", true);
    }
  }
  if (report.steps.empty()) {
    AppendText(&svg, plot_left + plot_width / 2, kStepTop + kStepHeight / 2,
               "no per-step data in this report", "middle");
  } else {
    double max_bytes = 0;
    for (const StepUsage& step : report.steps) {
      max_bytes = std::max({max_bytes, static_cast<double>(step.saved_raw_bytes),
                            static_cast<double>(step.stored_bytes)});
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
                 absl::StrCat("step ", i, ": saved raw ", FormatBytes(step.saved_raw_bytes)));
      AppendRect(&svg, x + bar, y_of(step.stored_bytes), bar,
                 plot_bottom - y_of(step.stored_bytes), kStoredColor,
                 absl::StrCat("step ", i, ": stored ", FormatBytes(step.stored_bytes)));
      if (i % label_every == 0) {
        AppendText(&svg, plot_left + (i + 0.5) * slot, plot_bottom + 16, absl::StrCat(i),
                   "middle");
      }
    }
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

  // Panel 2: per-producer bytes per step, raw vs stored, as horizontal bars.
  const uint64_t steps = report.StepCountForAverages();
  const double bars_left = kProducerLeft;
  const double bars_width = kWidth - kProducerLeft - kRight - 170;  // room for value labels
  const double bars_bottom = producer_top + producer_height;
  AppendText(&svg, plot_left, producer_top - 30,
             absl::StrCat("top consumers by producer (bytes per step, average over ", steps,
                          steps == 1 ? " step)" : " steps)"),
             "start", " font-size=\"13\" font-weight=\"bold\"");
  if (report.producers.empty()) {
    AppendText(&svg, bars_left + bars_width / 2, producer_top + kRowHeight / 2,
               "no saved tensors in this report", "middle");
  } else {
    const ByteAxis axis =
        NiceByteAxis(static_cast<double>(report.producers.front().raw_bytes) / steps);
    auto x_of = [&](double bytes) { return bars_left + bytes / axis.top * bars_width; };
    for (double tick = 0; tick <= axis.top * (1 + 1e-9); tick += axis.step) {
      const double x = x_of(tick);
      AppendLine(&svg, x, producer_top, x, bars_bottom, "#e5e5e5");
      AppendText(&svg, x, bars_bottom + 16, axis.Label(tick), "middle");
    }
    for (size_t i = 0; i < producer_rows; ++i) {
      const ProducerUsage& p = report.producers[i];
      const double raw = static_cast<double>(p.raw_bytes) / steps;
      const double stored = static_cast<double>(p.stored_bytes) / steps;
      const double y = producer_top + i * kRowHeight + 4;
      AppendText(&svg, bars_left - 8, y + 14, p.producer, "end");
      AppendRect(&svg, bars_left, y, x_of(raw) - bars_left, 10, kRawColor,
                 absl::StrCat(p.producer, ": raw ", FormatBytes(p.raw_bytes / steps)));
      AppendRect(&svg, bars_left, y + 10, x_of(stored) - bars_left, 10, kStoredColor,
                 absl::StrCat(p.producer, ": stored ", FormatBytes(p.stored_bytes / steps), " (",
                              absl::StrJoin(p.codecs, "+"), ")"));
      AppendText(&svg, x_of(raw) + 6, y + 14,
                 absl::StrCat(FormatBytes(p.stored_bytes / steps), " stored of ",
                              FormatBytes(p.raw_bytes / steps)),
                 "start", " font-size=\"10\" fill=\"#555555\"");
    }
  }
  AppendLine(&svg, bars_left, producer_top, bars_left, bars_bottom, "#333333");
  AppendLine(&svg, bars_left, bars_bottom, bars_left + bars_width, bars_bottom, "#333333");
  AppendText(&svg, bars_left + bars_width / 2, bars_bottom + 36,
             "bytes per step (grey: saved raw, blue: stored by actpack)", "middle");
  absl::StrAppend(&svg, "</svg>\n");
  return svg;
}

int RunCli(const std::vector<std::string>& args, std::string* out, std::string* err) {
  if (args.empty()) return UsageError("no command given", err);
  const std::string& command = args[0];
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (command == "help" || command == "--help" || command == "-h") {
    absl::StrAppend(out, kUsage);
    return kExitOk;
  }
  if (command == "report") return ReportCommand(rest, out, err);
  if (command == "diff") return DiffCommand(rest, out, err);
  if (command == "plot") return PlotCommand(rest, out, err);
  if (command == "plan") return PlanCommand(rest, out, err);
  return UsageError(absl::StrCat("unknown command '", command, "'"), err);
}

}  // namespace actpack::tools

// Tests of the actpack CLI over reports written by real runs of the runtime: reading (and
// refusing) reports, `report`, `diff` and the command line. plan_test.cc, svg_test.cc and
// snapshot_test.cc test `plan`, `plot` and `snapshot` over the same fixtures.
//
// report/testdata/run_quant2.json and run_quant4.json are version-1 reports (no module, planner
// or allocator sections) from an earlier demo, kept to test that older reports still read:
//   R=$PWD; cd /tmp
//   python3 $R/tools/demo.py --steps 10 --report $R/report/testdata/run_quant2.json
//   python3 $R/tools/demo.py --steps 10 --codec quant4 --report $R/report/testdata/run_quant4.json
//
// report/testdata/run_quant2_full.json is a real run of today's demo with every section the
// runtime writes (modules with measured errors, policy, allocator stats and snapshot, the
// planner with a verified step): python3 report/testdata/make_full_report.py
//
// After regenerating fixtures (or changing the text format on purpose), rewrite the goldens
// from the repository root:
//   bazel run //tools:actpack -- report $PWD/report/testdata/run_quant2.json > report/testdata/report.golden
//   bazel run //tools:actpack -- report $PWD/report/testdata/run_quant2_full.json > report/testdata/report_full.golden
//   bazel run //tools:actpack -- plan $PWD/report/testdata/run_quant2_full.json --budget 12GiB > report/testdata/plan_full.golden
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/version.h"
#include "gtest/gtest.h"
#include "report/cli.h"
#include "report/cli_test_util.h"
#include "report/reader.h"
#include "runtime/json.h"

namespace actpack::report {
namespace {

TEST(ReportTest, ReadsRealRunReport) {
  absl::StatusOr<RunReport> report = LoadRunReport(kQuant2Report);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->codec, "quant2");
  EXPECT_EQ(report->budget_bytes, uint64_t{256} << 20);
  EXPECT_FALSE(report->peak_allocated_bytes.has_value());  // null on a CPU run
  EXPECT_EQ(report->steps.size(), 10u);
  ASSERT_FALSE(report->producers.empty());
  // Grouping by producer loses no byte: every saved byte was packed, kept or reused.
  uint64_t producer_raw = 0;
  for (const ConsumerUsage& p : report->producers) producer_raw += p.raw_bytes;
  EXPECT_EQ(producer_raw, *report->totals.packed_raw_bytes + *report->totals.kept_bytes +
                              *report->totals.reused_bytes);
  // And the producers' stored bytes are what the steps stored.
  uint64_t producer_stored = 0;
  for (const ConsumerUsage& p : report->producers) producer_stored += p.stored_bytes;
  uint64_t step_stored = 0;
  for (const StepUsage& step : report->steps) step_stored += step.stored_bytes;
  EXPECT_EQ(producer_stored, step_stored);
  for (size_t i = 1; i < report->producers.size(); ++i) {
    EXPECT_GE(report->producers[i - 1].raw_bytes, report->producers[i].raw_bytes);
  }
}

TEST(ReportTest, TextMatchesGolden) {
  const CliResult result = RunActpack({"report", kQuant2Report});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_EQ(result.out, ReadText(kGolden))
      << "regenerate with the command at the top of report/report_test.cc if intended";
}

TEST(ReportTest, TextNamesBudgetPeakRatioConsumersAndWarnings) {
  const CliResult result = RunActpack({"report", kQuant4Report});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  for (const char* expected :
       {"budget           256.00 MiB", "peak allocated", "packed over the run",
        "top consumers by producer", "ConvolutionBackward0", "quant4", "kept", "warnings"}) {
    EXPECT_TRUE(absl::StrContains(result.out, expected)) << expected << "\n" << result.out;
  }
}

TEST(ReportTest, JsonSummaryIsMachineReadable) {
  const CliResult result = RunActpack({"report", kQuant2Report, "--json"});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  absl::StatusOr<json::Value> summary = json::Parse(result.out);
  ASSERT_TRUE(summary.ok()) << summary.status();
  EXPECT_EQ(json::Find(*summary, "schema")->get_ref<const std::string&>(),
            "actpack.report_summary");
  const json::Value* run = json::Find(*summary, "run");
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(json::Find(*run, "budget_bytes")->get<int64_t>(), int64_t{256} << 20);
  EXPECT_TRUE(json::Find(*run, "peak_allocated_bytes")->is_null());
  const json::Value* totals = json::Find((*json::Find(*summary, "activations")), "totals");
  absl::StatusOr<RunReport> report = LoadRunReport(kQuant2Report);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(static_cast<uint64_t>(json::Find(*totals, "packed_raw_bytes")->get<int64_t>()),
            *report->totals.packed_raw_bytes);
  const json::Value* producers = json::Find(*summary, "producers");
  ASSERT_EQ(producers->size(), report->producers.size());
  EXPECT_EQ(json::Find((*producers)[0], "producer")->get_ref<const std::string&>(),
            report->producers[0].name);
}

TEST(ReportTest, MissingOptionalSectionsAreNotPrinted) {
  const std::string path = WriteTemp(
      "bare.json", R"({"schema": "actpack.report", "schema_version": 1, "future": {"x": 1}})");
  const CliResult result = RunActpack({"report", path});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  EXPECT_FALSE(absl::StrContains(result.out, "activations"));
  EXPECT_FALSE(absl::StrContains(result.out, "top consumers"));
  EXPECT_TRUE(absl::StrContains(result.out, "warnings\n  none"));
  // Ill-typed optional fields read as absent, not as a crash.
  const std::string odd = WriteTemp(
      "odd.json", R"({"schema": "actpack.report", "schema_version": 1, "run": [1],
                      "activations": {"totals": 3, "steps": {"a": 1},
                                      "saved_tensors": [1, {"raw_bytes": "x"}, {}]}})");
  const CliResult odd_result = RunActpack({"report", odd});
  EXPECT_EQ(odd_result.exit_code, kExitOk) << odd_result.err;
  const std::string svg = TempPath("bare.svg");
  EXPECT_EQ(RunActpack({"plot", path, "-o", svg}).exit_code, kExitOk);
}

TEST(DiffTest, ShowsWhatChangedBetweenCodecs) {
  const CliResult result = RunActpack({"diff", kQuant2Report, kQuant4Report});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  const std::string& text = result.out;
  EXPECT_TRUE(absl::StrContains(text, "run_quant2.json -> run_quant4.json"));
  for (const char* expected : {"codec", "quant2", "quant4", "changed", "packed ratio", "15.05x",
                               "7.75x", "-48.5%", "stored bytes per step by producer",
                               "ConvolutionBackward0", "(+94.0%)"}) {
    EXPECT_TRUE(absl::StrContains(text, expected)) << expected << "\n" << text;
  }
  // What the codec does not touch stays the same: raw bytes and the kept log-probabilities.
  bool saw_kept_row = false;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StrContains(line, "packed raw (run)") || absl::StrContains(line, "kept (run)") ||
        absl::StrContains(line, "LogSoftmaxBackward0")) {
      EXPECT_TRUE(absl::EndsWith(line, "=")) << line;
      saw_kept_row = true;
    }
  }
  EXPECT_TRUE(saw_kept_row);
}

TEST(DiffTest, SameReportHasNoChanges) {
  const CliResult result = RunActpack({"diff", kQuant2Report, kQuant2Report});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  for (absl::string_view line : absl::StrSplit(result.out, '\n')) {
    EXPECT_FALSE(absl::StrContains(line, "changed")) << line;
    EXPECT_FALSE(absl::StrContains(line, "%")) << line;
  }
}

// Every unreadable or foreign file: exit 2, nothing on stdout, one line on stderr that names
// the file and the problem.
TEST(ErrorTest, BadFilesGiveOneLineAndExitTwo) {
  const std::string real = ReadText(kQuant2Report);
  struct Case {
    std::string path;
    std::string problem;
  };
  const std::vector<Case> cases = {
      {WriteTemp("not_json.json", "hello, this is not JSON\n"), "not JSON"},
      {WriteTemp("truncated.json", real.substr(0, real.size() / 2)), "truncated JSON"},
      {WriteTemp("empty.json", ""), "empty file"},
      {WriteTemp("foreign.json", R"({"schema": "something.else", "schema_version": 1})"),
       "not an actpack run report (schema \"something.else\""},
      {WriteTemp("no_schema.json", R"({"traceEvents": []})"), "no \"schema\" member"},
      {WriteTemp("array.json", "[1, 2]"), "not a JSON object"},
      {WriteTemp("version.json", R"({"schema": "actpack.report", "schema_version": 3})"),
       "unsupported run report schema_version 3 (this actpack reads versions 1 to 2)"},
      {TempPath("does_not_exist.json"), "cannot read: No such file or directory"},
      {std::getenv("TEST_TMPDIR") != nullptr ? std::getenv("TEST_TMPDIR") : "/tmp",
       "cannot read"},
  };
  for (const Case& c : cases) {
    for (const std::vector<std::string>& args :
         std::vector<std::vector<std::string>>{{"report", c.path},
                                               {"report", c.path, "--json"},
                                               {"diff", kQuant2Report, c.path},
                                               {"plot", c.path, "-o", TempPath("x.svg")},
                                               {"plan", c.path, "--budget", "1GiB"},
                                               {"snapshot", c.path, "-o", TempPath("x.pickle")}}) {
      const CliResult result = RunActpack(args);
      EXPECT_EQ(result.exit_code, kExitBadInput) << c.path;
      EXPECT_EQ(result.out, "") << c.path;
      EXPECT_EQ(LineCount(result.err), 1u) << result.err;
      EXPECT_TRUE(absl::StrContains(result.err, c.path)) << result.err;
      EXPECT_TRUE(absl::StrContains(result.err, c.problem)) << result.err;
    }
  }
}

// The usage text, read back from the command line's declarations.
constexpr char kUsage[] =
    "usage: actpack <command> [options]\n"
    "  actpack report RUN.json [--json]               where the memory went (--json: for "
    "machines)\n"
    "  actpack diff BEFORE.json AFTER.json            what changed between two runs\n"
    "  actpack plot RUN.json -o MEMORY.svg            per-step and per-module bytes as an SVG\n"
    "  actpack plan RUN.json --budget SIZE [--json]   the largest batch per choice at another "
    "budget\n"
    "  actpack snapshot RUN.json -o SNAP.pickle       the allocator snapshot for "
    "pytorch.org/memory_viz\n";

// Every usage error exits 2 with nothing on stdout and, on stderr, one line "actpack: ..." that
// names what was given and what was expected (the command's synopsis leads a problem with its
// arguments), then the usage.
TEST(CommandLineTest, UsageErrorsNameTheProblemThenShowTheUsage) {
  const std::string quant4 = kQuant4Report;
  struct Case {
    std::vector<std::string> args;
    std::vector<std::string> named;  // in the first line
  };
  const std::vector<Case> cases = {
      // No command, or no known one.
      {{}, {"no command given"}},
      {{"frobnicate"}, {"command: frobnicate not in {report,diff,plot,plan,snapshot}"}},
      {{"help"}, {"command: help not in {report,diff,plot,plan,snapshot}"}},
      {{"--bogus"}, {"not expected: --bogus"}},
      // An unknown option.
      {{"report", kQuant2Report, "--yaml"}, {"report RUN.json [--json]: ", "not expected: --yaml"}},
      {{"plot", kQuant2Report, "-x", "-o", "m.svg"},
       {"plot RUN.json -o MEMORY.svg: ", "not expected: -x"}},
      {{"report", kQuant2Report, "--version"}, {"not expected: --version"}},
      // Too few files, too many.
      {{"report"}, {"report RUN.json [--json]: RUN.json is required"}},
      {{"diff"}, {"diff BEFORE.json AFTER.json: BEFORE.json is required"}},
      {{"diff", kQuant2Report}, {"diff BEFORE.json AFTER.json: AFTER.json is required"}},
      {{"report", kQuant2Report, kQuant4Report},
       {"report RUN.json [--json]: ", "not expected: " + quant4}},
      {{"diff", kQuant2Report, kQuant2Report, kQuant4Report},
       {"diff BEFORE.json AFTER.json: ", "not expected: " + quant4}},
      {{"snapshot", kFullReport, kQuant4Report, "-o", "x.pickle"},
       {"snapshot RUN.json -o SNAP.pickle: ", "not expected: " + quant4}},
      // One command at a time (CLI11 2.1.2 lists several unexpected arguments last to first).
      {{"report", kQuant2Report, "diff", kQuant2Report, kQuant4Report},
       {"report RUN.json [--json]: ", "arguments were not expected: ", " diff"}},
      // A required option missing: the synopsis shows its value.
      {{"plot", kQuant2Report}, {"plot RUN.json -o MEMORY.svg: --output is required"}},
      {{"plan", kQuant2Report}, {"plan RUN.json --budget SIZE [--json]: --budget is required"}},
      {{"snapshot", kFullReport}, {"snapshot RUN.json -o SNAP.pickle: --output is required"}},
      // An option without its value.
      {{"plot", kQuant2Report, "-o"}, {"--output: 1 required MEMORY.svg missing"}},
      {{"plot", kQuant2Report, "--output"}, {"--output: 1 required MEMORY.svg missing"}},
      {{"plot", kQuant2Report, "-o="}, {"--output: 1 required MEMORY.svg missing"}},
      {{"plan", kQuant2Report, "--budget"}, {"--budget: 1 required SIZE missing"}},
      {{"plan", kQuant2Report, "--budget="}, {"--budget: 1 required SIZE missing"}},
      {{"snapshot", kFullReport, "-o"}, {"--output: 1 required SNAP.pickle missing"}},
      // An option given twice, in any of its spellings.
      {{"plan", kQuant2Report, "--budget", "1GiB", "--budget", "2GiB"},
       {"--budget: At Most 1 required but received 2"}},
      {{"plot", kQuant2Report, "-o", "a.svg", "--output=b.svg"},
       {"--output: At Most 1 required but received 2"}},
      {{"report", kQuant2Report, "--json", "--json"},
       {"--json: At Most 1 required but received 2"}},
      {{"plan", kQuant2Report, "--json", "--budget=1GiB", "--json"},
       {"--json: At Most 1 required but received 2"}},
      // A flag given a value.
      {{"report", kQuant2Report, "--json=yes"}, {"json was given a disallowed flag override"}},
      // A budget that is no size (plan's own check).
      {{"plan", kQuant2Report, "--budget", "lots"}, {"plan --budget: invalid memory size 'lots'"}},
      {{"plan", kQuant2Report, "--budget", "0GiB"}, {"plan --budget: invalid memory size '0GiB'"}},
  };
  for (const Case& c : cases) {
    const std::string command_line = absl::StrJoin(c.args, " ");
    const CliResult result = RunActpack(c.args);
    EXPECT_EQ(result.exit_code, kExitBadInput) << command_line;
    EXPECT_EQ(result.out, "") << command_line;
    const size_t newline = result.err.find('\n');
    const std::string first_line = result.err.substr(0, newline);
    EXPECT_TRUE(absl::StartsWith(first_line, "actpack: ")) << command_line << ": " << result.err;
    for (const std::string& named : c.named) {
      EXPECT_TRUE(absl::StrContains(first_line, named)) << command_line << ": " << first_line;
    }
    EXPECT_EQ(result.err.substr(newline + 1), kUsage) << command_line;
  }
}

TEST(CommandLineTest, HelpAndVersionGoToStdout) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--help"}, {"-h"}, {"plot", "--help"}}) {
    const CliResult help = RunActpack(args);
    EXPECT_EQ(help.exit_code, kExitOk) << args[0];
    EXPECT_EQ(help.out, kUsage);
    EXPECT_EQ(help.err, "");
  }
  const CliResult version = RunActpack({"--version"});
  EXPECT_EQ(version.exit_code, kExitOk);
  EXPECT_EQ(version.out, absl::StrCat("actpack ", kVersion, "\n"));
  EXPECT_EQ(version.err, "");
}

// An option's value follows it or an equals sign, and options may come before the file.
TEST(CommandLineTest, OptionValuesInEverySpelling) {
  const std::vector<std::vector<std::string>> spellings = {
      {"-o", "PATH"}, {"-o=PATH"}, {"--output", "PATH"}, {"--output=PATH"}};
  for (size_t i = 0; i < spellings.size(); ++i) {
    const std::string path = TempPath(absl::StrCat("spelling", i, ".svg"));
    std::vector<std::string> options;
    for (const std::string& word : spellings[i]) {
      options.push_back(absl::StrReplaceAll(word, {{"PATH", path}}));
    }
    for (bool options_first : {false, true}) {
      std::remove(path.c_str());
      std::vector<std::string> args = {"plot"};
      if (options_first) args.insert(args.end(), options.begin(), options.end());
      args.push_back(kQuant2Report);
      if (!options_first) args.insert(args.end(), options.begin(), options.end());
      const CliResult result = RunActpack(args);
      EXPECT_EQ(result.exit_code, kExitOk) << absl::StrJoin(args, " ") << ": " << result.err;
      EXPECT_EQ(result.out, absl::StrCat("wrote ", path, "\n"));
      EXPECT_TRUE(absl::StartsWith(ReadText(path), "<?xml")) << path;
    }
  }
}


// ---------------------------------------------------------------------------------------------
// The sections added after version 1 (planner, allocator, module and error per saved tensor),
// on run_quant2_full.json (a real run, see the top of this file).

TEST(FullReportTest, TextMatchesGolden) {
  const CliResult result = RunActpack({"report", kFullReport});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_EQ(result.out, ReadText(kFullGolden))
      << "regenerate with the command at the top of report/report_test.cc if intended";
}

TEST(FullReportTest, ReadsPlannerAndAllocatorSections) {
  absl::StatusOr<RunReport> report = LoadRunReport(kFullReport);
  ASSERT_TRUE(report.ok()) << report.status();
  const json::Value& document = report->document;

  ASSERT_TRUE(report->planner.has_value());
  const json::Value* planner = json::Find(document, "planner");
  EXPECT_EQ(report->planner->budget_bytes, uint64_t{256} << 20);
  EXPECT_EQ(report->planner->batch_sizes, (std::vector<uint64_t>{8, 16, 32}));
  ASSERT_EQ(report->planner->choices.size(), json::Find(*planner, "choices")->size());
  for (const PlannerChoice& choice : report->planner->choices) {
    const json::Value* recorded = json::Find((*json::Find(*planner, "choices")), choice.name);
    ASSERT_NE(recorded, nullptr) << choice.name;
    EXPECT_EQ(choice.fixed_bytes, json::Find(*recorded, "fixed_bytes")->get<int64_t>());
    EXPECT_EQ(choice.per_sample_bytes, json::Find(*recorded, "per_sample_bytes")->get<int64_t>());
    EXPECT_EQ(choice.max_batch_size, json::Find(*recorded, "max_batch_size")->get<int64_t>());
  }
  EXPECT_EQ(report->planner->choices.front().name, "none");  // the report's order
  ASSERT_TRUE(report->planner->verified.has_value());
  EXPECT_EQ(report->planner->verified->codec, "auto");
  EXPECT_DOUBLE_EQ(report->planner->headroom, 0.15);

  ASSERT_TRUE(report->allocator.has_value());
  const json::Value* stats = json::Find((*json::Find(document, "allocator")), "stats");
  EXPECT_EQ(report->allocator->backend, "cpu");
  EXPECT_EQ(report->allocator->budget_bytes, uint64_t{256} << 20);
  EXPECT_EQ(report->allocator->peak_allocated_bytes,
            json::Find(*stats, "allocated_bytes.all.peak")->get<int64_t>());
  EXPECT_EQ(report->allocator->peak_reserved_bytes,
            json::Find(*stats, "reserved_bytes.all.peak")->get<int64_t>());
  ASSERT_TRUE(report->allocator->Fragmentation().has_value());
  EXPECT_DOUBLE_EQ(*report->allocator->Fragmentation(),
                   json::Find(*stats, "reserved_bytes.all.peak")->get<double>() /
                       json::Find(*stats, "allocated_bytes.all.peak")->get<double>());
  EXPECT_GE(*report->allocator->Fragmentation(), 1.0);  // reserved memory holds the allocated
  const json::Value* snapshot = report->Snapshot();
  ASSERT_NE(snapshot, nullptr);
  EXPECT_EQ(report->allocator->snapshot_segments, json::Find(*snapshot, "segments")->size());
  EXPECT_EQ(report->allocator->snapshot_trace_entries,
            (*json::Find(*snapshot, "device_traces"))[0].size());
  EXPECT_GT(report->allocator->snapshot_trace_entries, 100u);
}

TEST(FullReportTest, ModulesRegroupTheSameBytesAndKeepTheWorstError) {
  absl::StatusOr<RunReport> report = LoadRunReport(kFullReport);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_FALSE(report->modules.empty());
  uint64_t module_raw = 0, module_stored = 0, producer_raw = 0, producer_stored = 0;
  for (const ConsumerUsage& m : report->modules) {
    module_raw += m.raw_bytes;
    module_stored += m.stored_bytes;
  }
  for (const ConsumerUsage& p : report->producers) {
    producer_raw += p.raw_bytes;
    producer_stored += p.stored_bytes;
  }
  EXPECT_EQ(module_raw, producer_raw);
  EXPECT_EQ(module_stored, producer_stored);

  // Recompute convs.0 and the fallback to the producer straight from the records.
  double worst_rel_rms = 0, worst_max_abs = 0;
  uint64_t convs0_raw = 0, relu_tensors = 0;
  for (const json::Value& record :
       *json::Find(*json::Find(report->document, "activations"), "saved_tensors")) {
    const json::Value* module = json::Find(record, "module");
    if (module == nullptr &&
        json::Find(record, "producer")->get_ref<const std::string&>() == "ReluBackward0") {
      ++relu_tensors;
    }
    if (module == nullptr || module->get_ref<const std::string&>() != "convs.0") continue;
    convs0_raw += json::Find(record, "raw_bytes")->get<int64_t>() *
                  json::Find(record, "occurrences")->get<int64_t>();
    if (const json::Value* error = json::Find(record, "error")) {
      worst_rel_rms = std::max(worst_rel_rms, json::Find(*error, "rel_rms")->get<double>());
      worst_max_abs = std::max(worst_max_abs, json::Find(*error, "max_abs")->get<double>());
    }
  }
  const ConsumerUsage* convs0 = nullptr;
  const ConsumerUsage* relu = nullptr;
  for (const ConsumerUsage& m : report->modules) {
    if (m.name == "convs.0") convs0 = &m;
    if (m.name == "ReluBackward0") relu = &m;
  }
  ASSERT_NE(convs0, nullptr);
  EXPECT_EQ(convs0->raw_bytes, convs0_raw);
  EXPECT_EQ(convs0->codecs, (std::vector<std::string>{"quant2", "none"}));
  ASSERT_TRUE(convs0->worst_error.has_value());
  EXPECT_EQ(convs0->worst_error->rel_rms, worst_rel_rms);
  EXPECT_EQ(convs0->worst_error->max_abs, worst_max_abs);
  // 2-bit stochastic rounding of Gaussian data: the error is of the order of the signal.
  EXPECT_GT(worst_rel_rms, 0.5);
  EXPECT_LT(worst_rel_rms, 1.0);
  ASSERT_NE(relu, nullptr) << "records without a module fall back to their producer";
  EXPECT_EQ(relu->saved_tensors, relu_tensors);

  const CliResult result = RunActpack({"report", kFullReport});
  EXPECT_TRUE(absl::StrContains(result.out, "top consumers by module")) << result.out;
  EXPECT_FALSE(absl::StrContains(result.out, "top consumers by producer")) << result.out;
}

TEST(FullReportTest, JsonSummaryCarriesTheNewSections) {
  const CliResult result = RunActpack({"report", kFullReport, "--json"});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  absl::StatusOr<json::Value> summary = json::Parse(result.out);
  ASSERT_TRUE(summary.ok()) << summary.status();
  absl::StatusOr<RunReport> report = LoadRunReport(kFullReport);
  ASSERT_TRUE(report.ok());

  const json::Value* modules = json::Find(*summary, "modules");
  ASSERT_NE(modules, nullptr);
  ASSERT_EQ(modules->size(), report->modules.size());
  EXPECT_EQ(json::Find((*modules)[0], "module")->get_ref<const std::string&>(),
            report->modules[0].name);
  bool saw_error = false;
  for (const json::Value& module : *modules) {
    if (const json::Value* error = json::Find(module, "worst_error")) {
      saw_error = true;
      EXPECT_TRUE(json::Find(*error, "rel_rms")->is_number());
    }
  }
  EXPECT_TRUE(saw_error);

  const json::Value* planner = json::Find(*summary, "planner");
  ASSERT_NE(planner, nullptr);
  EXPECT_EQ(
      json::Find((*json::Find((*json::Find(*planner, "choices")), "quant2")), "max_batch_size")
          ->get<int64_t>(),
      json::Find((*json::Find((*json::Find((*json::Find(report->document, "planner")), "choices")),
                              "quant2")),
                 "max_batch_size")
          ->get<int64_t>());
  EXPECT_EQ(json::Find((*json::Find(*planner, "verified")), "codec")->get_ref<const std::string&>(),
            "auto");

  const json::Value* allocator = json::Find(*summary, "allocator");
  ASSERT_NE(allocator, nullptr);
  EXPECT_EQ(json::Find(*allocator, "backend")->get_ref<const std::string&>(), "cpu");
  EXPECT_EQ(static_cast<uint64_t>(json::Find(*allocator, "peak_reserved_bytes")->get<int64_t>()),
            *report->allocator->peak_reserved_bytes);
  EXPECT_DOUBLE_EQ(json::Find(*allocator, "fragmentation")->get<double>(),
                   *report->allocator->Fragmentation());
  EXPECT_EQ(json::Find(*allocator, "num_ooms")->get<int64_t>(), 0);
  EXPECT_EQ(static_cast<uint64_t>(
                json::Find((*json::Find(*allocator, "snapshot")), "trace_entries")->get<int64_t>()),
            report->allocator->snapshot_trace_entries);

  // A version 1 report without the sections: no such members.
  const CliResult old = RunActpack({"report", kQuant2Report, "--json"});
  absl::StatusOr<json::Value> old_summary = json::Parse(old.out);
  ASSERT_TRUE(old_summary.ok());
  for (const char* member : {"modules", "planner", "allocator"}) {
    EXPECT_EQ(json::Find(*old_summary, member), nullptr) << member;
  }
}

TEST(FullReportTest, NullSectionsAndNullErrorsReadAsAbsent) {
  json::Value document = ParseJsonFile(kFullReport);
  document["planner"] = json::Value();
  document["allocator"] = json::Value();
  // The runtime's JSON writer turns a NaN error into null.
  json::Value& record = (*Member(document, {"activations", "saved_tensors"}))[1];
  ASSERT_NE(json::Find(record, "error"), nullptr);
  (*json::Find(record, "error"))["rel_rms"] = json::Value();
  (*Member(document, {"activations", "saved_tensors"}))[3]["module"] = json::Value();
  const std::string path = WriteJsonTemp("null_sections.json", document);
  const CliResult result = RunActpack({"report", path});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  EXPECT_FALSE(absl::StrContains(result.out, "batch-size planner"));
  EXPECT_FALSE(absl::StrContains(result.out, "\nallocator"));
  EXPECT_TRUE(absl::StrContains(result.out, "top consumers by module"));
  EXPECT_EQ(RunActpack({"plan", path, "--budget", "1GiB"}).exit_code, kExitBadInput);
}

// A run longer than the runtime keeps step records for lists its first and last steps,
// numbered, and counts every step in totals.steps: counts and averages use that count; a report
// written before totals counted steps (every step listed) counts its list.
TEST(FullReportTest, ALongRunCountsEveryStepNotTheStepsListed) {
  json::Value document = ParseJsonFile(kFullReport);
  absl::StatusOr<RunReport> before = ReadRunReport(document, "old.json");
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_FALSE(before->steps.empty());
  EXPECT_EQ(before->StepCount(), before->steps.size());
  json::Value& steps = *Member(document, {"activations", "steps"});
  const uint64_t listed = steps.size();
  for (uint64_t i = 0; i < listed; ++i) steps[i]["step"] = 5000 - listed + i;
  (*Member(document, {"activations", "totals"}))["steps"] = uint64_t{5000};
  absl::StatusOr<RunReport> report = ReadRunReport(document, "long.json");
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->StepCount(), 5000u);
  EXPECT_EQ(report->StepCountForAverages(), 5000u);
  EXPECT_EQ(report->steps.back().index, 4999u);
  const std::string path = WriteJsonTemp("long.json", document);
  const CliResult text = RunActpack({"report", path});
  ASSERT_EQ(text.exit_code, kExitOk) << text.err;
  EXPECT_TRUE(absl::StrContains(text.out, "5000 steps")) << text.out;
  const CliResult summary = RunActpack({"report", path, "--json"});
  ASSERT_EQ(summary.exit_code, kExitOk) << summary.err;
  EXPECT_TRUE(absl::StrContains(summary.out, "\"steps\": 5000")) << summary.out;
  const std::string svg = TempPath("long.svg");
  ASSERT_EQ(RunActpack({"plot", path, "-o", svg}).exit_code, kExitOk);
  std::ifstream in(svg);
  const std::string picture((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(absl::StrContains(picture, "step 4999: stored")) << "bars are labelled by index";
}

TEST(FullReportTest, AVerificationWhereNothingFittedReadsAndSaysSo) {
  // actpack.plan(verify=True) where no batch trained under the cap (the first GPU run: the
  // planner's test at 40 MiB on an H100) writes a null peak; the CLI reads it and says so.
  json::Value document = ParseJsonFile(kFullReport);
  json::Value& verified = *Member(document, {"planner", "verified"});
  verified = json::Value::object();
  verified["codec"] = "quant2";
  verified["batch_size"] = 0;
  verified["predicted_batch_size"] = 12;
  verified["smallest_tried"] = 3;
  verified["peak_bytes"] = json::Value();
  verified["peak_allocated_bytes"] = json::Value();
  absl::StatusOr<RunReport> report = ReadRunReport(document, "nothing_fitted.json");
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_TRUE(report->planner->verified.has_value());
  EXPECT_FALSE(report->planner->verified->peak_bytes.has_value());
  EXPECT_EQ(report->planner->verified->smallest_tried, 3u);
  const std::string path = WriteJsonTemp("nothing_fitted.json", document);
  const CliResult text = RunActpack({"report", path});
  ASSERT_EQ(text.exit_code, kExitOk) << text.err;
  EXPECT_TRUE(absl::StrContains(
      text.out, "verified: quant2 did not fit the cap at any batch tried (down to 3)"))
      << text.out;
  const CliResult summary = RunActpack({"report", path, "--json"});
  ASSERT_EQ(summary.exit_code, kExitOk) << summary.err;
  EXPECT_TRUE(absl::StrContains(summary.out, "\"peak_bytes\": null")) << summary.out;
}

TEST(DiffTest, ComparesPlannerBatchSizesAndModules) {
  json::Value document = ParseJsonFile(kFullReport);
  // After: a larger budget, one choice gone, one new; one module stores twice as much.
  ((*Member(document, {"planner"}))["budget_bytes"] = int64_t{512} << 20);
  json::Value* choices = Member(document, {"planner", "choices"});
  const int64_t none_before =
      json::Find((*json::Find(*choices, "none")), "max_batch_size")->get<int64_t>();
  (*json::Find(*choices, "none"))["max_batch_size"] = 290;
  json::Value replacement = json::Value::object();
  for (const auto& member : choices->items()) {
    if (member.key() != "auto") (replacement[member.key()] = member.value());
  }
  json::Value division = json::Value::object();
  division["fixed_bytes"] = int64_t{6} << 20;
  division["per_sample_bytes"] = 600000;
  division["max_batch_size"] = 884;
  replacement["division"] = std::move(division);
  (*Member(document, {"planner"}))["choices"] = std::move(replacement);
  for (json::Value& record : *Member(document, {"activations", "saved_tensors"})) {
    const json::Value* module = json::Find(record, "module");
    if (module != nullptr && module->get_ref<const std::string&>() == "head" &&
        json::Find(record, "codec")->get_ref<const std::string&>() == "quant2") {
      record["stored_bytes"] = json::Find(record, "stored_bytes")->get<int64_t>() * 2;
    }
  }
  (*Member(document, {"allocator", "stats"}))["num_ooms"] = 2;
  const std::string after = WriteJsonTemp("after.json", document);

  const CliResult result = RunActpack({"diff", kFullReport, after});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  const std::string& text = result.out;
  EXPECT_TRUE(absl::StrContains(
      text, "planner: largest batch size by choice (before: 256.00 MiB, after: 512.00 MiB)"))
      << text;
  EXPECT_TRUE(absl::StrContains(text, "stored bytes per step by module")) << text;
  std::map<std::string, std::string> row_end;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    const std::vector<std::string> cells = absl::StrSplit(line, "   ", absl::SkipEmpty());
    if (cells.size() >= 2) row_end[std::string(absl::StripAsciiWhitespace(cells[0]))] =
        std::string(absl::StripAsciiWhitespace(cells.back()));
  }
  EXPECT_EQ(row_end["none"], absl::StrCat("+", 290 - none_before)) << text;
  EXPECT_EQ(row_end["quant2"], "=") << text;
  EXPECT_EQ(row_end["auto"], "only before") << text;
  EXPECT_EQ(row_end["division"], "only after") << text;
  EXPECT_EQ(row_end["convs.0"], "=") << text;
  EXPECT_TRUE(absl::StartsWith(row_end["head"], "+")) << text;
  EXPECT_EQ(row_end["OOMs"], "+2") << text;
  EXPECT_EQ(row_end["allocator peak reserved"], "=") << text;
}

// Ill-typed fields in the checked sections: exit 2 and one line naming the field, for every
// command, never a crash or a silently wrong number.
TEST(ErrorTest, IllTypedNewSectionsGiveOneLineAndExitTwo) {
  const json::Value full = ParseJsonFile(kFullReport);
  struct Case {
    std::string name;
    std::function<void(json::Value&)> mutate;
    std::string message;
  };
  auto set = [](std::vector<std::string> keys, json::Value value) {
    return [keys, value](json::Value& document) {
      const std::string last = keys.back();
      std::vector<std::string> parent(keys.begin(), keys.end() - 1);
      json::Value* object = Member(document, parent);
      ASSERT_NE(object, nullptr) << absl::StrJoin(parent, ".");
      (*object)[last] = value;
    };
  };
  auto erase = [](std::vector<std::string> keys) {
    return [keys](json::Value& document) {
      std::vector<std::string> parent(keys.begin(), keys.end() - 1);
      json::Value* object = Member(document, parent);
      ASSERT_NE(object, nullptr);
      json::Value copy = json::Value::object();
      for (const auto& m : object->items()) {
        if (m.key() != keys.back()) (copy[m.key()] = m.value());
      }
      *object = std::move(copy);
    };
  };
  auto record = [](size_t index, std::string key, json::Value value) {
    return [index, key, value](json::Value& document) {
      (*Member(document, {"activations", "saved_tensors"}))[index][key] = value;
    };
  };
  json::Value bad_sizes = json::Value::array();
  bad_sizes.emplace_back(8);
  bad_sizes.emplace_back("16");
  json::Value nested_stat = json::Value::object();
  nested_stat["current"] = 1;
  json::Value bad_traces = json::Value::array();
  bad_traces.emplace_back(json::Value::object());
  json::Value bad_error = json::Value::object();
  bad_error["rms"] = 0.1;
  bad_error["rel_rms"] = -0.5;
  const std::vector<Case> cases = {
      {"planner_string", set({"planner"}, "soon"),
       "bad run report: planner is the string \"soon\", expected an object or null"},
      {"budget_string", set({"planner", "budget_bytes"}, "12GiB"),
       "planner.budget_bytes is the string \"12GiB\", expected a non-negative integer"},
      {"budget_negative", set({"planner", "budget_bytes"}, -1),
       "planner.budget_bytes is the number -1, expected a non-negative integer"},
      {"budget_missing", erase({"planner", "budget_bytes"}),
       "planner.budget_bytes is missing, expected a non-negative integer"},
      {"batch_size_string", set({"planner", "batch_sizes"}, bad_sizes),
       "planner.batch_sizes[1] is the string \"16\""},
      {"choices_array", set({"planner", "choices"}, json::Value::array()),
       "planner.choices is an array, expected an object"},
      {"choice_number", set({"planner", "choices", "quant2"}, 3),
       "planner.choices.quant2 is the number 3, expected an object with fixed_bytes"},
      {"per_sample_fraction", set({"planner", "choices", "quant2", "per_sample_bytes"}, 1.5),
       "planner.choices.quant2.per_sample_bytes is the number 1.5, expected a non-negative "
       "integer"},
      {"fixed_missing", erase({"planner", "choices", "auto", "fixed_bytes"}),
       "planner.choices.auto.fixed_bytes is missing"},
      {"verified_number", set({"planner", "verified"}, 3),
       "planner.verified is the number 3, expected null or an object"},
      {"verified_codec", set({"planner", "verified", "codec"}, json::Value()),
       "planner.verified.codec is null, expected a string"},
      {"backend", set({"allocator", "backend"}, "tpu"),
       "allocator.backend is the string \"tpu\", expected \"cpu\" or \"cuda\""},
      {"allocator_budget", set({"allocator", "budget_bytes"}, "none"),
       "allocator.budget_bytes is the string \"none\""},
      {"stats_array", set({"allocator", "stats"}, json::Value::array()),
       "allocator.stats is an array, expected an object"},
      {"stat_nested", set({"allocator", "stats", "active_bytes.all"}, nested_stat),
       "allocator.stats[\"active_bytes.all\"] is an object, expected a number"},
      {"stat_negative", set({"allocator", "stats", "reserved_bytes.all.peak"}, -5),
       "allocator.stats[\"reserved_bytes.all.peak\"] is the number -5, expected a non-negative"},
      {"ooms_string", set({"allocator", "stats", "num_ooms"}, "none"),
       "allocator.stats.num_ooms is the string \"none\""},
      {"snapshot_array", set({"allocator", "snapshot"}, json::Value::array()),
       "allocator.snapshot is an array, expected null or an object with segments"},
      {"segments_missing", erase({"allocator", "snapshot", "segments"}),
       "allocator.snapshot.segments is missing, expected an array"},
      {"traces_flat", set({"allocator", "snapshot", "device_traces"}, bad_traces),
       "allocator.snapshot.device_traces[0] is an object, expected an array"},
      {"module_number", record(1, "module", 5),
       "activations.saved_tensors[1].module is the number 5, expected a module name"},
      {"error_string", record(1, "error", "big"),
       "activations.saved_tensors[1].error is the string \"big\", expected null or an object"},
      {"error_negative", record(1, "error", bad_error),
       "activations.saved_tensors[1].error.rel_rms is the number -0.5, expected a non-negative "
       "number"},
      {"long_string", set({"allocator", "backend"}, std::string(500, 'x') + "\n"),
       "allocator.backend is the string \"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...\", "
       "expected"},
  };
  for (const Case& c : cases) {
    json::Value document = full;
    c.mutate(document);
    const std::string path = WriteJsonTemp(absl::StrCat("bad_", c.name, ".json"), document);
    for (const std::vector<std::string>& args :
         std::vector<std::vector<std::string>>{{"report", path},
                                               {"report", path, "--json"},
                                               {"diff", kFullReport, path},
                                               {"plot", path, "-o", TempPath("x.svg")},
                                               {"plan", path, "--budget", "1GiB"},
                                               {"snapshot", path, "-o", TempPath("x.pickle")}}) {
      const CliResult result = RunActpack(args);
      EXPECT_EQ(result.exit_code, kExitBadInput) << c.name;
      EXPECT_EQ(result.out, "") << c.name;
      EXPECT_EQ(LineCount(result.err), 1u) << result.err;
      EXPECT_TRUE(absl::StrContains(result.err, path)) << result.err;
      EXPECT_TRUE(absl::StrContains(result.err, c.message)) << c.name << ": " << result.err;
    }
  }
  // The truncated fixture is truncated JSON, not a crash, wherever it is cut.
  const std::string text = ReadText(kFullReport);
  for (size_t cut : {text.size() / 7, text.size() / 2, text.size() - 2}) {
    const std::string path = WriteTemp("truncated_full.json", text.substr(0, cut));
    const CliResult result = RunActpack({"snapshot", path, "-o", TempPath("t.pickle")});
    EXPECT_EQ(result.exit_code, kExitBadInput);
    EXPECT_TRUE(absl::StrContains(result.err, "truncated JSON")) << result.err;
  }
}

}  // namespace
}  // namespace actpack::report

// Tests of the actpack CLI over reports written by real runs of the runtime.
//
// tools/testdata/run_quant2.json and run_quant4.json come from the demo (torch CPU):
//   R=$PWD; cd /tmp
//   python3 $R/tools/demo.py --steps 10 --report $R/tools/testdata/run_quant2.json
//   python3 $R/tools/demo.py --steps 10 --codec quant4 --report $R/tools/testdata/run_quant4.json
// After regenerating them (or changing the text format on purpose), rewrite the golden text
// from the repository root:
//   bazel run //tools:actpack -- report $PWD/tools/testdata/run_quant2.json > tools/testdata/report.golden
#include "tools/report.h"

#include <cstdio>
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"
#include "runtime/json.h"

namespace actpack::tools {
namespace {

constexpr char kQuant2Report[] = "tools/testdata/run_quant2.json";
constexpr char kQuant4Report[] = "tools/testdata/run_quant4.json";
constexpr char kGolden[] = "tools/testdata/report.golden";

std::string ReadText(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

struct CliResult {
  int exit_code;
  std::string out;
  std::string err;
};

CliResult RunActpack(const std::vector<std::string>& args) {
  CliResult result;
  result.exit_code = RunCli(args, &result.out, &result.err);
  return result;
}

size_t LineCount(const std::string& text) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

// A structural XML check, enough for the SVG we write: one root element, every tag closed in
// order, attributes quoted, no stray '<' or '&' in text. Returns "" or the first problem.
std::string CheckWellFormedXml(const std::string& xml) {
  std::vector<std::string> open;
  int roots = 0;
  size_t i = 0;
  auto is_name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' ||
           c == '.';
  };
  while (i < xml.size()) {
    if (xml[i] == '&') {
      const size_t semicolon = xml.find(';', i);
      const std::string entity = xml.substr(i, semicolon == std::string::npos ? 1 : semicolon - i + 1);
      if (entity != "&amp;" && entity != "&lt;" && entity != "&gt;" && entity != "&quot;" &&
          entity != "&apos;") {
        return absl::StrCat("bad entity at ", i);
      }
      i += entity.size();
      continue;
    }
    if (xml[i] != '<') {
      if (open.empty() && !std::isspace(static_cast<unsigned char>(xml[i]))) {
        return absl::StrCat("text outside the root at ", i);
      }
      ++i;
      continue;
    }
    if (xml.compare(i, 2, "<?") == 0) {
      const size_t end = xml.find("?>", i);
      if (end == std::string::npos) return "unterminated <?";
      i = end + 2;
      continue;
    }
    if (xml.compare(i, 4, "<!--") == 0) {
      const size_t end = xml.find("-->", i);
      if (end == std::string::npos) return "unterminated comment";
      i = end + 3;
      continue;
    }
    const bool closing = xml.compare(i, 2, "</") == 0;
    size_t j = i + (closing ? 2 : 1);
    const size_t name_start = j;
    while (j < xml.size() && is_name_char(xml[j])) ++j;
    const std::string name = xml.substr(name_start, j - name_start);
    if (name.empty()) return absl::StrCat("tag without a name at ", i);
    // Attributes: name="value" pairs.
    while (true) {
      while (j < xml.size() && std::isspace(static_cast<unsigned char>(xml[j]))) ++j;
      if (j >= xml.size()) return "unterminated tag";
      if (xml[j] == '>' || xml.compare(j, 2, "/>") == 0) break;
      if (closing) return absl::StrCat("attribute in closing tag at ", j);
      const size_t attribute_start = j;
      while (j < xml.size() && is_name_char(xml[j])) ++j;
      if (j == attribute_start || j + 1 >= xml.size() || xml[j] != '=' || xml[j + 1] != '"') {
        return absl::StrCat("bad attribute at ", attribute_start);
      }
      const size_t value_end = xml.find('"', j + 2);
      if (value_end == std::string::npos) return "unterminated attribute value";
      const std::string value = xml.substr(j + 2, value_end - j - 2);
      if (value.find('<') != std::string::npos) return "'<' in an attribute value";
      j = value_end + 1;
    }
    const bool self_closing = xml[j] == '/';
    i = j + (self_closing ? 2 : 1);
    if (closing) {
      if (open.empty() || open.back() != name) return absl::StrCat("mismatched </", name, ">");
      open.pop_back();
    } else if (!self_closing) {
      if (open.empty()) ++roots;
      open.push_back(name);
    } else if (open.empty()) {
      ++roots;
    }
  }
  if (!open.empty()) return absl::StrCat("unclosed <", open.back(), ">");
  if (roots != 1) return absl::StrCat(roots, " root elements");
  return "";
}

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
  for (const ProducerUsage& p : report->producers) producer_raw += p.raw_bytes;
  EXPECT_EQ(producer_raw, *report->totals.packed_raw_bytes + *report->totals.kept_bytes +
                              *report->totals.reused_bytes);
  // And the producers' stored bytes are what the steps stored.
  uint64_t producer_stored = 0;
  for (const ProducerUsage& p : report->producers) producer_stored += p.stored_bytes;
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
      << "regenerate with the command at the top of tools/report_test.cc if intended";
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
  EXPECT_EQ(summary->Find("schema")->as_string(), "actpack.report_summary");
  const json::Value* run = summary->Find("run");
  ASSERT_NE(run, nullptr);
  EXPECT_EQ(run->Find("budget_bytes")->as_int(), int64_t{256} << 20);
  EXPECT_TRUE(run->Find("peak_allocated_bytes")->is_null());
  const json::Value* totals = summary->Find("activations")->Find("totals");
  absl::StatusOr<RunReport> report = LoadRunReport(kQuant2Report);
  ASSERT_TRUE(report.ok());
  EXPECT_EQ(static_cast<uint64_t>(totals->Find("packed_raw_bytes")->as_int()),
            *report->totals.packed_raw_bytes);
  const json::Value* producers = summary->Find("producers");
  ASSERT_EQ(producers->size(), report->producers.size());
  EXPECT_EQ((*producers)[0].Find("producer")->as_string(), report->producers[0].producer);
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
  EXPECT_EQ(CheckWellFormedXml(ReadText(svg)), "");
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

TEST(PlotTest, WritesWellFormedSvgWithAxesAndLegend) {
  const std::string path = TempPath("memory.svg");
  const CliResult result = RunActpack({"plot", kQuant2Report, "-o", path});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  const std::string svg = ReadText(path);
  EXPECT_EQ(CheckWellFormedXml(svg), "");
  EXPECT_TRUE(absl::StartsWith(svg, "<?xml"));
  for (const char* expected :
       {"<svg xmlns=\"http://www.w3.org/2000/svg\"", "actpack memory: run_quant2.json",
        "training step", "bytes per step", "saved raw (without actpack)", "stored by actpack",
        "budget 256.00 MiB", "stroke-dasharray", "0 MiB", "MiB</text>", "ConvolutionBackward0",
        "top consumers by producer"}) {
    EXPECT_TRUE(absl::StrContains(svg, expected)) << expected;
  }
}

TEST(PlotTest, XmlCheckerCatchesBrokenDocuments) {
  EXPECT_EQ(CheckWellFormedXml("<svg><g></g></svg>"), "");
  EXPECT_NE(CheckWellFormedXml("<svg><g></svg>"), "");
  EXPECT_NE(CheckWellFormedXml("<svg>a & b</svg>"), "");
  EXPECT_NE(CheckWellFormedXml("<svg x=1></svg>"), "");
  EXPECT_NE(CheckWellFormedXml("<svg></svg><svg></svg>"), "");
}

TEST(PlanTest, WithoutPlannerProfileSaysSoAndInventsNothing) {
  const CliResult result = RunActpack({"plan", kQuant2Report, "--budget", "12GiB"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(LineCount(result.err), 1u) << result.err;
  EXPECT_TRUE(absl::StrContains(result.err, "run report has no planner profile")) << result.err;
  EXPECT_TRUE(absl::StrContains(result.err, kQuant2Report));
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
      {WriteTemp("version.json", R"({"schema": "actpack.report", "schema_version": 2})"),
       "unsupported run report schema_version 2"},
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
                                               {"plan", c.path, "--budget", "1GiB"}}) {
      const CliResult result = RunActpack(args);
      EXPECT_EQ(result.exit_code, kExitBadInput) << c.path;
      EXPECT_EQ(result.out, "") << c.path;
      EXPECT_EQ(LineCount(result.err), 1u) << result.err;
      EXPECT_TRUE(absl::StrContains(result.err, c.path)) << result.err;
      EXPECT_TRUE(absl::StrContains(result.err, c.problem)) << result.err;
    }
  }
}

TEST(ErrorTest, UsageErrorsExitTwoWithUsage) {
  const std::vector<std::vector<std::string>> bad_usages = {
      {},
      {"frobnicate"},
      {"report"},
      {"report", kQuant2Report, kQuant4Report},
      {"report", kQuant2Report, "--yaml"},
      {"diff", kQuant2Report},
      {"plot", kQuant2Report},
      {"plot", kQuant2Report, "-o"},
      {"plan", kQuant2Report},
      {"plan", kQuant2Report, "--budget", "lots"},
  };
  for (const auto& args : bad_usages) {
    const CliResult result = RunActpack(args);
    EXPECT_EQ(result.exit_code, kExitBadInput) << absl::StrJoin(args, " ");
    EXPECT_TRUE(absl::StartsWith(result.err, "actpack: ")) << result.err;
    EXPECT_TRUE(absl::StrContains(result.err, "usage: actpack")) << result.err;
    EXPECT_EQ(result.out, "");
  }
  const CliResult help = RunActpack({"--help"});
  EXPECT_EQ(help.exit_code, kExitOk);
  EXPECT_TRUE(absl::StartsWith(help.out, "usage: actpack"));
}

}  // namespace
}  // namespace actpack::tools

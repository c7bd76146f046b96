// What the CLI tests share (report_test, plan_test, svg_test, snapshot_test): the fixtures'
// paths, files in the test's temporary directory, and RunCli with its outputs collected.
#ifndef ACTPACK_REPORT_CLI_TEST_UTIL_H_
#define ACTPACK_REPORT_CLI_TEST_UTIL_H_

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "report/cli.h"
#include "runtime/json.h"

namespace actpack::report {

inline constexpr char kQuant2Report[] = "report/testdata/run_quant2.json";
inline constexpr char kQuant4Report[] = "report/testdata/run_quant4.json";
inline constexpr char kGolden[] = "report/testdata/report.golden";
inline constexpr char kFullReport[] = "report/testdata/run_quant2_full.json";
inline constexpr char kFullGolden[] = "report/testdata/report_full.golden";
inline constexpr char kPlanGolden[] = "report/testdata/plan_full.golden";

inline std::string ReadText(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  EXPECT_TRUE(file.good()) << "cannot open " << path;
  std::stringstream contents;
  contents << file.rdbuf();
  return contents.str();
}

inline std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

inline std::string WriteTemp(const std::string& name, const std::string& contents) {
  const std::string path = TempPath(name);
  std::ofstream(path, std::ios::binary) << contents;
  return path;
}

struct CliResult {
  int exit_code;
  std::string out;
  std::string err;
};

inline CliResult RunActpack(const std::vector<std::string>& args) {
  CliResult result;
  result.exit_code = RunCli(args, &result.out, &result.err);
  return result;
}

inline size_t LineCount(const std::string& text) {
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

inline json::Value ParseJsonFile(const std::string& path) {
  absl::StatusOr<json::Value> document = json::Parse(ReadText(path));
  EXPECT_TRUE(document.ok()) << document.status();
  return document.ok() ? *std::move(document) : json::Value();
}

inline std::string WriteJsonTemp(const std::string& name, const json::Value& document) {
  return WriteTemp(name, json::Serialize(document));
}

// The member at `keys` below `document` (each key an object member), or nullptr.
inline json::Value* Member(json::Value& document, const std::vector<std::string>& keys) {
  json::Value* value = &document;
  for (const std::string& key : keys) {
    value = json::Find(*value, key);
    if (value == nullptr) return nullptr;
  }
  return value;
}
}  // namespace actpack::report

#endif  // ACTPACK_REPORT_CLI_TEST_UTIL_H_

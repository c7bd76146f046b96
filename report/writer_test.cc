// The report writer: the activations section says what the session's state holds (member by
// member, where a drifting writer would differ), and WriteRunReport refuses an invalid document
// without touching the file.
#include "report/writer.h"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "codecs/registry.h"
#include "common/version.h"
#include "gtest/gtest.h"
#include "report/reader.h"

namespace actpack::report {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// Two saved tensors: an automatic one measured with two candidates (the second chosen) and an
// error cap, and a fixed one that was reused.
runtime::SessionState SampleState() {
  runtime::SessionState state;
  state.options.codec = *runtime::ParseCodecChoice("auto");
  state.options.rules.push_back({"head.*", *runtime::ParseCodecChoice("quant4")});
  state.options.budget_bytes = 1 << 20;
  state.options.allowed_loss_increase = 0.01;
  state.policy.plans = 3;
  state.policy.fragmentation = 1.25;
  state.totals.packed_raw_bytes = 4000;
  state.totals.packed_stored_bytes = 1000;
  state.totals.packs = 7;
  runtime::StepRecord step;
  step.peak_bytes = 900;
  step.system_peak_bytes = 1100;
  step.saved_raw_bytes = 4000;
  step.stored_bytes = 500;
  state.steps = {step};
  runtime::SavedRecord automatic;
  automatic.ordinal = 0;
  automatic.producer = "AddmmBackward0";
  automatic.module = "encoder.fc";
  automatic.shape = {8, 16};
  automatic.codec = "quant4";
  automatic.raw_bytes = 512;
  automatic.stored_bytes = 72;
  automatic.occurrences = 2;
  automatic.assigned.automatic = true;
  automatic.candidates = {{"none", 512, 0.0},
                          {"quant4", 72, 4e-3},
                          {"eb:abs=0.1", 100, std::numeric_limits<double>::infinity()}};
  automatic.choice = 1;
  automatic.error.count = 128;
  automatic.error.squared_error = 128 * 0.25;  // rms 0.5
  automatic.error.squared_norm = 128 * 4.0;    // rel rms 0.25
  automatic.error.max_abs_error = 1.5;
  automatic.error_cap = 0.04;  // rel rms 0.2
  automatic.mean_square = 9.0;  // rms allowed: sqrt(0.04 * 9) = 0.6
  automatic.cap_source = "weight gradient";
  runtime::SavedRecord reused;
  reused.ordinal = 1;
  reused.producer = "ReluBackward0";
  reused.module = "head.act";
  reused.shape = {8, 16};
  reused.assigned = state.options.rules[0].choice;
  reused.raw_bytes = 512;
  state.records = {automatic, reused};
  state.gradient_sensitivity = true;
  state.sensitivity = {1.5, 0.5};
  return state;
}

TEST(ActivationsSectionTest, SaysWhatTheStateHolds) {
  const json::Value section = ActivationsSection(SampleState());
  EXPECT_EQ(section["codec"], "auto");
  EXPECT_EQ(section["rules"], json::Value::parse(R"([{"pattern": "head.*", "codec": "quant4"}])"));
  const json::Value& policy = section["policy"];
  EXPECT_EQ(policy["budget_bytes"], 1 << 20);
  EXPECT_EQ(policy["plans"], 3);
  EXPECT_EQ(policy["fragmentation"], 1.25);
  EXPECT_EQ(policy["sensitivity"], "gradient");
  EXPECT_EQ(policy["allowed_loss_increase"], 0.01);
  EXPECT_EQ(section["totals"]["ratio"], 4.0);
  EXPECT_EQ(section["totals"]["packs"], 7);
  ASSERT_EQ(section["steps"].size(), 1u);
  EXPECT_EQ(section["steps"][0]["system_peak_bytes"], 1100);
  EXPECT_EQ(section["steps"][0]["ratio"], 8.0);

  const json::Value& first = section["saved_tensors"][0];
  EXPECT_EQ(first["module"], "encoder.fc");
  EXPECT_EQ(first["sensitivity"], 1.5);
  EXPECT_EQ(first["shape"], json::Value::parse("[8, 16]"));
  EXPECT_EQ(first["dtype"], "float32");
  EXPECT_EQ(first["occurrences"], 2);
  EXPECT_DOUBLE_EQ(first["error"]["rms"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(first["error"]["rel_rms"].get<double>(), 0.25);
  EXPECT_EQ(first["error"]["max_abs"], 1.5);
  EXPECT_DOUBLE_EQ(first["error_cap"]["rel_rms"].get<double>(), 0.2);
  EXPECT_DOUBLE_EQ(first["error_cap"]["rms"].get<double>(), 0.6);
  EXPECT_EQ(first["error_cap"]["source"], "weight gradient");
  const json::Value& candidates = first["candidates"];
  ASSERT_EQ(candidates.size(), 3u);
  EXPECT_EQ(candidates[1]["codec"], "quant4");
  EXPECT_EQ(candidates[1]["chosen"], true);
  EXPECT_EQ(candidates[0]["chosen"], false);
  EXPECT_EQ(candidates[2].find("rel_error"), candidates[2].end());  // unmeasured: absent

  const json::Value& second = section["saved_tensors"][1];
  EXPECT_EQ(second["codec"], "reused");
  EXPECT_EQ(second.find("sensitivity"), second.end());  // a fixed codec: no weight
  EXPECT_EQ(second.find("error"), second.end());
  EXPECT_EQ(second.find("candidates"), second.end());
}

TEST(ActivationsSectionTest, UniformWithoutGradients) {
  runtime::SessionState state = SampleState();
  state.gradient_sensitivity = false;
  state.sensitivity.clear();
  const json::Value section = ActivationsSection(state);
  EXPECT_EQ(section["policy"]["sensitivity"], "uniform");
  EXPECT_EQ(section["saved_tensors"][0].find("sensitivity"), section["saved_tensors"][0].end());
}

TEST(AllocatorSectionTest, RunPeaksReplaceTheLastWindowsAndAbsentOnesAreNull) {
  json::Value stats = json::Value::object();
  stats["allocated_bytes.all.peak"] = 10;  // since the last per-step restart
  stats["num_ooms"] = 2;
  json::Value section = AllocatorSection({"cuda", false, 4096, stats, 300, 500, json::Value()});
  EXPECT_EQ(section["backend"], "cuda");
  EXPECT_EQ(section["allocator"], "torch");
  EXPECT_EQ(section["budget_bytes"], 4096);
  EXPECT_EQ(section["stats"]["allocated_bytes.all.peak"], 300);
  EXPECT_EQ(section["stats"]["reserved_bytes.all.peak"], 500);
  EXPECT_EQ(section["stats"]["num_ooms"], 2);
  EXPECT_TRUE(section["snapshot"].is_null());
  section = AllocatorSection({"cpu", true, 0, stats, std::nullopt, std::nullopt,
                              json::Value::parse(R"({"segments": []})")});
  EXPECT_EQ(section["allocator"], "actpack");
  EXPECT_TRUE(section["stats"]["allocated_bytes.all.peak"].is_null());
  EXPECT_EQ(section["snapshot"]["segments"], json::Value::array());
}

TEST(WriteRunReportTest, WritesWhatTheReaderReads) {
  json::Value run = json::Value::object();
  run["device"] = "cpu";
  run["budget_bytes"] = 1 << 20;
  const json::Value document = MakeRunReport(run, ActivationsSection(SampleState()));
  EXPECT_EQ(document["schema"], std::string(kReportSchema));
  EXPECT_EQ(document["actpack_version"], kVersion);
  const std::string path = TempPath("written.json");
  ASSERT_TRUE(WriteRunReport(document, path).ok());
  absl::StatusOr<RunReport> read = LoadRunReport(path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->document, document);
  EXPECT_EQ(read->budget_bytes, 1u << 20);
  ASSERT_EQ(read->modules.size(), 2u);
}

TEST(WriteRunReportTest, RefusesAnInvalidDocumentAndLeavesTheFile) {
  const std::string path = TempPath("kept.json");
  std::ofstream(path) << "before";
  json::Value document = MakeRunReport(json::Value::object(), ActivationsSection(SampleState()));
  document["planner"] = json::Value::parse(
      R"({"budget_bytes": 1, "batch_sizes": [8], "choices": {"quant2": {"fixed_bytes": "x"}}})");
  const absl::Status status = WriteRunReport(document, path);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("planner.choices.quant2.fixed_bytes"), std::string::npos)
      << status;
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  EXPECT_EQ(text.str(), "before");

  document.erase("planner");
  document["schema"] = "torch.report";
  EXPECT_EQ(WriteRunReport(document, path).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(WriteRunReport(MakeRunReport(json::Value::object(), json::Value::object()),
                           "/nonexistent-dir/run.json")
                .message(),
            "/nonexistent-dir/run.json: cannot write: No such file or directory");
}

}  // namespace
}  // namespace actpack::report

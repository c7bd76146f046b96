// `actpack plan` over the fixtures (report_test.cc says where they come from and how the
// goldens, plan_full.golden among them, are regenerated).
#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "gtest/gtest.h"
#include "report/cli.h"
#include "report/cli_test_util.h"
#include "runtime/json.h"

namespace actpack::report {
namespace {

TEST(PlanTest, WithoutPlannerProfileSaysSoAndInventsNothing) {
  const CliResult result = RunActpack({"plan", kQuant2Report, "--budget", "12GiB"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(LineCount(result.err), 1u) << result.err;
  EXPECT_TRUE(absl::StrContains(result.err, "run report has no planner profile")) << result.err;
  EXPECT_TRUE(absl::StrContains(result.err, kQuant2Report));
}

TEST(PlanTest, ReplansEveryChoiceForTheNewBudget) {
  const CliResult result = RunActpack({"plan", kFullReport, "--budget", "12GiB"});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  EXPECT_EQ(result.err, "");
  EXPECT_EQ(result.out, ReadText(kPlanGolden))
      << "regenerate with the command at the top of report/report_test.cc if intended";

  // The numbers, recomputed here from the fixture: floor((budget - fixed) / per_sample).
  const json::Value document = ParseJsonFile(kFullReport);
  const uint64_t budget = uint64_t{12} << 30;
  uint64_t best = 0;
  std::string best_name;
  for (const auto& choice : json::Find((*json::Find(document, "planner")), "choices")->items()) {
    const uint64_t fixed = json::Find(choice.value(), "fixed_bytes")->get<int64_t>();
    const uint64_t per_sample = json::Find(choice.value(), "per_sample_bytes")->get<int64_t>();
    // The planner keeps its headroom free, as the runtime's policy does.
    const double headroom =
        json::Find((*json::Find(document, "planner")), "headroom")->get<double>();
    const uint64_t usable = static_cast<uint64_t>(static_cast<double>(budget) * (1 - headroom));
    const uint64_t batch = (usable - fixed) / per_sample;
    if (batch > best) {
      best = batch;
      best_name = choice.key();
    }
    bool found_row = false;
    for (absl::string_view line : absl::StrSplit(result.out, '\n')) {
      const std::vector<std::string> cells = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (cells.empty() || cells[0] != choice.key()) continue;
      found_row = true;
      ASSERT_GE(cells.size(), 3u);
      EXPECT_EQ(cells[cells.size() - 2], absl::StrCat(batch)) << line;
      EXPECT_EQ(cells.back(),
                absl::StrCat(json::Find(choice.value(), "max_batch_size")->get<int64_t>()))
          << line;
    }
    EXPECT_TRUE(found_row) << choice.key() << "\n" << result.out;
  }
  EXPECT_TRUE(absl::StrContains(result.out, absl::StrCat("largest batch at 12.00 GiB: ",
                                                         best_name, " (", best, ")")))
      << result.out;
  // 12 GiB takes thousands of samples; the profile measured 8 to 32.
  EXPECT_TRUE(absl::StrContains(result.out, "extrapolated")) << result.out;
}

TEST(PlanTest, AtTheRecordedBudgetReproducesTheRecordedBatchSizes) {
  const CliResult result = RunActpack({"plan", kFullReport, "--budget=256MiB", "--json"});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  absl::StatusOr<json::Value> plan = json::Parse(result.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(json::Find(*plan, "schema")->get_ref<const std::string&>(), "actpack.plan");
  EXPECT_EQ(json::Find(*plan, "budget_bytes")->get<int64_t>(), int64_t{256} << 20);
  EXPECT_EQ(json::Find(*plan, "recorded_budget_bytes")->get<int64_t>(), int64_t{256} << 20);
  ASSERT_EQ(json::Find(*plan, "choices")->size(), 3u);  // none, quant2, auto
  for (const auto& choice : json::Find(*plan, "choices")->items()) {
    EXPECT_FALSE(json::Find(choice.value(), "unbounded")->get<bool>());
    EXPECT_EQ(json::Find(choice.value(), "max_batch_size")->get<int64_t>(),
              json::Find(choice.value(), "recorded_max_batch_size")->get<int64_t>())
        << choice.key();
  }
  EXPECT_EQ(json::Find(*plan, "best")->get_ref<const std::string&>(),
            "quant2");  // the first of equals (auto)
  EXPECT_EQ(json::Find((*json::Find(*plan, "verified")), "codec")->get_ref<const std::string&>(),
            "auto");
}

TEST(PlanTest, AChoicesMeasuredHeadroomReplacesTheSections) {
  // What real steps under the cap measured for quant2 (its "headroom"); none says nothing
  // (as reports before the planner measured it), so it keeps the section's 15%.
  json::Value document = ParseJsonFile(kFullReport);
  json::Value* quant2 = Member(document, {"planner", "choices", "quant2"});
  ASSERT_NE(quant2, nullptr);
  (*quant2)["headroom"] = 0.04;
  const std::string path = WriteJsonTemp("measured_headroom.json", document);
  const CliResult result = RunActpack({"plan", path, "--budget", "30MiB", "--json"});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  absl::StatusOr<json::Value> plan = json::Parse(result.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const auto& [name, headroom] : {std::pair<std::string, double>{"quant2", 0.04},
                                       std::pair<std::string, double>{"none", 0.15}}) {
    const json::Value* recorded = Member(document, {"planner", "choices", name});
    const auto usable = static_cast<int64_t>((int64_t{30} << 20) * (1 - headroom));
    EXPECT_EQ(Member(*plan, {"choices", name, "max_batch_size"})->get<int64_t>(),
              (usable - json::Find(*recorded, "fixed_bytes")->get<int64_t>()) /
                  json::Find(*recorded, "per_sample_bytes")->get<int64_t>())
        << name;
  }

  (*quant2)["headroom"] = 1.5;
  const CliResult bad =
      RunActpack({"plan", WriteJsonTemp("bad_headroom.json", document), "--budget", "30MiB"});
  EXPECT_EQ(bad.exit_code, kExitBadInput) << bad.out;
  EXPECT_TRUE(absl::StrContains(bad.err, "planner.choices.quant2.headroom")) << bad.err;
  EXPECT_TRUE(absl::StrContains(bad.err, "a fraction below 1")) << bad.err;
}

TEST(PlanTest, TheGradientsEachChoiceGaveAreShownWhereThePlanMeasuredThem) {
  // As actpack.plan(gradients=True) writes them: quant2 turned two groups, none kept every
  // one, auto was not measured (null), and a non-finite gradient is a null cosine.
  json::Value document = ParseJsonFile(kFullReport);
  auto gradients = [](json::Value min_cosine, const char* worst, std::vector<std::string> below) {
    json::Value g = json::Value::object();
    g["batch_size"] = 8;
    g["min_cosine"] = std::move(min_cosine);
    g["worst_group"] = worst;
    g["below_bound"] = below;
    g["groups"] = json::Value::object();
    return g;
  };
  (*Member(document, {"planner", "choices", "quant2"}))["gradients"] =
      gradients(0.075, "features.0", {"features.0", "features.3"});
  (*Member(document, {"planner", "choices", "none"}))["gradients"] =
      gradients(1.0, "head", {});
  (*Member(document, {"planner", "choices", "auto"}))["gradients"] = nullptr;
  const std::string path = WriteJsonTemp("gradients.json", document);

  const CliResult plan = RunActpack({"plan", path, "--budget", "12GiB"});
  ASSERT_EQ(plan.exit_code, kExitOk) << plan.err;
  const CliResult report = RunActpack({"report", path});
  ASSERT_EQ(report.exit_code, kExitOk) << report.err;
  for (const std::string& text : {plan.out, report.out}) {
    EXPECT_TRUE(absl::StrContains(text, "grad cos")) << text;
    for (const auto& [choice, cell] : {std::pair<std::string, std::string>{"quant2", "0.075!"},
                                       {"none", "1.000"}, {"auto", "-"}}) {
      bool found = false;
      for (absl::string_view line : absl::StrSplit(text, '\n')) {
        const std::vector<std::string> cells =
            absl::StrSplit(line, ' ', absl::SkipWhitespace());
        if (cells.size() > 4 && cells[0] == choice) {
          found = std::find(cells.begin(), cells.end(), cell) != cells.end();
        }
      }
      EXPECT_TRUE(found) << choice << " without " << cell << " in\n" << text;
    }
    EXPECT_TRUE(absl::StrContains(
        text, "quant2: 2 parameter group(s) below the gradient bound, worst features.0 (0.075)"))
        << text;
  }

  (*Member(document, {"planner", "choices", "quant2", "gradients"}))["min_cosine"] = 1.5;
  const CliResult bad =
      RunActpack({"plan", WriteJsonTemp("bad_gradients.json", document), "--budget", "1GiB"});
  EXPECT_EQ(bad.exit_code, kExitBadInput) << bad.out;
  EXPECT_TRUE(absl::StrContains(bad.err, "planner.choices.quant2.gradients.min_cosine")) << bad.err;
}

TEST(PlanTest, InsideTheProfiledSizesNothingIsExtrapolated) {
  // 30 MiB: 9 to 26 samples per choice, inside the profiled 8..32.
  const CliResult json_result = RunActpack({"plan", kFullReport, "--budget", "30MiB", "--json"});
  absl::StatusOr<json::Value> plan = json::Parse(json_result.out);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(json::Find(*plan, "extrapolated")->get<bool>());
  const json::Value document = ParseJsonFile(kFullReport);
  const json::Value* none =
      json::Find((*json::Find((*json::Find(document, "planner")), "choices")), "none");
  const auto usable = static_cast<int64_t>((int64_t{30} << 20) * (1 - 0.15));
  EXPECT_EQ(json::Find((*json::Find((*json::Find(*plan, "choices")), "none")), "max_batch_size")
                ->get<int64_t>(),
            (usable - json::Find(*none, "fixed_bytes")->get<int64_t>()) /
                json::Find(*none, "per_sample_bytes")->get<int64_t>());
  const CliResult text = RunActpack({"plan", kFullReport, "--budget", "30MiB"});
  EXPECT_FALSE(absl::StrContains(text.out, "extrapolated")) << text.out;
}

TEST(PlanTest, TooSmallAndUnboundedBudgets) {
  const CliResult small = RunActpack({"plan", kFullReport, "--budget", "4MiB"});
  ASSERT_EQ(small.exit_code, kExitOk) << small.err;
  EXPECT_TRUE(absl::StrContains(small.out, "no choice fits one sample in 4.00 MiB")) << small.out;
  const CliResult small_json = RunActpack({"plan", kFullReport, "--budget", "4MiB", "--json"});
  absl::StatusOr<json::Value> plan = json::Parse(small_json.out);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(json::Find(*plan, "best")->is_null());
  EXPECT_EQ(json::Find((*json::Find((*json::Find(*plan, "choices")), "quant2")), "max_batch_size")
                ->get<int64_t>(),
            0);

  json::Value document = ParseJsonFile(kFullReport);
  json::Value* choices = Member(document, {"planner", "choices"});
  json::Value free_choice = json::Value::object();
  free_choice["fixed_bytes"] = int64_t{1} << 20;
  free_choice["per_sample_bytes"] = 0;
  free_choice["max_batch_size"] = 0;
  (*choices)["my codec"] = std::move(free_choice);
  const std::string path = WriteJsonTemp("unbounded.json", document);
  const CliResult text = RunActpack({"plan", path, "--budget", "2GiB"});
  ASSERT_EQ(text.exit_code, kExitOk) << text.err;
  EXPECT_TRUE(absl::StrContains(text.out, "largest batch at 2.00 GiB: my codec (unbounded)"))
      << text.out;
  const CliResult json_result = RunActpack({"plan", path, "--budget", "2GiB", "--json"});
  absl::StatusOr<json::Value> unbounded = json::Parse(json_result.out);
  ASSERT_TRUE(unbounded.ok());
  const json::Value* entry = json::Find((*json::Find(*unbounded, "choices")), "my codec");
  EXPECT_TRUE(json::Find(*entry, "max_batch_size")->is_null());
  EXPECT_TRUE(json::Find(*entry, "unbounded")->get<bool>());
  EXPECT_EQ(json::Find(*unbounded, "best")->get_ref<const std::string&>(), "my codec");
}

TEST(PlanTest, AShareOfTheDeviceIsRefusedClearly) {
  const CliResult result = RunActpack({"plan", kFullReport, "--budget", "80%"});
  EXPECT_EQ(result.exit_code, kExitBadInput);
  EXPECT_EQ(result.out, "");
  EXPECT_TRUE(absl::StartsWith(
      result.err, "actpack: plan --budget 80%: a share of the device needs the device's memory "
                  "size"))
      << result.err;
  EXPECT_TRUE(absl::StrContains(result.err, "usage: actpack"));
  // A malformed share is ParseMemoryLimit's error.
  const CliResult bad = RunActpack({"plan", kFullReport, "--budget", "180%"});
  EXPECT_EQ(bad.exit_code, kExitBadInput);
  EXPECT_TRUE(absl::StrContains(bad.err, "(0%, 100%]")) << bad.err;
}

}  // namespace
}  // namespace actpack::report

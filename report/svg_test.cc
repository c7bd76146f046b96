// `actpack plot`: the SVG drawn from the fixtures (report_test.cc says where they come from).
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "allocator/units.h"
#include "gtest/gtest.h"
#include "report/cli.h"
#include "report/cli_test_util.h"
#include "runtime/json.h"

namespace actpack::report {
namespace {

TEST(PlotTest, WritesWellFormedSvgWithAxesAndLegend) {
  const std::string path = TempPath("memory.svg");
  const CliResult result = RunActpack({"plot", kQuant2Report, "-o", path});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  const std::string svg = ReadText(path);
  EXPECT_TRUE(absl::StartsWith(svg, "<?xml"));
  for (const char* expected :
       {"<svg xmlns=\"http://www.w3.org/2000/svg\"", "actpack memory: run_quant2.json",
        "training step", "bytes per step", "saved raw (without actpack)", "stored by actpack",
        "budget 256.00 MiB", "stroke-dasharray", "0 MiB", "MiB</text>", "ConvolutionBackward0",
        "top consumers by producer"}) {
    EXPECT_TRUE(absl::StrContains(svg, expected)) << expected;
  }
}

TEST(PlotTest, GroupsByModuleWhenTheReportNamesModules) {
  const std::string path = TempPath("modules.svg");
  ASSERT_EQ(RunActpack({"plot", kFullReport, "-o", path}).exit_code, kExitOk);
  const std::string svg = ReadText(path);
  EXPECT_TRUE(absl::StrContains(svg, "top consumers by module")) << svg;
  EXPECT_TRUE(absl::StrContains(svg, ">convs.0</text>"));
  // The steps record the allocator's peaks: a line each, a marker per step with its value.
  EXPECT_TRUE(absl::StrContains(svg, ">step peak reserved</text>")) << svg;
  EXPECT_TRUE(absl::StrContains(svg, ">step peak allocated</text>")) << svg;
  const json::Value document = ParseJsonFile(kFullReport);
  const json::Value& first = (*json::Find((*json::Find(document, "activations")), "steps"))[0];
  EXPECT_TRUE(absl::StrContains(
      svg,
      absl::StrCat("<title>step 0: peak reserved ",
                   allocator::FormatBytes(json::Find(first, "peak_reserved_bytes")->get<int64_t>()),
                   "</title>")))
      << svg;
  // A report without them (version 1) draws neither.
  ASSERT_EQ(RunActpack({"plot", kQuant2Report, "-o", path}).exit_code, kExitOk);
  EXPECT_FALSE(absl::StrContains(ReadText(path), "step peak"));
}

}  // namespace
}  // namespace actpack::report

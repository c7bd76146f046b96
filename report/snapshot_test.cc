// The pickle writer opcode by opcode, and `actpack snapshot` over the fixtures (report_test.cc
// says where they come from).
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "report/cli.h"
#include "report/cli_test_util.h"
#include "report/snapshot.h"
#include "runtime/json.h"

namespace actpack::report {
namespace {

TEST(PickleTest, ScalarsUseTheProtocolTwoOpcodes) {
  auto pickle = [](const json::Value& value) {
    const std::string bytes = PickleJson(value);
    EXPECT_TRUE(absl::StartsWith(bytes, std::string("\x80\x02", 2)));
    EXPECT_TRUE(absl::EndsWith(bytes, "."));
    return bytes.substr(2, bytes.size() - 3);  // without PROTO 2 and STOP
  };
  using std::string_literals::operator""s;
  EXPECT_EQ(pickle(json::Value()), "N");
  EXPECT_EQ(pickle(json::Value(true)), "\x88");
  EXPECT_EQ(pickle(json::Value(false)), "\x89");
  EXPECT_EQ(pickle(json::Value(0)), "K\x00"s);
  EXPECT_EQ(pickle(json::Value(255)), "K\xff");
  EXPECT_EQ(pickle(json::Value(256)), "M\x00\x01"s);
  EXPECT_EQ(pickle(json::Value(65535)), "M\xff\xff");
  EXPECT_EQ(pickle(json::Value(65536)), "J\x00\x00\x01\x00"s);
  EXPECT_EQ(pickle(json::Value(-1)), "J\xff\xff\xff\xff");
  EXPECT_EQ(pickle(json::Value(int64_t{2147483647})), "J\xff\xff\xff\x7f");
  EXPECT_EQ(pickle(json::Value(int64_t{-2147483648})), "J\x00\x00\x00\x80"s);
  // Past 32 bits: LONG1 with the shortest two's complement, a sign byte where needed.
  EXPECT_EQ(pickle(json::Value(int64_t{2147483648})), "\x8a\x05\x00\x00\x00\x80\x00"s);
  EXPECT_EQ(pickle(json::Value(int64_t{-2147483649})), "\x8a\x05\xff\xff\xff\x7f\xff"s);
  EXPECT_EQ(pickle(json::Value(int64_t{1} << 40)), "\x8a\x06\x00\x00\x00\x00\x00\x01"s);
  EXPECT_EQ(pickle(json::Value(std::numeric_limits<int64_t>::max())),
            "\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f"s);
  EXPECT_EQ(pickle(json::Value(std::numeric_limits<int64_t>::min())),
            "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80"s);
  EXPECT_EQ(pickle(json::Value(1.5)), "G\x3f\xf8\x00\x00\x00\x00\x00\x00"s);
  EXPECT_EQ(pickle(json::Value(-0.0)), "G\x80\x00\x00\x00\x00\x00\x00\x00"s);
  EXPECT_EQ(pickle(json::Value(2.0)), "G\x40\x00\x00\x00\x00\x00\x00\x00"s);  // a float
  EXPECT_EQ(pickle(json::Value("\xc3\xa9")), "X\x02\x00\x00\x00\xc3\xa9"s);
  EXPECT_EQ(pickle(json::Value("")), "X\x00\x00\x00\x00"s);
  EXPECT_EQ(pickle(json::Value::array()), "]");
  EXPECT_EQ(pickle(json::Value::object()), "}");
  json::Value list = json::Value::array();
  list.emplace_back(1);
  list.emplace_back(json::Value());
  EXPECT_EQ(pickle(list), "](K\x01Ne"s);
  json::Value dict = json::Value::object();
  dict["a"] = json::Value();
  EXPECT_EQ(pickle(dict), "}(X\x01\x00\x00\x00" "aNu"s);
}

TEST(SnapshotTest, WritesTheReportsSnapshotAsAPickle) {
  const std::string path = TempPath("snap.pickle");
  const CliResult result = RunActpack({"snapshot", kFullReport, "-o", path});
  ASSERT_EQ(result.exit_code, kExitOk) << result.err;
  EXPECT_TRUE(absl::StartsWith(result.out, absl::StrCat("wrote ", path, " (17 segments, ")))
      << result.out;
  // Its contents are read back by Python's pickle and torch's memory_viz in tests/test_cli.py.
  const json::Value document = ParseJsonFile(kFullReport);
  EXPECT_EQ(ReadText(path), PickleJson(*json::Find((*json::Find(document, "allocator")), "snapshot")));

  // --output=FILE is the same option.
  const std::string other = TempPath("snap2.pickle");
  ASSERT_EQ(RunActpack({"snapshot", kFullReport, "--output=" + other}).exit_code, kExitOk);
  EXPECT_EQ(ReadText(other), ReadText(path));
}

TEST(SnapshotTest, WithoutSnapshotSaysSo) {
  const CliResult none = RunActpack({"snapshot", kQuant2Report, "-o", TempPath("n.pickle")});
  EXPECT_EQ(none.exit_code, kExitBadInput);
  EXPECT_EQ(none.out, "");
  EXPECT_EQ(LineCount(none.err), 1u) << none.err;
  EXPECT_TRUE(absl::StrContains(none.err, "no allocator section")) << none.err;
  EXPECT_TRUE(absl::StrContains(none.err, "actpack.dump_snapshot")) << none.err;

  json::Value document = ParseJsonFile(kFullReport);
  (*Member(document, {"allocator"}))["snapshot"] = json::Value();
  const std::string path = WriteJsonTemp("null_snapshot.json", document);
  const CliResult null_snapshot = RunActpack({"snapshot", path, "-o", TempPath("n.pickle")});
  EXPECT_EQ(null_snapshot.exit_code, kExitBadInput);
  EXPECT_EQ(LineCount(null_snapshot.err), 1u) << null_snapshot.err;
  EXPECT_TRUE(absl::StrContains(null_snapshot.err, "allocator section has no snapshot"))
      << null_snapshot.err;
  // The report itself still reads.
  const CliResult report = RunActpack({"report", path});
  EXPECT_EQ(report.exit_code, kExitOk) << report.err;
  EXPECT_TRUE(absl::StrContains(report.out, "snapshot         none")) << report.out;
}

}  // namespace
}  // namespace actpack::report

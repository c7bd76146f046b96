#include "runtime/config.h"

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace actpack::runtime {
namespace {

TEST(ParseByteSizeTest, UnitsAndSpaces) {
  EXPECT_EQ(*ParseByteSize("6GiB"), 6ull << 30);
  EXPECT_EQ(*ParseByteSize("512 MiB"), 512ull << 20);
  EXPECT_EQ(*ParseByteSize("1.5GB"), 1500000000ull);
  EXPECT_EQ(*ParseByteSize("4096"), 4096ull);
  EXPECT_EQ(*ParseByteSize("2g"), 2ull << 30);
  EXPECT_EQ(*ParseByteSize("64KiB"), 65536ull);
}

TEST(ParseByteSizeTest, ScientificNotationIsANumber) {
  EXPECT_EQ(*ParseByteSize("1e9"), 1000000000ull);
  EXPECT_EQ(*ParseByteSize("1.5e9B"), 1500000000ull);
  EXPECT_EQ(*ParseByteSize(" 2E3 MiB "), 2000ull << 20);
  EXPECT_EQ(*ParseByteSize("5e-1KiB"), 512ull);
  for (const char* huge : {"1e30", "1e400", "1e-400", "1e19"}) {
    EXPECT_EQ(ParseByteSize(huge).status().message(),
              absl::StrCat("actpack: invalid memory size '", huge,
                           "': out of range; expected 1 byte to 9.2e18 bytes (8171.24 PiB)"));
  }
  EXPECT_NE(ParseByteSize("-1e9").status().message().find("positive"), absl::string_view::npos);
  EXPECT_NE(ParseByteSize("0e5").status().message().find("positive"), absl::string_view::npos);
  // An 'e' not followed by a digit is the start of a unit, and there is no such unit.
  EXPECT_NE(ParseByteSize("1eb").status().message().find("unknown unit 'eb'"),
            absl::string_view::npos);
}

TEST(ParseByteSizeTest, BadSizesNameTheText) {
  for (const char* bad : {"6 gigs", "-1GiB", "0", "GiB", "", "1e400GiB", "nan", "3 parsecs"}) {
    const absl::StatusOr<uint64_t> size = ParseByteSize(bad);
    ASSERT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(size.status().message().find(absl::StrCat("'", bad, "'")), absl::string_view::npos)
        << size.status();
  }
  EXPECT_NE(ParseByteSize("-1GiB").status().message().find("positive"), absl::string_view::npos);
  EXPECT_NE(ParseByteSize("6 gigs").status().message().find("unit 'gigs'"),
            absl::string_view::npos);
}

TEST(ParseMemoryLimitTest, BytesAndShares) {
  EXPECT_EQ(ParseMemoryLimit("2GiB")->Resolve(100), 2ull << 30);
  EXPECT_EQ(ParseMemoryLimit("80%")->Resolve(1000), 800u);
  EXPECT_EQ(ParseMemoryLimit("80%")->ToString(), "80% of the device");
  EXPECT_EQ(ParseMemoryLimit("1.5GiB")->ToString(), "1.50 GiB");
  EXPECT_FALSE(ParseMemoryLimit("120%").ok());
  EXPECT_FALSE(ParseMemoryLimit("0%").ok());
  EXPECT_FALSE(ParseMemoryLimit("x%").ok());
}

TEST(ParseKeyValuesTest, PairsInOrder) {
  const auto pairs = ParseKeyValues(" budget=6GiB, codec = quant2 ,report=run.json",
                                    {"budget", "codec", "report"}, "ACTPACK_CONF");
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  ASSERT_EQ(pairs->size(), 3u);
  EXPECT_EQ((*pairs)[1], std::make_pair(std::string("codec"), std::string("quant2")));
}

TEST(ParseKeyValuesTest, BadItemsNameTheKey) {
  const std::vector<std::string> allowed = {"budget", "codec"};
  const auto unknown = ParseKeyValues("budget=1GiB,codek=quant2", allowed, "ACTPACK_CONF");
  EXPECT_NE(unknown.status().message().find("unknown key 'codek'"), absl::string_view::npos);
  EXPECT_NE(unknown.status().message().find("ACTPACK_CONF"), absl::string_view::npos);
  EXPECT_NE(ParseKeyValues("budget", allowed, "X").status().message().find("'budget' is not key=value"),
            absl::string_view::npos);
  EXPECT_NE(ParseKeyValues("budget=1,budget=2", allowed, "X").status().message().find("twice"),
            absl::string_view::npos);
  EXPECT_NE(ParseKeyValues("codec=", allowed, "X").status().message().find("no value"),
            absl::string_view::npos);
}

}  // namespace
}  // namespace actpack::runtime

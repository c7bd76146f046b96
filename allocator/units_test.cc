#include "allocator/units.h"

#include "gtest/gtest.h"

namespace actpack::allocator {
namespace {

using namespace literals;

TEST(UnitsTest, LiteralsAreBinaryUnits) {
  EXPECT_EQ(1_KiB, 1024u);
  EXPECT_EQ(3_MiB, 3u * 1024 * 1024);
  EXPECT_EQ(6_GiB, size_t{6} << 30);
}

TEST(UnitsTest, RoundUp) {
  EXPECT_EQ(RoundUp(0, 512), 0u);
  EXPECT_EQ(RoundUp(1, 512), 512u);
  EXPECT_EQ(RoundUp(512, 512), 512u);
  EXPECT_EQ(RoundUp(513, 512), 1024u);
}

TEST(UnitsTest, ShareOfRoundsDown) {
  EXPECT_EQ(ShareOf(1.0, 80_GiB), 80_GiB);
  EXPECT_EQ(ShareOf(0.5, 3), 1u);
  EXPECT_EQ(ShareOf(0.8, 10_GiB), size_t{8589934592});  // 0.8 * 10 GiB, exactly 8 GiB
  EXPECT_EQ(ShareOf(0.3, 1000), 300u);
}

TEST(UnitsTest, FormatBytes) {
  EXPECT_EQ(FormatBytes(0), "0 B");
  EXPECT_EQ(FormatBytes(1023), "1023 B");
  EXPECT_EQ(FormatBytes(1_KiB), "1.00 KiB");
  EXPECT_EQ(FormatBytes(1536), "1.50 KiB");
  EXPECT_EQ(FormatBytes(4_MiB), "4.00 MiB");
  EXPECT_EQ(FormatBytes(6_GiB), "6.00 GiB");
  EXPECT_EQ(FormatBytes(6_GiB - 20_MiB), "5.98 GiB");
  EXPECT_EQ(FormatBytes(1_MiB - 1), "1.00 MiB");  // not "1024.00 KiB"
  EXPECT_EQ(FormatBytes(size_t{1} << 40), "1.00 TiB");
}

}  // namespace
}  // namespace actpack::allocator

#include "codecs/registry.h"

#include "gtest/gtest.h"

namespace actpack::codecs {
namespace {

TEST(RegistryTest, FindsCodecsByIdAndName) {
  ASSERT_NE(FindCodec(CodecId::kQuant), nullptr);
  EXPECT_EQ(FindCodec(CodecId::kQuant)->name(), "quant");
  EXPECT_EQ(FindCodec(static_cast<CodecId>(999)), nullptr);
  EXPECT_EQ((*FindCodecByName("identity"))->id(), CodecId::kIdentity);
}

TEST(RegistryTest, ParsesSpecs) {
  absl::StatusOr<CodecParams> p = ParseCodecSpec("quant2");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->codec, CodecId::kQuant);
  EXPECT_EQ(p->bits, 2);
  p = ParseCodecSpec("quant:bits=4,group=128,seed=3");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->bits, 4);
  EXPECT_EQ(p->group_size, 128);
  EXPECT_EQ(p->seed, 3u);
  EXPECT_EQ(FormatCodecSpec(*p), "quant4:group=128");
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("quant8")), "quant8");
  EXPECT_EQ(ParseCodecSpec(" identity ")->codec, CodecId::kIdentity);
}

TEST(RegistryTest, BadSpecsNameTheValue) {
  for (const char* bad : {"quant3", "zstd", "quant:bits=x", "quant:colour=2", "quant:group=100", ""}) {
    const absl::StatusOr<CodecParams> p = ParseCodecSpec(bad);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseCodecSpec("zstd").status().message().find("'zstd'"), absl::string_view::npos);
  EXPECT_NE(ParseCodecSpec("zstd").status().message().find("quant"), absl::string_view::npos);
  EXPECT_NE(ParseCodecSpec("quant3").status().message().find("3"), absl::string_view::npos);
}

}  // namespace
}  // namespace actpack::codecs

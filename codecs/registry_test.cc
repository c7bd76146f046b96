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

TEST(RegistryTest, ParsesCastMaskAndPoolSpecs) {
  EXPECT_EQ(ParseCodecSpec("cast:fp16")->codec, CodecId::kCast);
  EXPECT_EQ(ParseCodecSpec("cast:fp16")->cast_to, DType::kFloat16);
  EXPECT_EQ(ParseCodecSpec("cast:bf16")->cast_to, DType::kBFloat16);
  EXPECT_EQ(ParseCodecSpec("cast:to=bfloat16")->cast_to, DType::kBFloat16);
  EXPECT_EQ(ParseCodecSpec("cast")->cast_to, DType::kFloat16);
  EXPECT_EQ(ParseCodecSpec("bf16")->codec, CodecId::kCast);
  EXPECT_EQ(ParseCodecSpec("bf16")->cast_to, DType::kBFloat16);
  EXPECT_EQ(ParseCodecSpec("fp16")->cast_to, DType::kFloat16);
  EXPECT_EQ(ParseCodecSpec("mask")->codec, CodecId::kMask);
  EXPECT_EQ(ParseCodecSpec("pool4")->codec, CodecId::kPool);
  EXPECT_EQ(ParseCodecSpec("pool4")->pool_window, 4);
  EXPECT_EQ(ParseCodecSpec("pool:k=8")->pool_window, 8);
  EXPECT_EQ(FindCodec(CodecId::kCast)->name(), "cast");
  EXPECT_EQ(FindCodec(CodecId::kMask)->name(), "mask");
  EXPECT_EQ(FindCodec(CodecId::kPool)->name(), "pool");
}

TEST(RegistryTest, FormatCodecSpecRoundTrips) {
  for (const char* spec : {"identity", "quant2", "quant4:group=128", "cast:fp16", "cast:bf16",
                           "mask", "pool2", "pool8", "pool64"}) {
    absl::StatusOr<CodecParams> p = ParseCodecSpec(spec);
    ASSERT_TRUE(p.ok()) << spec << ": " << p.status();
    EXPECT_EQ(FormatCodecSpec(*p), spec);
    absl::StatusOr<CodecParams> again = ParseCodecSpec(FormatCodecSpec(*p));
    ASSERT_TRUE(again.ok());
    EXPECT_EQ(again->codec, p->codec);
    EXPECT_EQ(again->cast_to, p->cast_to);
    EXPECT_EQ(again->pool_window, p->pool_window);
  }
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("bf16")), "cast:bf16");
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("pool:k=8")), "pool8");
}

TEST(RegistryTest, BadCastMaskAndPoolSpecs) {
  for (const char* bad : {"cast:fp8", "cast:to=int8", "mask2", "cast4", "pool1", "pool65",
                          "pool:k=x", "fp16:bits=2", "pool:k=99999999999"}) {
    EXPECT_EQ(ParseCodecSpec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
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

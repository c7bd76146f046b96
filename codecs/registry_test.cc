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

TEST(RegistryTest, ParsesEbSpecs) {
  absl::StatusOr<CodecParams> p = ParseCodecSpec("eb");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->codec, CodecId::kEb);
  EXPECT_EQ(p->eb_mode, EbMode::kRelative);
  EXPECT_EQ(p->error_bound, 1e-2);
  p = ParseCodecSpec("eb:rel=1e-2");  // the runtime's default ladder names this one
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->eb_mode, EbMode::kRelative);
  EXPECT_EQ(p->error_bound, 1e-2);
  p = ParseCodecSpec("eb:abs=0.01");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->eb_mode, EbMode::kAbsolute);
  EXPECT_EQ(p->error_bound, 0.01);
  EXPECT_EQ(ParseCodecSpec("eb:rel=1e-3")->error_bound, 1e-3);
  EXPECT_EQ(FindCodec(CodecId::kEb)->name(), "eb");
}

TEST(RegistryTest, AutoSpecsParseAsTheirOwnCodecAndReadBack) {
  int specs = 0;
  for (const Codec* codec : AllCodecs()) {
    for (const std::string& spec : codec->AutoSpecs()) {
      absl::StatusOr<CodecParams> p = ParseCodecSpec(spec);
      ASSERT_TRUE(p.ok()) << codec->name() << ": " << spec << ": " << p.status();
      EXPECT_EQ(p->codec, codec->id()) << spec;
      EXPECT_EQ(FormatCodecSpec(*p), spec);
      EXPECT_TRUE(codec->CheckEncodable({DType::kFloat32, {8, 4, 16, 16}}, *p).ok()) << spec;
      ++specs;
    }
  }
  // quant's three strengths, eb's bound and division.
  EXPECT_EQ(specs, 5);
  EXPECT_TRUE(FindCodec(CodecId::kIdentity)->AutoSpecs().empty());  // lossless: never a rung
}

TEST(RegistryTest, LosslessCodecsAreTheExactOnesAndNeverRungs) {
  std::vector<std::string> lossless;
  for (const Codec* codec : AllCodecs()) {
    if (!codec->lossless()) continue;
    lossless.emplace_back(codec->name());
    EXPECT_TRUE(codec->AutoSpecs().empty()) << codec->name();
  }
  EXPECT_EQ(lossless, (std::vector<std::string>{"identity", "mask", "bitpack"}));
}

TEST(RegistryTest, EbSpecsRoundTrip) {
  for (const char* spec : {"eb:rel=1e-2", "eb:rel=1e-3", "eb:abs=1e-2", "eb:abs=2.5e-1",
                           "eb:abs=3e0", "eb:rel=1.234e-5", "eb:abs=1e30"}) {
    absl::StatusOr<CodecParams> p = ParseCodecSpec(spec);
    ASSERT_TRUE(p.ok()) << spec << ": " << p.status();
    EXPECT_EQ(FormatCodecSpec(*p), spec);
  }
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("eb")), "eb:rel=1e-2");
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("eb:abs=0.001")), "eb:abs=1e-3");
  EXPECT_EQ(FormatCodecSpec(*ParseCodecSpec("eb:abs=3")), "eb:abs=3e0");
}

TEST(RegistryTest, BadEbSpecsNameTheValue) {
  for (const char* bad : {"eb:rel=0", "eb:rel=2", "eb:rel=-1e-3", "eb:abs=0", "eb:abs=-1",
                          "eb:abs=1e31", "eb:rel=x", "eb:rel=nan", "eb:abs=inf", "eb3",
                          "eb:rel=1e-3,abs=0.1", "eb:bound=1"}) {
    EXPECT_EQ(ParseCodecSpec(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseCodecSpec("eb:rel=2").status().message().find("2"), absl::string_view::npos);
  EXPECT_NE(ParseCodecSpec("eb:rel=x").status().message().find("'x'"), absl::string_view::npos);
  EXPECT_NE(ParseCodecSpec("eb:rel=1e-3,abs=0.1").status().message().find("one bound"),
            absl::string_view::npos);
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

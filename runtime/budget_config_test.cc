// BudgetConfig: every option's range checked in one place (the message names the option and
// the value), what a valid configuration means for the session and the run, and ACTPACK_CONF.
#include "runtime/budget_config.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace actpack::runtime {
namespace {

BudgetConfig Valid() {
  BudgetConfig config;
  config.limit = "1GiB";
  return config;
}

std::string Refusal(const BudgetConfig& config) {
  const absl::Status status = config.Validate();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  return std::string(status.message());
}

TEST(BudgetConfigTest, TheDefaultsAreValid) {
  EXPECT_TRUE(Valid().Validate().ok());
  EXPECT_EQ(Valid().MinBytes(), kDefaultMinBytes);
  EXPECT_EQ(Valid().Recompute(), RecomputeMode::kOff);
}

TEST(BudgetConfigTest, EachBadValueIsNamedInOneLine) {
  BudgetConfig config = Valid();
  config.limit = "";
  EXPECT_EQ(Refusal(config),
            "actpack.budget: the limit is empty; give a budget such as \"6GiB\" or \"80%\"");
  config = Valid();
  config.limit = "6 gigs";
  EXPECT_THAT(Refusal(config), ::testing::HasSubstr("invalid memory size '6 gigs'"));
  config = Valid();
  config.headroom = 0.7;
  EXPECT_EQ(Refusal(config), "actpack.budget: headroom=0.7 is out of range; expected a share of "
                             "the budget in [0, 0.5)");
  config.headroom = NAN;
  EXPECT_EQ(Refusal(config), "actpack.budget: headroom=nan is not finite; expected a share of "
                             "the budget in [0, 0.5)");
  config = Valid();
  config.min_bytes = "-5";
  EXPECT_THAT(Refusal(config),
              ::testing::StartsWith("actpack: invalid min_bytes '-5': the size must be positive"));
  config.min_bytes = "0";
  EXPECT_TRUE(config.Validate().ok());
  EXPECT_EQ(config.MinBytes(), 0u);
  config = Valid();
  config.profile_every = 0;
  EXPECT_THAT(Refusal(config), ::testing::StartsWith("actpack.budget: profile_every=0 is out of "
                                                     "range"));
  config = Valid();
  config.max_rel_rms = -0.1;
  EXPECT_THAT(Refusal(config), ::testing::HasSubstr("max_rel_rms"));
  EXPECT_THAT(Refusal(config), ::testing::EndsWith("got -0.1"));
  config = Valid();
  config.recompute = "yes";
  EXPECT_EQ(Refusal(config),
            "actpack.budget: recompute must be True, False or \"auto\", got 'yes'");
  // Text the C++ guard or ACTPACK_CONF passes unchecked stays on one line, as repr shows it.
  config.recompute = "\n0'\\\x01";
  EXPECT_EQ(Refusal(config),
            "actpack.budget: recompute must be True, False or \"auto\", got '\\n0\\'\\\\\\x01'");
  config = Valid();
  config.codec = "quant3";
  EXPECT_THAT(Refusal(config), ::testing::HasSubstr("quant3"));
  config = Valid();
  config.allowed_loss_increase = 0;
  EXPECT_THAT(Refusal(config), ::testing::EndsWith("in (0, 1) (e.g. 0.01), got 0.0"));
  config.allowed_loss_increase = 0.01;
  config.rules = {{"enc*", "quant4"}};
  EXPECT_THAT(Refusal(config), ::testing::HasSubstr("does not apply to codec 'quant4'"));
}

TEST(BudgetConfigTest, WhatAValidConfigurationMeans) {
  BudgetConfig config = Valid();
  EXPECT_TRUE(config.Automatic() && config.Chooses() && config.GuardsGradients());
  EXPECT_EQ(config.Packing(), "codec 'auto'");
  config.codec = "none";  // plain training
  EXPECT_FALSE(config.Packs() || config.Automatic() || config.GuardsGradients());
  EXPECT_EQ(config.Packing(), "plain training (enabled=False)");
  for (const char* lossless : {"identity", "mask", "bitpack"}) {  // nothing to guard
    config.codec = lossless;
    EXPECT_FALSE(config.Automatic() || config.GuardsGradients()) << lossless;
  }
  for (const char* lossy : {"quant2", "cast:bf16", "eb:rel=1e-3", "division_dct:keep=4"}) {
    config.codec = lossy;
    EXPECT_TRUE(config.GuardsGradients()) << lossy;
  }
  config.codec = "identity";
  config.rules = {{"enc*", "identity"}, {"*", "pool4"}};  // a lossy rule arms it
  EXPECT_TRUE(config.GuardsGradients());
  config.rules = {{"enc*", "identity"}, {"*", "mask"}};
  EXPECT_FALSE(config.GuardsGradients());
  config.rules.clear();
  config.codec = "auto";
  config.rules = {{"*", "quant2"}};  // a mapping without "auto": auto chooses nothing
  EXPECT_TRUE(config.Automatic());
  EXPECT_FALSE(config.Chooses());
  EXPECT_EQ(config.CodecText(), "{'*': 'quant2'}");
  config.enabled = false;
  EXPECT_FALSE(config.Packs() || config.GuardsGradients());
  absl::StatusOr<SessionOptions> options = Valid().SessionOptionsFor(1 << 20, 4096);
  ASSERT_TRUE(options.ok());
  EXPECT_EQ(options->budget_bytes, 1u << 20);
  EXPECT_EQ(options->outside_allowance_bytes, 4096u);
  EXPECT_TRUE(options->codec.automatic);
}

TEST(BudgetConfTest, ParsesEveryKeyAndNamesABadValue) {
  absl::StatusOr<BudgetConf> conf = ParseBudgetConf(
      "budget=6GiB,codec=eb,report=run.json,min_bytes=0,seed=7,enabled=1,allocator=cpu,"
      "allowed_loss_increase=0.01,recompute=auto,max_rel_rms=none,device=cuda:1");
  ASSERT_TRUE(conf.ok()) << conf.status();
  EXPECT_EQ(conf->config.limit, "6GiB");
  EXPECT_EQ(conf->config.MinBytes(), 0u);
  EXPECT_EQ(conf->config.seed, 7u);
  EXPECT_EQ(conf->config.allowed_loss_increase, 0.01);
  EXPECT_EQ(conf->config.recompute, "auto");
  EXPECT_EQ(conf->config.max_rel_rms, 0.0);
  EXPECT_EQ(conf->allocator, "cpu");
  EXPECT_EQ(conf->device, "cuda:1");
  EXPECT_EQ(conf->given.size(), BudgetConfKeys().size());
  const auto refused = [](const char* text) {
    return std::string(ParseBudgetConf(text).status().message());
  };
  EXPECT_EQ(refused("codec=quant2"),
            "actpack: ACTPACK_CONF: key 'budget' is required, e.g. "
            "ACTPACK_CONF=\"budget=6GiB,codec=quant2\"");
  EXPECT_EQ(refused("budget=1GiB,seed=x"),
            "actpack: ACTPACK_CONF: key 'seed' is 'x'; expected an integer");
  EXPECT_EQ(refused("budget=1GiB,recompute=maybe"),
            "actpack: ACTPACK_CONF: key 'recompute' is 'maybe'; expected true, false or auto");
  EXPECT_EQ(refused("budget=1GiB,allocator=gpu"),
            "actpack: ACTPACK_CONF: key 'allocator' is 'gpu'; expected one of auto, cpu, cuda, "
            "none");
  // A value of the right type out of range: the same message as from actpack.budget.
  EXPECT_EQ(refused("budget=1GiB,codec=quant2,allowed_loss_increase=0.01"),
            "actpack.budget: allowed_loss_increase sets the error bounds of 'eb' and the caps of "
            "'auto'; it does not apply to codec 'quant2' (use 'eb' or 'auto', or leave "
            "allowed_loss_increase out)");
}

TEST(ShowNumberTest, AsPythonsReprOfAFloat) {
  EXPECT_EQ(ShowNumber(0.7), "0.7");
  EXPECT_EQ(ShowNumber(0.0), "0.0");
  EXPECT_EQ(ShowNumber(1.0), "1.0");
  EXPECT_EQ(ShowNumber(-1.5), "-1.5");
  EXPECT_EQ(ShowNumber(1e-7), "1e-07");
  EXPECT_EQ(ShowNumber(0.0001), "0.0001");
  EXPECT_EQ(ShowNumber(1e15), "1000000000000000.0");
  EXPECT_EQ(ShowNumber(1e16), "1e+16");
  EXPECT_EQ(ShowNumber(1.5e300), "1.5e+300");
  EXPECT_EQ(ShowNumber(123.456), "123.456");
  EXPECT_EQ(ShowNumber(0.123456789), "0.123456789");
  EXPECT_EQ(ShowNumber(-INFINITY), "-inf");
}

}  // namespace
}  // namespace actpack::runtime

// BudgetRun over a scripted pool: the cap from the start, the lift before the first plan and
// its bound, the out-of-memory errors (the smallest budget that would work, the recompute
// hint), the switch to recomputation, and the run section's peaks and warnings.
#include "runtime/budget_run.h"

#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "allocator/units.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "runtime/session_test_util.h"

namespace actpack::runtime {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kMiB = 1 << 20;

// A pool whose next peaks the test sets; it records the cap and the cache releases.
class ScriptedMemory : public BudgetMemory {
 public:
  MemoryPeaks TakePeaks() override {
    MemoryPeaks peaks = next;
    next = {};
    return peaks;
  }
  void ReleaseCache() override { ++releases; }
  uint64_t Cap() override { return cap; }
  void SetCap(uint64_t bytes) override {
    cap = bytes;
    caps.push_back(bytes);
  }

  MemoryPeaks next;
  uint64_t cap = kNoCap;
  std::vector<uint64_t> caps;
  int releases = 0;
};

BudgetConfig Config(const std::string& codec) {
  BudgetConfig config;
  config.limit = "64MiB";
  config.codec = codec;
  config.headroom = 0.15;
  return config;
}

BudgetConfig Fixed() { return Config("quant2"); }
BudgetConfig Automatic() { return Config("auto"); }

BudgetMemoryFacts Facts(uint64_t budget) {
  BudgetMemoryFacts facts;
  facts.budget_bytes = budget;
  return facts;
}

TEST(BudgetRunTest, CapsFromTheStartAndPutsTheCapBackWhenStopped) {
  Session session(Options("quant2"), HostFactory());
  ScriptedMemory memory;
  memory.cap = 123 * kMiB;
  BudgetRun run(Fixed(), Facts(64 * kMiB), session, memory, nullptr);
  run.Start();
  EXPECT_EQ(memory.cap, 64 * kMiB);
  EXPECT_EQ(memory.releases, 1);  // what ran before the run is given back under the cap
  memory.next = {30 * kMiB, 40 * kMiB, 0};
  ASSERT_TRUE(run.EndStep().ok());
  run.Stop();
  EXPECT_TRUE(run.RunSection({})["warnings"].empty());
  EXPECT_EQ(memory.cap, 123 * kMiB);
  run.Stop();  // idempotent
  EXPECT_EQ(run.Relieve(kMiB), 0u);  // a stopped run makes no room: the cap is not its own
  EXPECT_EQ(memory.caps.size(), 2u);
  EXPECT_EQ(run.run_peaks().reserved, 40 * kMiB);
}

// A pool with live blocks in its segments: the second TakePeaks of Start, after the cache is
// given back and the peaks restarted, reads what it holds.
class PinnedMemory : public ScriptedMemory {
 public:
  MemoryPeaks TakePeaks() override {
    return ++calls == 2 ? MemoryPeaks{0, held, 0} : MemoryPeaks{};
  }
  uint64_t held = 0;
  int calls = 0;
};

TEST(BudgetRunTest, APoolThatHoldsMoreThanTheBudgetAtTheStartIsSaid) {
  Session session(Options("quant2"), HostFactory());
  PinnedMemory memory;
  memory.held = 2 * kMiB;  // a segment a live gradient pins
  BudgetRun run(Fixed(), Facts(kMiB / 4), session, memory, nullptr);
  run.Start();
  run.Stop();
  const json::Value warnings = run.RunSection({})["warnings"];
  ASSERT_EQ(warnings.size(), 1u) << warnings;  // what was held before is not the run's peak
  EXPECT_EQ(warnings[0], "the pool holds 2.00 MiB at the start of the run, over the budget "
                         "256.00 KiB: segments that live tensors made before it pin cannot be "
                         "given back, and a cap binds new reservations only, so the run's steps "
                         "may use them all");
}

TEST(BudgetRunTest, AFixedCodecsFirstStepMayGoOverToSayWhatBudgetItNeeds) {
  Session session(Options("quant2"), HostFactory());
  ScriptedMemory memory;
  BudgetRun run(Fixed(), Facts(64 * kMiB), session, memory, nullptr);
  run.Start();
  // Short by 1 MiB: lifted by that and a small segment, at least a quarter of the cap.
  EXPECT_EQ(run.Relieve(kMiB), 16 * kMiB);
  EXPECT_EQ(memory.cap, 80 * kMiB);
  EXPECT_EQ(run.Relieve(30 * kMiB), 32 * kMiB);  // 80 + 30 + 2 MiB
  EXPECT_EQ(memory.cap, 112 * kMiB);
  memory.next = {90 * kMiB, 100 * kMiB, 0};
  const int releases = memory.releases;
  absl::StatusOr<BudgetRun::StepEnd> end = run.EndStep();
  ASSERT_EQ(end.status().code(), absl::StatusCode::kResourceExhausted) << end.status();
  // 100 MiB with 15% headroom.
  EXPECT_THAT(end.status().message(),
              HasSubstr("a budget of 64.00 MiB cannot hold this training step with codec "
                        "'quant2': step 1 went over it and peaked at 100.00 MiB; the smallest "
                        "budget that would work is " +
                        allocator::FormatBytes(BudgetFor(100 * kMiB, 0.15))));
  EXPECT_EQ(memory.cap, 64 * kMiB);  // restored, and the cache released under it
  EXPECT_GT(memory.releases, releases);
  // The next step gets no lift: it would run over again.
  EXPECT_EQ(run.Relieve(kMiB), 0u);
}

TEST(BudgetRunTest, TheLiftIsBoundedAndAStepThatRanOutUnderItSaysSo) {
  Session session(Options("quant2"), HostFactory());
  ScriptedMemory memory;
  BudgetRun run(Fixed(), Facts(64 * kMiB), session, memory, nullptr);
  run.Start();
  EXPECT_EQ(run.LiftedCapBytes(), 64 * kMiB + (1u << 30));  // 1 GiB over beats 4x here
  EXPECT_EQ(run.Relieve(8ull << 30), run.LiftedCapBytes() - 64 * kMiB);
  EXPECT_EQ(run.Relieve(8ull << 30), 0u);  // at the bound
  EXPECT_FALSE(run.OutOfMemoryWhileMeasuring("x").has_value());  // still running
  run.Stop();
  const std::optional<std::string> error = run.OutOfMemoryWhileMeasuring("1.00 GiB short");
  ASSERT_TRUE(error.has_value());
  EXPECT_THAT(*error, HasSubstr("step 1 ran out even at 1.06 GiB"));
  EXPECT_THAT(*error, HasSubstr("(1.00 GiB short)"));
  EXPECT_EQ(memory.cap, kNoCap);
}

TEST(BudgetRunTest, ThePolicyRepacksFirstAndItsFirstTwoStepsMayLift) {
  Session session(AutoOptions(64 * kMiB), HostFactory());
  ScriptedMemory memory;
  size_t repacked = 0;
  BudgetRun run(Automatic(), Facts(64 * kMiB), session, memory,
                [&](size_t needed) { return repacked = needed; });
  run.Start();
  EXPECT_EQ(run.Relieve(kMiB), kMiB);  // the policy's re-packing made the room
  EXPECT_EQ(memory.cap, 64 * kMiB);
  BudgetRun lifting(Automatic(), Facts(64 * kMiB), session, memory, [](size_t) { return size_t{0}; });
  lifting.Start();
  // The first step may go over: the policy plans at the end of the second.
  EXPECT_GT(lifting.Relieve(kMiB), 0u);
  memory.next = {70 * kMiB, 80 * kMiB, 0};
  ASSERT_TRUE(lifting.EndStep().ok());
  EXPECT_EQ(memory.cap, 64 * kMiB);
  // So may the second; but then the policy made no plan (nothing was saved here), and the
  // next step would go over the same way.
  EXPECT_GT(lifting.Relieve(kMiB), 0u);
  memory.next = {70 * kMiB, 80 * kMiB, 0};
  EXPECT_THAT(lifting.EndStep().status().message(),
              HasSubstr("step 2 went over it and peaked at 80.00 MiB"));
  EXPECT_EQ(lifting.Relieve(kMiB), 0u);
}

TEST(BudgetRunTest, NoPlanFitsSaysWhatRecomputationWouldDo) {
  for (bool regions : {false, true}) {
    Session session(AutoOptions(2 * kMiB), HostFactory());
    ScriptedMemory memory;
    BudgetRun run(Automatic(), Facts(2 * kMiB), session, memory, nullptr);
    run.Start();
    absl::Status status;
    for (int step = 0; step < 3 && status.ok(); ++step) {
      const uint64_t held = RunStep(session);
      if (regions) {
        EXPECT_FALSE(run.NoteRegion());
      }
      memory.next = {(3 * kMiB) + held, (3 * kMiB) + held, 0};
      status = run.EndStep().status();
    }
    ASSERT_EQ(status.code(), absl::StatusCode::kResourceExhausted) << status;
    EXPECT_THAT(status.message(), HasSubstr("smallest budget that would work"));
    EXPECT_THAT(status.message(),
                HasSubstr(regions ? "the regions this model marks with actpack.recompute would "
                                    "recompute instead"
                                  : "or recompute: blocks marked with actpack.recompute"));
  }
}

TEST(BudgetRunTest, UnderRecomputeAutoTheRegionsTakeOverWhereCodecsCannotFit) {
  Session session(AutoOptions(2 * kMiB), HostFactory());
  ScriptedMemory memory;
  BudgetConfig config = Automatic();
  config.recompute = "auto";
  BudgetRun run(config, Facts(2 * kMiB), session, memory, nullptr);
  run.Start();
  std::optional<std::string> warning;
  int step = 0;
  for (; step < 3 && !warning.has_value(); ++step) {
    const uint64_t held = RunStep(session);
    EXPECT_FALSE(run.NoteRegion());
    memory.next = {(3 * kMiB) + held, (3 * kMiB) + held, 0};
    absl::StatusOr<BudgetRun::StepEnd> end = run.EndStep();
    ASSERT_TRUE(end.ok()) << end.status();
    warning = end->warning;
  }
  ASSERT_TRUE(warning.has_value());
  EXPECT_EQ(*warning, "the budget does not hold step " + std::to_string(step) +
                          " with codecs alone: the regions marked with actpack.recompute "
                          "recompute from step " + std::to_string(step + 1) + " on");
  EXPECT_TRUE(run.recomputing());
  EXPECT_TRUE(run.NoteRegion());
  // The steps after the switch plan afresh: the next two may lift the cap to measure.
  EXPECT_GT(run.Relieve(kMiB), 0u);
  // The switch is said once among the run's warnings, and the report's first capped step
  // is two past it.
  const json::Value section = run.RunSection({});
  EXPECT_EQ(section["warnings"][0], *warning);
  EXPECT_EQ(section["capped_from_step"], step + 2);
  // A switch at the first plan: what the configuration's rule allows for, and no more.
  EXPECT_EQ(section["capped_from_step"], CappedFromStep(config));
}

// The policy plans at every step's end; the cache is given back only when a plan changes a
// codec (the next peak must show the new plan's footprint). The same plan keeps it: given back
// at every step, it is mapped and touched anew at every step.
TEST(BudgetRunTest, OnlyAPlanThatChangesACodecGivesTheCacheBack) {
  // Four 64 KiB tensors under 2 MiB: kept exact beside 1 MiB, packed beside 1.9 MiB.
  Session session(AutoOptions(2 * kMiB), HostFactory());
  ScriptedMemory memory;
  BudgetRun run(Automatic(), Facts(2 * kMiB), session, memory, nullptr);
  run.Start();
  auto step = [&](uint64_t other_bytes) {
    const uint64_t held = RunStep(session);
    memory.next = {other_bytes + held, other_bytes + held, 0};
    ASSERT_TRUE(run.EndStep().ok());
  };
  step(kMiB);
  step(kMiB);  // the first plan
  ASSERT_EQ(session.Policy().changed_plans, 1u);
  const int releases = memory.releases;
  const uint64_t plans = session.Policy().plans;
  for (int i = 0; i < 3; ++i) step(kMiB);
  EXPECT_GT(session.Policy().plans, plans);  // planned again, to the same codecs
  EXPECT_EQ(session.Policy().changed_plans, 1u);
  EXPECT_EQ(memory.releases, releases);
  step(19 * kMiB / 10);  // the rest of the step grew: the plan packs
  EXPECT_EQ(session.Policy().changed_plans, 2u);
  EXPECT_EQ(memory.releases, releases + 1);
}

TEST(BudgetRunTest, TheRunSectionHasTheRunsPeaksAndSaysWhatWentOver) {
  Session session(Options("quant2"), HostFactory());
  ScriptedMemory memory;
  BudgetMemoryFacts target = Facts(64 * kMiB);
  target.capped = false;  // torch's CUDA allocator: a target
  target.outside_allowance_bytes = 4 * kMiB;
  BudgetRun run(Fixed(), target, session, memory, nullptr);
  run.Start();
  EXPECT_EQ(memory.cap, kNoCap);  // never set
  EXPECT_EQ(run.Relieve(kMiB), 0u);  // nothing to lift
  EXPECT_TRUE(run.Warn("first"));
  EXPECT_FALSE(run.Warn("first"));
  memory.next = {60 * kMiB, 70 * kMiB, 80 * kMiB};
  ASSERT_TRUE(run.EndStep().ok());  // over a target: the report says so, the run goes on
  memory.next = {10 * kMiB, 20 * kMiB, 30 * kMiB};
  ASSERT_TRUE(run.EndStep().ok());
  run.Stop();
  BudgetRun::RunFacts facts;
  facts.torch = "2.13.0";
  facts.system_memory = "resident set";
  const json::Value section = run.RunSection(facts);
  std::vector<std::string> keys;
  for (const auto& [key, value] : section.items()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{
                      "torch", "python", "device", "budget", "budget_bytes", "codec",
                      "allowed_loss_increase", "max_rel_rms", "capped_from_step",
                      "peak_allocated_bytes",
                      "peak_reserved_bytes", "peak_system_bytes", "system_memory",
                      "wall_seconds", "rank", "world_size", "warnings"}));
  EXPECT_EQ(section["budget"], "64.00 MiB");  // the configuration's limit
  EXPECT_EQ(section["codec"], "quant2");
  EXPECT_TRUE(section["capped_from_step"].is_null());  // a target: nothing was capped
  EXPECT_TRUE(section["python"].is_null() && section["allowed_loss_increase"].is_null());
  EXPECT_EQ(section["budget_bytes"], 64 * kMiB);
  EXPECT_EQ(section["peak_allocated_bytes"], 60 * kMiB);
  EXPECT_EQ(section["peak_reserved_bytes"], 70 * kMiB);
  EXPECT_EQ(section["peak_system_bytes"], 80 * kMiB);
  ASSERT_EQ(section["warnings"].size(), 3u);
  EXPECT_EQ(section["warnings"][0], "first");
  EXPECT_EQ(section["warnings"][1], "peak memory 70.00 MiB exceeded the budget 64.00 MiB");
  EXPECT_EQ(section["warnings"][2],
            "the system counted 80.00 MiB at the peak (resident set), over the budget 64.00 MiB "
            "and the 4.00 MiB allowed outside it");
  // No system count: null, and no warning about it.
  ScriptedMemory quiet;
  BudgetRun unmeasured(Fixed(), Facts(64 * kMiB), session, quiet, nullptr);
  unmeasured.Start();
  unmeasured.Stop();
  EXPECT_TRUE(unmeasured.RunSection({})["peak_system_bytes"].is_null());
}

TEST(BudgetRunTest, TheFirstStepHeldToTheCapFollowsThePlan) {
  BudgetConfig config = Fixed();
  EXPECT_EQ(CappedFromStep(config), 1);  // nothing to plan: only the first step may lift
  config.codec = "none";
  EXPECT_EQ(CappedFromStep(config), 1);
  EXPECT_EQ(CappedFromStep(Automatic()), 2);  // auto plans at the end of its second step
  config = Automatic();
  config.rules = {{"*", "quant2"}};  // rules: the policy plans (and measures first)
  EXPECT_EQ(CappedFromStep(config), 2);
  config.recompute = "auto";  // a switch at the end of the second step, two more to plan
  EXPECT_EQ(CappedFromStep(config), 4);
  BudgetConfig fixed_recomputing = Fixed();
  fixed_recomputing.recompute = "auto";  // a switch at the end of the first, one more
  EXPECT_EQ(CappedFromStep(fixed_recomputing), 2);
  // A run's report says what the run did: auto under recompute="auto" that never switched is
  // held to the cap from its third step, not the fifth the configuration allows for.
  Session fixed_session(Options("quant2"), HostFactory());
  Session auto_session(AutoOptions(64 * kMiB), HostFactory());
  ScriptedMemory memory;
  BudgetRun fixed(Fixed(), Facts(64 * kMiB), fixed_session, memory, nullptr);
  EXPECT_EQ(fixed.RunSection({})["capped_from_step"], 1);
  BudgetRun unswitched(config, Facts(64 * kMiB), auto_session, memory, nullptr);
  EXPECT_EQ(unswitched.RunSection({})["capped_from_step"], 2);
}

TEST(BudgetRunTest, HeldOutsideTakesFromTheAllowanceThenFromTheBudget) {
  BudgetMemoryFacts facts = Facts(64 * kMiB);
  facts.outside_allowance_bytes = 8 * kMiB;
  BudgetMemoryFacts within = HoldingOutside(facts, 3 * kMiB);
  EXPECT_EQ(within.budget_bytes, 64 * kMiB);
  EXPECT_EQ(within.outside_allowance_bytes, 5 * kMiB);
  BudgetMemoryFacts beyond = HoldingOutside(facts, 10 * kMiB);
  EXPECT_EQ(beyond.budget_bytes, 62 * kMiB);
  EXPECT_EQ(beyond.outside_allowance_bytes, 0u);
  EXPECT_EQ(HoldingOutside(facts, 100 * kMiB).budget_bytes, 1u);  // a byte stays
}

TEST(GradientGuardTest, TwoHighStepsOfThreeAreARunawayAndOneSpikeIsNot) {
  // Norms 397, 154, 440 against a median of 3: 130x, 51x, 146x. The 51x step does not reset
  // the count: the third step is the second high one of three. A high step's norm stays out
  // of the median; the 51x one is in it.
  GradientGuard guard("'quant2'");
  for (int step = 0; step < 8; ++step) EXPECT_EQ(guard.Observe(step, 3.0, {}), std::nullopt);
  EXPECT_EQ(guard.Observe(8, 397.0, {{"blocks.0", 1.0}}), std::nullopt);
  EXPECT_EQ(guard.Observe(9, 154.0, {{"blocks.0", 1.0}}), std::nullopt);
  const std::optional<std::string> caught =
      guard.Observe(10, 440.0, {{"", 5.0}, {"blocks.0", 1.0}, {"a", 3.0}, {"b", 2.0}});
  ASSERT_TRUE(caught.has_value());
  EXPECT_EQ(*caught,
            "actpack: the gradient norm ran away under codec 'quant2': 440 at step 10, 147x its "
            "median over the last 9 steps (3), in 2 of the last 3 steps; largest in (top), a, b");
  GradientGuard spikes("'quant2'");
  const std::vector<double> norms = {3, 3, 3, 3, 3, 3, 3, 3, 400, 3, 3, 400, 3, 3, 400};
  for (size_t step = 0; step < norms.size(); ++step) {
    EXPECT_EQ(spikes.Observe(static_cast<int64_t>(step), norms[step], {}), std::nullopt) << step;
  }
  GradientGuard infinite("'quant2'");
  for (int step = 0; step < 8; ++step) infinite.Observe(step, 3.0, {});
  EXPECT_EQ(infinite.Observe(8, INFINITY, {}), std::nullopt);  // not judged
  EXPECT_EQ(infinite.Observe(9, INFINITY, {}), std::nullopt);
}

TEST(BudgetRunTest, AGradientRunawayStopsAFixedCodecAndTightensAutoThreeTimes) {
  for (const std::string codec : {"quant2", "auto"}) {
    Session session(codec == "auto" ? AutoOptions(64 * kMiB) : Options(codec.c_str()), HostFactory());
    ScriptedMemory memory;
    BudgetRun run(Config(codec), Facts(64 * kMiB), session, memory, nullptr);
    run.Start();
    std::vector<std::string> verdicts;
    for (int step = 1; step <= 20; ++step) {
      memory.next = {kMiB, kMiB, 0};
      ASSERT_TRUE(run.EndStep().ok());
      const double norm = step <= 8 ? 1.0 : 1e4;
      const BudgetRun::GradientVerdict verdict = run.ObserveGradients({{"fc", norm}});
      if (verdict.action == BudgetRun::GradientVerdict::kTrainOn) continue;
      verdicts.push_back(absl::StrCat(step, verdict.action == BudgetRun::GradientVerdict::kStop
                                                ? " stop"
                                                : " drop"));
      if (verdict.action == BudgetRun::GradientVerdict::kStop) {
        EXPECT_THAT(verdict.message, HasSubstr(codec == "auto" ? "tightened its fidelity floor 3"
                                                               : "use a finer codec"));
        break;
      }
      EXPECT_THAT(verdict.message, HasSubstr("this step's gradients were dropped"));
    }
    if (codec == "auto") {
      EXPECT_EQ(verdicts, (std::vector<std::string>{"10 drop", "12 drop", "14 drop", "16 stop"}));
      EXPECT_EQ(session.Policy().floor_tightenings, 3u);
    } else {
      EXPECT_EQ(verdicts, (std::vector<std::string>{"10 stop"}));
    }
  }
  // Lossless packing and a guard turned off do not judge.
  for (BudgetConfig config : {Config("identity"), Config("quant2")}) {
    config.gradient_guard = config.codec == "identity";
    Session session(Options(config.codec.c_str()), HostFactory());
    ScriptedMemory memory;
    BudgetRun run(config, Facts(64 * kMiB), session, memory, nullptr);
    for (int step = 1; step <= 12; ++step) {
      EXPECT_EQ(run.ObserveGradients({{"fc", step <= 8 ? 1.0 : 1e4}}).action,
                BudgetRun::GradientVerdict::kTrainOn);
    }
  }
}

}  // namespace
}  // namespace actpack::runtime

#include "runtime/policy.h"

#include <cstdint>
#include <limits>
#include <optional>
#include <random>

#include "gtest/gtest.h"

namespace actpack::runtime {
namespace {

// keep / quant8 / quant4 / quant2 as the session measures them, for a tensor of `raw` bytes
// whose error scales with `scale`.
PolicyItem Ladder(uint64_t raw, double scale) {
  return {{{"none", raw, 0.0},
           {"quant8", raw / 4 + 64, 1e-5 * scale},
           {"quant4", raw / 8 + 64, 4e-3 * scale},
           {"quant2", raw / 16 + 64, 5e-2 * scale}},
          1.0};
}

TEST(PolicyTest, KeepsEverythingExactWhenItFits) {
  PolicyInput input{1000000, 100000, 0.05, {Ladder(100000, 1), Ladder(200000, 1)}};
  PolicyPlan plan = SolvePolicy(input);
  EXPECT_TRUE(plan.feasible);
  EXPECT_EQ(plan.choice, (std::vector<int>{0, 0}));
  EXPECT_EQ(plan.projected_peak, 400000u);
  EXPECT_EQ(plan.weighted_error, 0.0);
}

TEST(PolicyTest, CompressesTheCheapestBytesFirst) {
  // Two tensors of equal size; the second's error is 100x more costly. Room for one of them
  // exact-ish only: the sensitive one stays better.
  PolicyInput input{0, 0, 0.0, {Ladder(1 << 20, 1), Ladder(1 << 20, 100)}};
  input.budget_bytes = (1 << 20) / 4 + 64 + (1 << 20) / 16 + 64;
  PolicyPlan plan = SolvePolicy(input);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(input.items[0].candidates[plan.choice[0]].spec, "quant2");
  EXPECT_EQ(input.items[1].candidates[plan.choice[1]].spec, "quant8");
  EXPECT_LE(plan.projected_peak, input.budget_bytes);
}

TEST(PolicyTest, InfeasibleNamesTheSmallestBudget) {
  PolicyInput input{10000, 50000, 0.1, {Ladder(160000, 1)}};
  PolicyPlan plan = SolvePolicy(input);
  EXPECT_FALSE(plan.feasible);
  EXPECT_EQ(input.items[0].candidates[plan.choice[0]].spec, "quant2");
  const uint64_t harshest = 50000 + 160000 / 16 + 64;
  EXPECT_EQ(plan.smallest_feasible_budget, BudgetFor(harshest, 0.1));
  // And that budget is indeed enough.
  input.budget_bytes = plan.smallest_feasible_budget;
  EXPECT_TRUE(SolvePolicy(input).feasible);
  input.budget_bytes -= 2;
  EXPECT_FALSE(SolvePolicy(input).feasible);
}

TEST(PolicyTest, ACeilingHoldsThePlanAtAPeakKnownToFit) {
  // Room for both exact under the budget less the headroom; a ceiling of what a harsher plan
  // peaked at (the pool full to its cap) holds the plan there, the cheapest bytes first.
  PolicyInput input{1000000, 100000, 0.05, {Ladder(100000, 1), Ladder(200000, 1e6)}};
  input.ceiling_bytes = 100000 + 100000 / 16 + 64 + 200000;
  PolicyPlan plan = SolvePolicy(input);
  EXPECT_TRUE(plan.feasible);
  EXPECT_LE(plan.projected_peak, input.ceiling_bytes);
  EXPECT_EQ(input.items[0].candidates[plan.choice[0]].spec, "quant2");
  EXPECT_EQ(input.items[1].candidates[plan.choice[1]].spec, "none");
  // A ceiling above the budget's limit changes nothing.
  input.ceiling_bytes = 2000000;
  EXPECT_EQ(SolvePolicy(input).choice, (std::vector<int>{0, 0}));
}

TEST(PolicyTest, SkipsDominatedAndNonConvexCandidates) {
  // "bad" is bigger and worse than quant4; "mid" lies above the segment quant8 -> quant2.
  PolicyItem item{{{"none", 1000, 0.0},
                   {"bad", 600, 0.5},
                   {"quant8", 500, 0.001},
                   {"mid", 300, 0.4},
                   {"quant2", 100, 0.5}},
                  1.0};
  PolicyInput input{0, 0, 0.0, {item}};
  for (uint64_t budget : {1000u, 700u, 400u, 100u}) {
    input.budget_bytes = budget;
    const std::string chosen = item.candidates[SolvePolicy(input).choice[0]].spec;
    EXPECT_NE(chosen, "bad");
    EXPECT_NE(chosen, "mid");
  }
}

// Against brute force on random small problems: the greedy's error is within the best
// feasible error of the convexified problem, which on these instances is the exact optimum
// often enough to check that it never loses by much.
TEST(PolicyTest, GreedyMatchesBruteForceOnConvexLadders) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    PolicyInput input;
    const int n = 1 + static_cast<int>(rng() % 4);
    uint64_t total = 0;
    for (int i = 0; i < n; ++i) {
      const uint64_t raw = 1000 + rng() % 100000;
      input.items.push_back(Ladder(raw, 0.1 + (rng() % 100) / 10.0));
      total += raw;
    }
    input.headroom = 0.0;
    input.budget_bytes = total / (2 + rng() % 12);
    PolicyPlan plan = SolvePolicy(input);
    // Brute force over 4^n choices.
    double best = -1;
    std::vector<int> choice(n, 0);
    for (int code = 0; code < (1 << (2 * n)); ++code) {
      uint64_t bytes = 0;
      double error = 0;
      for (int i = 0; i < n; ++i) {
        const PolicyCandidate& c = input.items[i].candidates[(code >> (2 * i)) & 3];
        bytes += c.bytes;
        error += input.items[i].weight * c.error;
      }
      if (bytes <= input.budget_bytes && (best < 0 || error < best)) best = error;
    }
    ASSERT_EQ(plan.feasible, best >= 0) << "trial " << trial;
    if (!plan.feasible) continue;
    EXPECT_LE(plan.projected_peak, input.budget_bytes);
    // The greedy stops at the first feasible point of the convex path: at most one step's
    // worth of error above the optimum.
    double worst_step = 0;
    for (const PolicyItem& item : input.items) {
      worst_step = std::max(worst_step, item.weight * item.candidates.back().error);
    }
    EXPECT_LE(plan.weighted_error, best + worst_step) << "trial " << trial;
  }
}

TEST(BatchSizeTest, UsableBytesKeepsTheHeadroomFreeRoundingDown) {
  EXPECT_EQ(UsableBytes(1000, 0.0), 1000u);
  EXPECT_EQ(UsableBytes(1000, 0.15), 850u);
  EXPECT_EQ(UsableBytes(999, 0.5), 499u);  // floor
  EXPECT_EQ(UsableBytes(0, 0.15), 0u);
  // The budget BudgetFor asks for leaves at least the peak usable.
  for (uint64_t peak : {uint64_t{1}, uint64_t{777}, uint64_t{123456789}, uint64_t{6} << 30}) {
    EXPECT_GE(UsableBytes(BudgetFor(peak, 0.15), 0.15), peak) << peak;
  }
}

TEST(BatchSizeTest, MaxBatchSizeIsTheFloorOfWhatFitsAfterTheFixedPart) {
  EXPECT_EQ(MaxBatchSize(1000, 100, 300), uint64_t{3});
  EXPECT_EQ(MaxBatchSize(1000, 100, 900), uint64_t{1});  // exactly one sample
  EXPECT_EQ(MaxBatchSize(999, 100, 900), uint64_t{0});   // one byte short
  EXPECT_EQ(MaxBatchSize(50, 100, 1), uint64_t{0});      // not even the fixed part
  EXPECT_EQ(MaxBatchSize(100, 100, 0), std::nullopt);    // nothing grows with the batch
  EXPECT_EQ(MaxBatchSize(99, 100, 0), uint64_t{0});
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  EXPECT_EQ(MaxBatchSize(kMax, 1, 1), kMax - 1);  // no overflow
  EXPECT_EQ(MaxBatchSize(kMax, kMax, kMax), uint64_t{0});
  EXPECT_EQ(MaxBatchSize(kMax - 1, 0, kMax), uint64_t{0});
}

}  // namespace
}  // namespace actpack::runtime

// BudgetConfig: the options of a run under a memory budget, as every front end states them
// (actpack.budget's arguments, actpack::BudgetOptions, ACTPACK_CONF's key=value pairs), and the
// one place their values are checked.
//
// A front end fills the fields from what the user gave (Python checks only the types: an int
// where an int goes) and calls Validate(), whose error names the option and the value in one
// line, the same whichever front end it came through:
//
//   BudgetConfig config;
//   config.limit = "6GiB";
//   config.codec = "quant2";
//   config.headroom = 0.7;
//   config.Validate();  // "actpack.budget: headroom=0.7 is out of range; expected a share of
//                       //  the budget in [0, 0.5)"
//
//   absl::StatusOr<BudgetConf> conf = ParseBudgetConf("budget=6GiB,codec=quant2");
//
// What a valid configuration means for the session and the run is derived here too
// (SessionOptionsFor, Automatic, Packing, GuardsGradients), so a rule such as "codec 'none' is
// plain training" or "min_bytes '0' packs every saved tensor" has one home.
#ifndef ACTPACK_RUNTIME_BUDGET_CONFIG_H_
#define ACTPACK_RUNTIME_BUDGET_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "runtime/config.h"
#include "runtime/policy.h"
#include "runtime/session.h"

namespace actpack::runtime {

// Whether the regions a model marks for recomputation (actpack.recompute) recompute.
enum class RecomputeMode {
  kOff,   // never: they run as plain calls
  kOn,    // always
  kAuto,  // from the first step that packing alone cannot hold
};

// The headroom's range: a share of the budget in [0, kMaxHeadroom).
inline constexpr double kMaxHeadroom = 0.5;

struct BudgetConfig {
  // The memory budget: "6GiB", "512MiB", "80%" (of the device; of physical memory on the
  // host) or a byte count as text.
  std::string limit;
  // "auto" (the policy chooses per saved tensor), a codec spec ("quant2", "eb:rel=1e-2"), or
  // "none" (plain training: nothing packed, as enabled=false).
  std::string codec = "auto";
  // Module-name globs to "auto", a codec spec or "none"; the first match wins over `codec`.
  std::vector<std::pair<std::string, std::string>> rules;
  // Where the report is written when the run ends; "" writes none.
  std::string report;
  // Saved tensors smaller than this stay as they are: a byte size ("64KiB", "65536"), or "0",
  // which packs every one.
  std::string min_bytes = DefaultMinBytesText();
  uint64_t seed = 0;
  bool enabled = true;  // false keeps every saved tensor as it is (parity runs)
  double headroom = kDefaultHeadroom;
  int64_t profile_every = kDefaultProfileEvery;
  bool snapshot = false;  // put the allocator's snapshot into the report
  // The error-bounded mode: the most the loss may rise over an exact step, in (0, 1); nullopt:
  // off.
  std::optional<double> allowed_loss_increase;
  // The fidelity floor of "auto" (the relative RMS error a saved tensor may carry); 0: none.
  double max_rel_rms = kDefaultMaxRelRms;
  // "false", "true" or "auto" (see RecomputeMode).
  std::string recompute = "false";
  // Stop (or, where auto chooses, tighten) a run whose gradient norm runs away under lossy
  // packing (GradientGuard in budget_run.h).
  bool gradient_guard = true;

  // kInvalidArgument naming the first bad option and its value, in one line.
  absl::Status Validate() const;

  // The parsed limit, min_bytes and recompute of a valid configuration.
  MemoryLimit ParsedLimit() const;
  uint64_t MinBytes() const;
  RecomputeMode Recompute() const;

  // Whether saved tensors are packed at all: enabled, and the codec is not "none".
  bool Packs() const;
  // Whether the policy plans (packing, and the codec or a rule is "auto"); false for a fixed
  // codec and for plain training, which have nothing to plan.
  bool Automatic() const;
  // Whether auto chooses some tensors' codecs: the codec is "auto", or with rules, a rule is.
  bool Chooses() const;
  // Whether the gradient guard watches this run: on, packing, and some codec is lossy.
  bool GuardsGradients() const;
  // What the step packs with, as errors say it: "codec 'quant2'", "plain training
  // (enabled=False)".
  std::string Packing() const;
  // The codec as messages quote it: 'quant2', or {'layer1.*': 'quant2', ...} for rules.
  std::string CodecText() const;

  // The session's options for a budget of `budget_bytes` with `outside_allowance_bytes` the
  // system may count outside the pool; kInvalidArgument for a codec spec that does not parse.
  absl::StatusOr<SessionOptions> SessionOptionsFor(uint64_t budget_bytes,
                                                   uint64_t outside_allowance_bytes) const;

  static std::string DefaultMinBytesText();
};

// ACTPACK_CONF's keys, in the order the guide lists them.
const std::vector<std::string>& BudgetConfKeys();

// ACTPACK_CONF parsed: the budget's configuration and the keys only the environment has.
struct BudgetConf {
  BudgetConfig config;
  std::string allocator = "auto";  // "auto", "cpu", "cuda" or "none"
  std::string device;              // "" or what the user wrote ("cuda:1")
  std::vector<std::string> given;  // the keys the text gave, in its order
};

// Parses ACTPACK_CONF's "key=value,..." text: every key known, "budget" required, each value
// of its key's type (kInvalidArgument naming the key and the value otherwise), then Validate().
absl::StatusOr<BudgetConf> ParseBudgetConf(absl::string_view text);

// A number as messages show it, as Python's repr shows a float: the shortest text that reads
// back as the same double ("0.7", "1.0", "1e-07", "1e+16", "nan", "inf").
std::string ShowNumber(double value);

}  // namespace actpack::runtime

#endif  // ACTPACK_RUNTIME_BUDGET_CONFIG_H_

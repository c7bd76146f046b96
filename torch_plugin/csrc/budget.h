// actpack::Budget: a LibTorch C++ training loop under a memory budget.
//
// The C++ counterpart of the Python context actpack.budget: while a Budget lives, every tensor
// autograd saves for backward on its thread goes through actpack's session (packed with the
// codec the policy or the options choose, and unpacked for backward), the CPU allocator is
// actpack's host pool, capped at the budget from the first step on, and when it is closed the
// run report (the same JSON document, read by `actpack report`) is built and written. What a
// budget does over the run (the cap, the lift that lets a step before the first plan measure
// what it needs, the end of a step, the errors, the report's run section) is
// runtime::BudgetRun, which the Python context drives too: one behaviour.
//
//   actpack::BudgetOptions options;
//   options.limit = "512MiB";       // or "80%" of physical memory
//   options.report = "run.json";
//   {
//     actpack::Budget budget(options);
//     for (...) {
//       torch::Tensor loss;
//       {
//         actpack::ModuleScope scope("encoder");  // names what the encoder saves
//         loss = ...;
//       }
//       optimizer.zero_grad();
//       loss.backward();  // a step ends when its backward pass does
//       optimizer.step();
//     }
//   }  // hooks removed, CPU allocator and cap restored, report written
//
// How: LibTorch consults the autograd engine for the default saved-variable hooks of each saved
// tensor (torch::autograd::SavedVariableHooks). Python's engine answers with the hooks of
// torch.autograd.graph.saved_tensors_hooks; a C++ program has the base engine, which answers
// none. The first Budget makes a subclass of that engine the default one (set_default_engine_stub)
// that answers with actpack's hooks while a Budget is open on the calling thread, and with none
// otherwise. In a process where Python's engine is the default (a C++ extension loaded into
// Python), the constructor throws: use actpack.budget there.
//
// Differences from the Python context: module names come from ModuleScope (C++ modules have no
// global forward hooks), so the policy weighs every saved tensor alike (no gradient
// sensitivity) and the error-bounded mode uses the relative caps; memory is measured and capped
// on the CPU only; the report path takes no "{rank}"; LibTorch has no actpack.recompute regions.
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_BUDGET_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_BUDGET_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/json.h"
#include "runtime/session.h"

namespace actpack {

// The options of actpack.budget(...), with the same meanings and defaults.
struct BudgetOptions {
  // The memory budget: "6GiB", "512MiB", "80%" (of physical memory) or a byte count as text.
  std::string limit;
  // "auto" (the policy chooses per saved tensor), or a codec spec ("quant2", "eb:rel=1e-2").
  std::string codec = "auto";
  // Module-name globs to "auto" or a codec spec; the first match wins over `codec` (the Python
  // context's dict form, where unmatched tensors get "auto"; here they get `codec`).
  std::vector<std::pair<std::string, std::string>> rules;
  // Where the report is written when the budget closes; "" writes none.
  std::string report;
  // Saved tensors smaller than this stay as they are; "0" packs every one; "" is the default,
  // runtime::kDefaultMinBytes (64 KiB), as in the Python context.
  std::string min_bytes;
  uint64_t seed = 0;
  bool enabled = true;  // false keeps every saved tensor as it is (parity runs)
  double headroom = runtime::kDefaultHeadroom;
  int64_t profile_every = runtime::kDefaultProfileEvery;
  bool snapshot = false;  // put the allocator's snapshot into the report
  double allowed_loss_increase = 0.0;  // the error-bounded mode; 0: off
  // The relative RMS error `auto` lets a saved tensor carry (see actpack.budget); 0: no floor.
  double max_rel_rms = runtime::kDefaultMaxRelRms;
};

// Open on construction, closed by Close() or the destructor. Not copyable or movable: the hooks
// belong to the thread that opened it, and budgets nest (the innermost one packs).
class Budget {
 public:
  // Throws c10::ValueError naming a bad option, c10::Error when Python's autograd engine is
  // the default one (see the file comment).
  explicit Budget(BudgetOptions options);
  ~Budget();
  Budget(const Budget&) = delete;
  Budget& operator=(const Budget&) = delete;

  // Ends the run: removes the hooks, restores the CPU allocator and its cap, builds the report
  // and writes it to options.report. Idempotent. A backward that runs later still unpacks what
  // was packed, but its steps are no longer the run's. Must be called on the thread that
  // opened the budget, innermost budget first.
  void Close();

  // The run report (schema "actpack.report"); Null until Close().
  const json::Value& report() const;

  // The budget in bytes ("80%" resolved).
  uint64_t budget_bytes() const;

  // Steps ended so far (a step ends with its backward pass).
  int64_t steps() const;

  struct State;

 private:
  std::shared_ptr<State> state_;
  int uncaught_at_open_ = 0;
};

// Names the module running on this thread while it lives: what autograd saves meanwhile is
// reported under that name and matched against BudgetOptions::rules. Scopes nest into dotted
// names ("encoder" inside "model" is "model.encoder").
class ModuleScope {
 public:
  explicit ModuleScope(const std::string& name);
  ~ModuleScope();
  ModuleScope(const ModuleScope&) = delete;
  ModuleScope& operator=(const ModuleScope&) = delete;
};

}  // namespace actpack

#endif  // ACTPACK_TORCH_PLUGIN_CSRC_BUDGET_H_

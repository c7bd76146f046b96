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
// sensitivity) and the error-bounded mode uses the relative caps; the gradient guard watches
// the parameters the constructor is given (none: no guard); memory is measured and capped on
// the CPU only; the report path takes no "{rank}"; LibTorch has no actpack.recompute regions.
#ifndef ACTPACK_TORCH_PLUGIN_CSRC_BUDGET_H_
#define ACTPACK_TORCH_PLUGIN_CSRC_BUDGET_H_

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/budget_config.h"
#include "runtime/json.h"

namespace actpack {

// The options of actpack.budget(...), with the same meanings, defaults and checks
// (runtime/budget_config.h): limit, codec, rules (module-name globs to "auto", a codec spec or
// "none"; the first match wins over `codec`), report, min_bytes, seed, enabled, headroom,
// profile_every, snapshot, allowed_loss_increase, max_rel_rms, gradient_guard.
using BudgetOptions = runtime::BudgetConfig;

// The parameters whose gradients the gradient guard watches, as (name, tensor)
// (model->named_parameters()); a parameter's module is its name up to the last dot.
using NamedParameters = std::vector<std::pair<std::string, at::Tensor>>;

// Thrown out of the backward pass whose gradients ran away under lossy packing (see
// runtime::GradientGuard), before the optimizer steps on them: the weights are still finite.
class GradientRunaway : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Open on construction, closed by Close() or the destructor. Not copyable or movable: the hooks
// belong to the thread that opened it, and budgets nest (the innermost one packs).
class Budget {
 public:
  // Throws c10::ValueError naming a bad option, c10::Error when Python's autograd engine is
  // the default one (see the file comment). With `parameters`, the gradient guard watches
  // their gradients at the end of each step (as actpack.budget watches the model's): under a
  // fixed lossy codec a runaway throws GradientRunaway out of that backward; where auto
  // chooses, it tightens the fidelity floor, warns (TORCH_WARN) and drops the step's gradients
  // (each parameter's grad undefined: torch::optim skips it), and the third tightening that
  // does not hold throws.
  explicit Budget(BudgetOptions options, NamedParameters parameters = {});
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

#include "torch_plugin/csrc/budget.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/headeronly/version.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <exception>
#include <iostream>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/system_memory.h"
#include "report/writer.h"
#include "runtime/budget_run.h"
#include "torch_plugin/csrc/host_budget_memory.h"
#include "torch_plugin/csrc/saved_tensors.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack {
namespace {

using torch_plugin::SavedTensor;

// The budgets open on this thread, innermost last, and the module scopes' dotted names.
thread_local std::vector<std::shared_ptr<Budget::State>> open_budgets;
thread_local std::vector<std::string> module_names;

// {module: the norm of its own parameters' gradients}, in the parameters' order, each
// parameter counted once (a tied weight for its first module); a parameter's module is its name
// up to the last dot.
std::vector<std::pair<std::string, double>> GradientNorms(const NamedParameters& parameters) {
  std::vector<std::pair<std::string, double>> norms;
  std::vector<const void*> seen;
  for (const auto& [name, parameter] : parameters) {
    const at::Tensor& grad = parameter.grad();
    if (!grad.defined()) continue;
    const void* impl = parameter.unsafeGetTensorImpl();
    if (std::find(seen.begin(), seen.end(), impl) != seen.end()) continue;
    seen.push_back(impl);
    const size_t dot = name.rfind('.');
    const std::string module = dot == std::string::npos ? std::string() : name.substr(0, dot);
    const double norm = grad.detach().norm().item<double>();
    auto it = std::find_if(norms.begin(), norms.end(),
                           [&](const auto& entry) { return entry.first == module; });
    if (it == norms.end()) {
      norms.emplace_back(module, norm);
    } else {
      it->second = std::sqrt(it->second * it->second + norm * norm);
    }
  }
  return norms;
}

}  // namespace

struct Budget::State {
  State(BudgetOptions opts, NamedParameters watched)
      : options(std::move(opts)),
        parameters(std::move(watched)),
        limit(options.ParsedLimit()),
        budget_bytes(limit.Resolve(allocator::PhysicalMemoryBytes())),
        packer(options, budget_bytes, allocator::kHostOutsideAllowanceBytes),
        run(options, {budget_bytes, true, allocator::kHostOutsideAllowanceBytes},
            packer.session(), memory,
            [this](size_t needed) { return packer.Relieve(needed); }) {}

  SavedTensor Pack(const at::Tensor& tensor) {
    step_end.Packed();
    return packer.Pack(tensor, module_names.empty() ? std::string() : module_names.back());
  }

  // After Close the steps are not the run's.
  at::Tensor Unpack(const SavedTensor& saved, const std::shared_ptr<State>& self) {
    if (open && step_end.QueueEndNow()) {
      torch::autograd::Engine::get_default_engine().queue_callback([self] { self->EndStep(); });
    }
    return packer.Unpack(saved);
  }

  void EndStep() {
    step_end.Ended();
    if (!open) return;
    // Throws c10::OutOfMemoryError when no plan fits the budget.
    torch_plugin::ThrowIfError(run.EndStep().status());
    if (parameters.empty() || !run.config().GuardsGradients()) return;
    const runtime::BudgetRun::GradientVerdict verdict =
        run.ObserveGradients(GradientNorms(parameters));
    switch (verdict.action) {
      case runtime::BudgetRun::GradientVerdict::kTrainOn:
        return;
      case runtime::BudgetRun::GradientVerdict::kDropStep:
        for (auto& [name, parameter] : parameters) parameter.mutable_grad().reset();
        TORCH_WARN(verdict.message);
        return;
      case runtime::BudgetRun::GradientVerdict::kStop:
        throw GradientRunaway(verdict.message);
    }
  }

  json::Value RunMetadata(double wall_seconds) const {
    runtime::BudgetRun::RunFacts facts;
    facts.torch = TORCH_VERSION;  // python: none, a C++ program
    facts.device = "cpu";
    facts.system_memory = torch_plugin::HostBudgetMemory::kSystemMemory;
    facts.wall_seconds = wall_seconds;
    return run.RunSection(facts);
  }

  const BudgetOptions options;
  NamedParameters parameters;  // the gradient guard's
  const runtime::MemoryLimit limit;
  const uint64_t budget_bytes;
  torch_plugin::SavedTensorPacker packer;
  torch_plugin::HostBudgetMemory memory;
  runtime::BudgetRun run;
  torch_plugin::StepEndWatch step_end;
  std::atomic<bool> open{false};
  std::chrono::steady_clock::time_point started;
  json::Value report;
};

namespace {

// One saved tensor's hooks: pack when autograd saves it, unpack (any number of times, with
// retain_graph) when backward needs it. They keep the budget's state alive, so a backward
// after Close still finds the packed bytes.
class BudgetHooks final : public torch::autograd::SavedVariableHooks {
 public:
  explicit BudgetHooks(std::shared_ptr<Budget::State> state) : state_(std::move(state)) {}
  void call_pack_hook(const at::Tensor& tensor) override { saved_ = state_->Pack(tensor); }
  at::Tensor call_unpack_hook() override { return state_->Unpack(saved_, state_); }

 private:
  std::shared_ptr<Budget::State> state_;
  SavedTensor saved_;
};

// The base engine, answering with actpack's hooks while a budget is open on this thread.
class BudgetEngine final : public torch::autograd::Engine {
 public:
  static Engine& Get() {
    // Never destroyed: autograd may run during static destruction.
    static auto* engine = new BudgetEngine;
    return *engine;
  }

  std::unique_ptr<torch::autograd::SavedVariableHooks> get_default_saved_variable_hooks()
      override {
    if (open_budgets.empty()) return nullptr;
    return std::make_unique<BudgetHooks>(open_budgets.back());
  }
};

void UseBudgetEngine() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::autograd::Engine& current = torch::autograd::Engine::get_default_engine();
    TORCH_CHECK(&current == &torch::autograd::Engine::get_base_engine(),
                "actpack::Budget: this process's autograd engine is not LibTorch's base engine "
                "(Python's, when loaded into Python); use the Python context actpack.budget "
                "there");
    torch::autograd::set_default_engine_stub(&BudgetEngine::Get);
  });
  TORCH_CHECK(&torch::autograd::Engine::get_default_engine() == &BudgetEngine::Get(),
              "actpack::Budget: another autograd engine replaced actpack's as the default; "
              "saved tensors would not be packed");
}

}  // namespace

Budget::Budget(BudgetOptions options, NamedParameters parameters)
    : uncaught_at_open_(std::uncaught_exceptions()) {
  torch_plugin::ThrowIfError(options.Validate());
  state_ = std::make_shared<State>(std::move(options), std::move(parameters));
  UseBudgetEngine();
  state_->started = std::chrono::steady_clock::now();
  state_->memory.Start();
  // Out of budget mid-step: re-pack what the plan kept exact, or let a step before the first
  // plan finish over the cap to measure what it needs.
  std::weak_ptr<State> weak = state_;
  state_->memory.RelievePressureWith([weak](size_t needed) -> size_t {
    std::shared_ptr<State> state = weak.lock();
    return state ? state->run.Relieve(needed) : 0;
  });
  state_->run.Start();
  state_->open = true;
  open_budgets.push_back(state_);
}

Budget::~Budget() {
  try {
    if (std::uncaught_exceptions() > uncaught_at_open_) {
      state_->run.Warn("the run stopped on an exception");
    }
    Close();
  } catch (const std::exception& error) {
    // A destructor must not throw; the report is what is lost.
    std::cerr << "actpack::Budget: closing the budget failed: " << error.what() << "\n";
  }
}

void Budget::Close() {
  if (!state_->open) return;
  TORCH_CHECK(!open_budgets.empty() && open_budgets.back() == state_,
              "actpack::Budget: Close() on another thread than the one that opened it, or "
              "before a budget opened inside it was closed");
  open_budgets.pop_back();
  state_->open = false;
  state_->memory.StopWatching();
  state_->run.Stop();
  json::Value allocator_section = state_->memory.Stop(
      state_->options.snapshot, state_->run.run_peaks(), state_->budget_bytes);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - state_->started).count();
  state_->report = report::MakeRunReport(state_->RunMetadata(wall),
                                         report::ActivationsSection(state_->packer.State()));
  state_->report["allocator"] = std::move(allocator_section);
  if (!state_->options.report.empty()) {
    const absl::Status written = report::WriteRunReport(state_->report, state_->options.report);
    TORCH_CHECK(written.ok(), "actpack::Budget: ", written.message());
  }
}

const json::Value& Budget::report() const { return state_->report; }

uint64_t Budget::budget_bytes() const { return state_->budget_bytes; }

int64_t Budget::steps() const { return state_->run.steps(); }

ModuleScope::ModuleScope(const std::string& name) {
  module_names.push_back(module_names.empty() ? name
                                              : absl::StrCat(module_names.back(), ".", name));
}

ModuleScope::~ModuleScope() { module_names.pop_back(); }

}  // namespace actpack

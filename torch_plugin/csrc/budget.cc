#include "torch_plugin/csrc/budget.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/graph_task.h>
#include <torch/csrc/autograd/saved_variable_hooks.h>
#include <torch/headeronly/version.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <iostream>
#include <mutex>
#include <optional>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "allocator/pluggable.h"
#include "allocator/statistics_adaptor.h"
#include "allocator/system_memory.h"
#include "allocator/units.h"
#include "report/writer.h"
#include "runtime/config.h"
#include "torch_plugin/csrc/cpu_allocator.h"
#include "torch_plugin/csrc/saved_tensors.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack {
namespace {

using allocator::HostPool;
using allocator::kNoReserveLimit;
using torch_plugin::SavedTensor;

// The budgets open on this thread, innermost last, and the module scopes' dotted names.
thread_local std::vector<std::shared_ptr<Budget::State>> open_budgets;
thread_local std::vector<std::string> module_names;

// The memory side of a budget on the CPU: actpack's host pool under torch's CPU allocator,
// per-step peaks, and the cap (as actpack.budget's _PeakMeter does for the CPU).
class HostPeakMeter {
 public:
  void Start() {
    installed_here_ = !torch_plugin::CpuAllocatorInstalled();
    if (installed_here_) torch_plugin::InstallCpuAllocator();
    previous_cap_ = HostPool().budget().budget();
    capped_ = previous_cap_ != kNoReserveLimit;
    ReleaseCache();
    run_reserved_peak_ = run_allocated_peak_ = 0;
    // The pool counts against its cap what the resident set holds outside it.
    torch_plugin::ThrowIfError(allocator::CountSystemMemory(allocator::kHostDevice, allocator::kHostOutsideAllowanceBytes));
    resident_.Start();
  }

  // (allocated, reserved, resident) peaks since the last call (or Start): the pool's, and the
  // process's resident set above its size at Start. Restarts measuring.
  std::tuple<uint64_t, uint64_t, uint64_t> StepPeaks() {
    const allocator::MemoryStats stats = HostPool().stats().GetStats();
    Reset();
    const uint64_t resident = resident_.TakePeak();
    run_resident_peak_ = std::max(run_resident_peak_, resident);
    return {static_cast<uint64_t>(stats.allocated_bytes.peak),
            static_cast<uint64_t>(stats.reserved_bytes.peak), resident};
  }

  uint64_t run_resident_peak() const { return run_resident_peak_; }


  // The next step's peak must show a new plan's footprint, not the last plan's cache.
  void ReleaseCache() {
    HostPool().EmptyCache();
    Reset();
  }

  // From now on allocations over the budget fail.
  void Enforce(uint64_t budget_bytes) {
    if (capped_) return;
    capped_ = true;
    HostPool().budget().SetBudget(budget_bytes);
    // A cap binds new reservations only: give back what the uncapped steps cached.
    ReleaseCache();
  }

  void WatchPressure(allocator::BudgetAdaptor::PressureCallback relieve) {
    absl::StatusOr<allocator::PressureCallbackId> id =
        allocator::RegisterPressureCallback(allocator::kHostDevice, std::move(relieve));
    torch_plugin::ThrowIfError(id.status());
    pressure_id_ = *id;
  }

  // The report's allocator section; the CPU allocator and its cap are left as Start found them.
  json::Value Stop(bool snapshot) {
    allocator::StopCountingSystemMemory(allocator::kHostDevice);
    if (pressure_id_.has_value()) {
      (void)allocator::UnregisterPressureCallback(*pressure_id_);
      pressure_id_.reset();
    }
    Reset();
    report::AllocatorRun run{"cpu", true, budget_bytes_, json::Value::object(),
                             run_allocated_peak_, run_reserved_peak_, json::Value()};
    for (const auto& [name, value] : allocator::ToTorchMemoryStats(HostPool().stats().GetStats())) {
      run.stats[name] = value;
    }
    if (snapshot) run.snapshot = allocator::HostSnapshot();
    json::Value section = report::AllocatorSection(std::move(run));
    HostPool().budget().SetBudget(previous_cap_);
    capped_ = false;
    if (installed_here_) torch_plugin::UninstallCpuAllocator();
    installed_here_ = false;
    return section;
  }

  void set_budget_bytes(uint64_t bytes) { budget_bytes_ = bytes; }
  uint64_t run_reserved_peak() const { return run_reserved_peak_; }
  uint64_t run_allocated_peak() const { return run_allocated_peak_; }

 private:
  // The pool has one peak counter, restarted per step; the run's peaks are the maxima over
  // every window, so fold the closing window in first.
  void Reset() {
    const allocator::MemoryStats stats = HostPool().stats().GetStats();
    run_reserved_peak_ = std::max<uint64_t>(run_reserved_peak_, stats.reserved_bytes.peak);
    run_allocated_peak_ = std::max<uint64_t>(run_allocated_peak_, stats.allocated_bytes.peak);
    HostPool().stats().ResetPeak();
  }

  bool installed_here_ = false;
  bool capped_ = false;
  size_t previous_cap_ = kNoReserveLimit;
  uint64_t budget_bytes_ = 0;
  uint64_t run_reserved_peak_ = 0;
  uint64_t run_allocated_peak_ = 0;
  uint64_t run_resident_peak_ = 0;
  allocator::ResidentPeakMeter resident_;
  std::optional<allocator::PressureCallbackId> pressure_id_;
};

runtime::Budget ParseLimit(const std::string& limit) {
  absl::StatusOr<runtime::Budget> budget = runtime::ParseBudget(limit);
  torch_plugin::ThrowIfError(budget.status());
  return *budget;
}

int64_t ParseMinBytes(const std::string& text) {
  // "0" packs every saved tensor; a size must otherwise be positive.
  if (text == "0") return 0;
  absl::StatusOr<uint64_t> bytes = runtime::ParseByteSize(text);
  torch_plugin::ThrowIfError(bytes.status());
  return static_cast<int64_t>(*bytes);
}

torch_plugin::SessionSettings SettingsFor(const BudgetOptions& options, uint64_t budget_bytes) {
  torch_plugin::SessionSettings settings;
  settings.codec = options.codec;
  settings.rules = options.rules;
  settings.min_bytes = ParseMinBytes(options.min_bytes);
  settings.seed = options.seed;
  settings.enabled = options.enabled;
  settings.budget_bytes = static_cast<int64_t>(budget_bytes);
  settings.headroom = options.headroom;
  settings.profile_every = options.profile_every;
  settings.allowed_loss_increase = options.allowed_loss_increase;
  settings.max_rel_rms = options.max_rel_rms;
  settings.outside_allowance_bytes = static_cast<int64_t>(allocator::kHostOutsideAllowanceBytes);
  return settings;
}

}  // namespace

struct Budget::State {
  State(BudgetOptions opts, runtime::Budget parsed)
      : options(std::move(opts)),
        limit(parsed),
        budget_bytes(parsed.Resolve(allocator::PhysicalMemoryBytes())),
        session(SettingsFor(options, budget_bytes)) {
    meter.set_budget_bytes(budget_bytes);
  }

  bool Automatic() const { return options.codec == "auto" || !options.rules.empty(); }

  SavedTensor Pack(const at::Tensor& tensor) {
    // No backward is running: one that raised never ran its queued end of step.
    if (torch::autograd::get_current_graph_task_id() == -1) end_queued = false;
    return session.Pack(tensor, module_names.empty() ? std::string() : module_names.back());
  }

  // The first unpack of a backward pass queues the end of the step for when that pass
  // finishes. A backward with create_graph=True (grad mode on) builds a graph a later backward
  // differentiates: the step goes on until that one. After Close the steps are not the run's.
  at::Tensor Unpack(const SavedTensor& saved, const std::shared_ptr<State>& self) {
    if (open && !c10::GradMode::is_enabled() &&
        torch::autograd::get_current_graph_task_id() != -1 && !end_queued.exchange(true)) {
      torch::autograd::Engine::get_default_engine().queue_callback([self] { self->EndStep(); });
    }
    return session.Unpack(saved);
  }

  void EndStep() {
    end_queued = false;
    if (!open) return;
    ++steps;
    const uint64_t plans = session.Policy().plans;
    const auto [allocated, reserved, resident] = meter.StepPeaks();
    session.EndStep(allocated, reserved, resident);  // throws when no plan fits the budget
    const bool replanned = session.Policy().plans != plans;
    if (replanned) meter.ReleaseCache();
    if (replanned || !Automatic()) meter.Enforce(budget_bytes);
  }

  json::Value RunMetadata(double wall_seconds) const {
    json::Value run = json::Value::object();
    run["torch"] = TORCH_VERSION;
    run["python"] = json::Value();  // a C++ program
    (run["device"] = "cpu");
    run["budget"] = limit.ToString();
    run["budget_bytes"] = budget_bytes;
    if (options.rules.empty()) {
      run["codec"] = options.codec;
    } else {
      json::Value codec = json::Value::object();
      for (const auto& [pattern, spec] : options.rules) (codec[pattern] = spec);
      codec["*"] = options.codec;
      run["codec"] = std::move(codec);
    }
    if (options.allowed_loss_increase > 0) {
      run["allowed_loss_increase"] = options.allowed_loss_increase;
    } else {
      run["allowed_loss_increase"] = json::Value();
    }
    if (options.max_rel_rms > 0) {
      run["max_rel_rms"] = options.max_rel_rms;
    } else {
      run["max_rel_rms"] = json::Value();
    }
    run["peak_allocated_bytes"] = meter.run_allocated_peak();
    run["peak_reserved_bytes"] = meter.run_reserved_peak();
    run["peak_system_bytes"] = meter.run_resident_peak();
    run["system_memory"] = "resident set above its size at enter (VmHWM)";
    run["wall_seconds"] = wall_seconds;
    run["rank"] = 0;
    run["world_size"] = 1;
    json::Value list = json::Value::array();
    for (const std::string& warning : warnings) list.emplace_back(warning);
    if (meter.run_reserved_peak() > budget_bytes) {
      list.emplace_back(
          absl::StrCat("peak memory ", allocator::FormatBytes(meter.run_reserved_peak()),
                       " exceeded the budget ", allocator::FormatBytes(budget_bytes)));
    }
    run["warnings"] = std::move(list);
    return run;
  }

  const BudgetOptions options;
  const runtime::Budget limit;
  const uint64_t budget_bytes;
  torch_plugin::SavedTensorSession session;
  HostPeakMeter meter;
  std::atomic<bool> end_queued{false};
  std::atomic<bool> open{false};
  int64_t steps = 0;
  std::vector<std::string> warnings;
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

Budget::Budget(BudgetOptions options) : uncaught_at_open_(std::uncaught_exceptions()) {
  TORCH_CHECK_VALUE(!options.limit.empty(),
                    "actpack::Budget: BudgetOptions::limit is empty; give a budget such as "
                    "\"6GiB\" or \"80%\"");
  runtime::Budget parsed = ParseLimit(options.limit);
  state_ = std::make_shared<State>(std::move(options), parsed);
  UseBudgetEngine();
  state_->started = std::chrono::steady_clock::now();
  state_->meter.Start();
  if (state_->Automatic()) {
    // Out of budget mid-step: re-pack what the plan kept exact rather than fail.
    std::weak_ptr<State> weak = state_;
    state_->meter.WatchPressure([weak](size_t needed) -> size_t {
      std::shared_ptr<State> state = weak.lock();
      return state ? state->session.Relieve(needed) : 0;
    });
  }
  state_->open = true;
  open_budgets.push_back(state_);
}

Budget::~Budget() {
  try {
    if (std::uncaught_exceptions() > uncaught_at_open_) {
      state_->warnings.push_back("the run stopped on an exception");
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
  json::Value allocator_section = state_->meter.Stop(state_->options.snapshot);
  const double wall =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - state_->started).count();
  state_->report = report::MakeRunReport(state_->RunMetadata(wall),
                                         report::ActivationsSection(state_->session.State()));
  state_->report["allocator"] = std::move(allocator_section);
  if (!state_->options.report.empty()) {
    const absl::Status written = report::WriteRunReport(state_->report, state_->options.report);
    TORCH_CHECK(written.ok(), "actpack::Budget: ", written.message());
  }
}

const json::Value& Budget::report() const { return state_->report; }

uint64_t Budget::budget_bytes() const { return state_->budget_bytes; }

int64_t Budget::steps() const { return state_->steps; }

ModuleScope::ModuleScope(const std::string& name) {
  module_names.push_back(module_names.empty() ? name
                                              : absl::StrCat(module_names.back(), ".", name));
}

ModuleScope::~ModuleScope() { module_names.pop_back(); }

}  // namespace actpack

#include "torch_plugin/bindings/saved_tensor_hooks_bindings.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "report/writer.h"
#include "runtime/budget_config.h"
#include "runtime/budget_run.h"
#include "runtime/session.h"
#include "torch_plugin/csrc/host_budget_memory.h"
#include "torch_plugin/csrc/saved_tensors.h"
#include "torch_plugin/bindings/python_json.h"
#include "torch_plugin/csrc/tensor_adapter.h"

namespace actpack::torch_plugin {
namespace {

namespace py = pybind11;

class PythonHooks {
 public:
  PythonHooks(const runtime::BudgetConfig& config, uint64_t budget_bytes,
              uint64_t outside_allowance_bytes)
      : packer_(config, budget_bytes, outside_allowance_bytes) {
    ++live_;
  }
  ~PythonHooks() { --live_; }
  PythonHooks(const PythonHooks&) = delete;
  PythonHooks& operator=(const PythonHooks&) = delete;

  // How many are alive: each budget's is freed when its run closes, with every tensor it packed.
  static int64_t Live() { return live_; }

  // New references; nullptr with a Python error set.
  PyObject* Pack(const at::Tensor& tensor, std::string module);
  PyObject* Unpack(PyObject* handle);

  // Wall time inside Pack and Unpack (codecs included), for tools/hook_overhead.py: what the
  // hooks cost beyond it is Python's.
  double HookSeconds() const { return static_cast<double>(hook_nanoseconds_) * 1e-9; }

  SavedTensorPacker& packer() { return packer_; }
  const SavedTensorPacker& packer() const { return packer_; }
  StepEndWatch& step_end() { return step_end_; }

 private:
  SavedTensorPacker packer_;
  StepEndWatch step_end_;  // Pack tells it; the Python front end asks it in its unpack hook
  uint64_t hook_nanoseconds_ = 0;  // under the GIL, as the hooks run
  static inline std::atomic<int64_t> live_{0};
};

// ---- actpack._C.PackedTensor: a PackedHandle as a Python object ----

struct PackedObject {
  PyObject_HEAD
  PackedHandle handle;
};

PyTypeObject* packed_type = nullptr;  // made by BindSavedTensorHooks

PyObject* WrapHandle(PackedHandle&& handle) {
  PyObject* object = packed_type->tp_alloc(packed_type, 0);
  if (object == nullptr) return nullptr;
  new (&reinterpret_cast<PackedObject*>(object)->handle) PackedHandle(std::move(handle));
  return object;
}

void DeallocPacked(PyObject* object) {
  PyTypeObject* type = Py_TYPE(object);
  reinterpret_cast<PackedObject*>(object)->handle.~PackedHandle();
  type->tp_free(object);
  Py_DECREF(type);  // a heap type: each instance holds a reference to it
}

PyObject* RawBytes(PyObject* object, void*) {
  return PyLong_FromUnsignedLongLong(reinterpret_cast<PackedObject*>(object)->handle.RawBytes());
}

PyObject* StoredBytes(PyObject* object, void*) {
  return PyLong_FromUnsignedLongLong(
      reinterpret_cast<PackedObject*>(object)->handle.StoredBytes());
}

PyGetSetDef packed_getset[] = {
    {"raw_bytes", RawBytes, nullptr, "bytes of the saved tensor", nullptr},
    {"stored_bytes", StoredBytes, nullptr, "bytes actpack holds for it", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr},
};

PyType_Slot packed_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(DeallocPacked)},
    {Py_tp_getset, packed_getset},
    {Py_tp_doc, const_cast<char*>("A saved tensor as actpack holds it (packed, or kept for the "
                                  "policy); only actpack._C.SavedTensorHooks makes them.")},
    {0, nullptr},
};

PyType_Spec packed_spec = {
    "actpack._C.PackedTensor",
    sizeof(PackedObject),
    0,
    Py_TPFLAGS_DEFAULT | Py_TPFLAGS_DISALLOW_INSTANTIATION,
    packed_slots,
};

uint64_t NanosecondsSince(std::chrono::steady_clock::time_point start) {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now() - start)
                                   .count());
}

// ---- the hooks as CPython functions; `self` is a capsule of the PythonHooks (see MakeHooks) ----

constexpr char kCapsuleName[] = "actpack._C.SavedTensorHooks";

PythonHooks& HooksOf(PyObject* capsule) {
  return *static_cast<PythonHooks*>(PyCapsule_GetPointer(capsule, kCapsuleName));
}

// pack(tensor, module: str)
PyObject* PackHook(PyObject* self, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  if (nargs != 2 || !THPVariable_Check(args[0]) || !PyUnicode_Check(args[1])) {
    PyErr_SetString(PyExc_TypeError, "actpack: pack(tensor, module: str)");
    return nullptr;
  }
  Py_ssize_t size = 0;
  const char* module = PyUnicode_AsUTF8AndSize(args[1], &size);
  if (module == nullptr) return nullptr;
  return HooksOf(self).Pack(THPVariable_Unpack(args[0]),
                              std::string(module, static_cast<size_t>(size)));
  END_HANDLE_TH_ERRORS
}

// unpack(handle)
PyObject* UnpackHook(PyObject* self, PyObject* handle) {
  HANDLE_TH_ERRORS
  return HooksOf(self).Unpack(handle);
  END_HANDLE_TH_ERRORS
}

PyMethodDef pack_def = {"pack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(PackHook)),
                        METH_FASTCALL,
                        "pack(tensor, module): the tensor itself, or a PackedTensor"};
PyMethodDef unpack_def = {"unpack", UnpackHook, METH_O, "unpack(handle): the saved tensor"};

// (pack, unpack) of the PythonHooks `self`; they hold a reference to it.
py::tuple MakeHooks(const py::object& self) {
  PythonHooks& hooks = self.cast<PythonHooks&>();
  py::object capsule = py::reinterpret_steal<py::object>(
      PyCapsule_New(&hooks, kCapsuleName, [](PyObject* c) {
        Py_XDECREF(static_cast<PyObject*>(PyCapsule_GetContext(c)));
      }));
  if (!capsule) throw py::error_already_set();
  if (PyCapsule_SetContext(capsule.ptr(), self.inc_ref().ptr()) != 0) {
    self.dec_ref();
    throw py::error_already_set();
  }
  py::object pack = py::reinterpret_steal<py::object>(PyCFunction_New(&pack_def, capsule.ptr()));
  if (!pack) throw py::error_already_set();
  py::object unpack =
      py::reinterpret_steal<py::object>(PyCFunction_New(&unpack_def, capsule.ptr()));
  if (!unpack) throw py::error_already_set();
  return py::make_tuple(pack, unpack);
}

py::dict PolicyDict(const PythonHooks& s) {
  const runtime::PolicyState p = s.packer().Policy();
  py::dict d;
  d["plans"] = p.plans;
  d["other_bytes"] = p.other_bytes;
  d["projected_peak_bytes"] = p.projected_peak;
  d["feasible"] = p.feasible;
  d["smallest_feasible_budget"] = p.smallest_feasible_budget;
  d["outside_pool_bytes"] = p.outside_pool_bytes;
  d["max_rel_rms"] = p.max_rel_rms;
  d["floor_tightenings"] = p.floor_tightenings;
  return d;
}

py::dict TotalsDict(const PythonHooks& s) {
  const runtime::SessionTotals t = s.packer().Totals();
  py::dict d;
  d["packed_raw_bytes"] = t.packed_raw_bytes;
  d["packed_stored_bytes"] = t.packed_stored_bytes;
  d["kept_bytes"] = t.kept_bytes;
  d["reused_bytes"] = t.reused_bytes;
  d["packs"] = t.packs;
  d["unpacks"] = t.unpacks;
  d["exact_fallbacks"] = t.exact_fallbacks;
  d["live_stored_bytes"] = t.live_stored;
  d["peak_live_stored_bytes"] = t.peak_live_stored;
  d["live_raw_bytes"] = t.live_raw;
  d["peak_live_raw_bytes"] = t.peak_live_raw;
  d["codec_seconds"] = static_cast<double>(t.codec_nanoseconds) * 1e-9;
  return d;
}

PyObject* PythonHooks::Pack(const at::Tensor& tensor, std::string module) {
  const auto start = std::chrono::steady_clock::now();
  step_end_.Packed();
  SavedTensor saved = packer_.Pack(tensor, std::move(module));
  PyObject* result = nullptr;
  if (at::Tensor* kept = std::get_if<at::Tensor>(&saved)) {
    result = THPVariable_Wrap(std::move(*kept));
  } else {
    result = WrapHandle(std::get<PackedHandle>(std::move(saved)));
  }
  hook_nanoseconds_ += NanosecondsSince(start);
  return result;
}

PyObject* PythonHooks::Unpack(PyObject* handle) {
  // The handle's type first: THPVariable_Check of anything but a plain tensor calls
  // Tensor's __instancecheck__ in Python.
  if (Py_TYPE(handle) != packed_type) {
    if (THPVariable_Check(handle)) {  // kept as it was
      Py_INCREF(handle);
      return handle;
    }
    PyErr_Format(PyExc_TypeError, "actpack: unpack takes what pack returned, got %s",
                 Py_TYPE(handle)->tp_name);
    return nullptr;
  }
  const auto start = std::chrono::steady_clock::now();
  PyObject* result =
      THPVariable_Wrap(packer_.Unpack(reinterpret_cast<PackedObject*>(handle)->handle));
  hook_nanoseconds_ += NanosecondsSince(start);
  return result;
}

// actpack._C.BudgetMemory: the memory side of a budget run, written in Python
// (_budget_memory.py's BudgetMemory: actpack's host pool, its CUDA allocator or torch's).
class PyBudgetMemory final : public runtime::BudgetMemory {
 public:
  // Each holds the GIL while it has Python objects (a pressure callback may come without it).
  runtime::MemoryPeaks TakePeaks() override {
    py::gil_scoped_acquire gil;
    const auto [allocated, reserved, system] =
        Call("take_peaks").cast<std::tuple<uint64_t, uint64_t, uint64_t>>();
    return {allocated, reserved, system};
  }
  void ReleaseCache() override {
    py::gil_scoped_acquire gil;
    Call("release_cache");
  }
  uint64_t Cap() override {
    py::gil_scoped_acquire gil;
    py::object cap = Call("cap");
    return cap.is_none() ? runtime::kNoCap : cap.cast<uint64_t>();
  }
  void SetCap(uint64_t bytes) override {
    py::gil_scoped_acquire gil;
    Call("set_cap", bytes == runtime::kNoCap ? py::object(py::none()) : py::int_(bytes));
  }

 private:
  // Under the GIL.
  template <typename... Args>
  py::object Call(const char* name, Args&&... args) {
    py::function method = py::get_override(this, name);
    if (!method) {
      throw py::type_error(std::string("actpack._C.BudgetMemory: a subclass must define ") +
                           name);
    }
    return method(std::forward<Args>(args)...);
  }
};

const char* VerdictName(runtime::BudgetRun::GradientVerdict::Action action) {
  switch (action) {
    case runtime::BudgetRun::GradientVerdict::kDropStep:
      return "drop_step";
    case runtime::BudgetRun::GradientVerdict::kStop:
      return "stop";
    case runtime::BudgetRun::GradientVerdict::kTrainOn:
      break;
  }
  return "train_on";
}

void BindBudgetConfig(py::module_& m) {
  using runtime::BudgetConfig;
  py::class_<BudgetConfig>(m, "BudgetConfig",
                           "actpack.budget's options as the runtime checks them "
                           "(runtime/budget_config.h); validate() raises ValueError naming the "
                           "first bad one")
      .def(py::init([](std::string limit, std::string codec,
                       std::vector<std::pair<std::string, std::string>> rules,
                       std::string report, std::string min_bytes, uint64_t seed, bool enabled,
                       double headroom, int64_t profile_every, bool snapshot,
                       std::optional<double> allowed_loss_increase, double max_rel_rms,
                       std::string recompute, bool gradient_guard) {
             BudgetConfig config;
             config.limit = std::move(limit);
             config.codec = std::move(codec);
             config.rules = std::move(rules);
             config.report = std::move(report);
             config.min_bytes = std::move(min_bytes);
             config.seed = seed;
             config.enabled = enabled;
             config.headroom = headroom;
             config.profile_every = profile_every;
             config.snapshot = snapshot;
             config.allowed_loss_increase = allowed_loss_increase;
             config.max_rel_rms = max_rel_rms;
             config.recompute = std::move(recompute);
             config.gradient_guard = gradient_guard;
             return config;
           }),
           py::arg("limit"), py::arg("codec") = "auto",
           py::arg("rules") = std::vector<std::pair<std::string, std::string>>{},
           py::arg("report") = "", py::arg("min_bytes") = BudgetConfig::DefaultMinBytesText(),
           py::arg("seed") = 0, py::arg("enabled") = true,
           py::arg("headroom") = runtime::kDefaultHeadroom,
           py::arg("profile_every") = runtime::kDefaultProfileEvery, py::arg("snapshot") = false,
           py::arg("allowed_loss_increase") = py::none(),
           py::arg("max_rel_rms") = runtime::kDefaultMaxRelRms, py::arg("recompute") = "false",
           py::arg("gradient_guard") = true)
      .def("validate", [](const BudgetConfig& config) { ThrowIfError(config.Validate()); })
      .def_property_readonly("min_bytes", &BudgetConfig::MinBytes)
      .def_property_readonly("packs", &BudgetConfig::Packs)
      .def_property_readonly("automatic", &BudgetConfig::Automatic)
      .def_property_readonly("chooses", &BudgetConfig::Chooses)
      .def_property_readonly("guards_gradients", &BudgetConfig::GuardsGradients)
      .def_property_readonly("packing", &BudgetConfig::Packing);
  m.def(
      "parse_conf",
      [](const std::string& text) {
        absl::StatusOr<runtime::BudgetConf> conf = runtime::ParseBudgetConf(text);
        ThrowIfError(conf.status());
        const BudgetConfig& c = conf->config;
        py::dict options;
        for (const std::string& key : conf->given) {
          if (key == "budget") options["budget"] = c.limit;
          if (key == "codec") options["codec"] = c.codec;
          if (key == "report") options["report"] = c.report;
          if (key == "min_bytes") options["min_bytes"] = c.min_bytes;
          if (key == "seed") options["seed"] = c.seed;
          if (key == "enabled") options["enabled"] = c.enabled;
          if (key == "allocator") options["allocator"] = conf->allocator;
          if (key == "device") options["device"] = conf->device;
          if (key == "allowed_loss_increase") {
            options["allowed_loss_increase"] = *c.allowed_loss_increase;
          }
          if (key == "max_rel_rms") {
            options["max_rel_rms"] =
                c.max_rel_rms > 0 ? py::object(py::float_(c.max_rel_rms)) : py::none();
          }
          if (key == "recompute") {
            options["recompute"] = c.recompute == "auto"
                                       ? py::object(py::str("auto"))
                                       : py::object(py::bool_(c.recompute == "true"));
          }
        }
        return options;
      },
      py::arg("text"),
      "ACTPACK_CONF's text as actpack.budget's keyword arguments (with allocator and device), "
      "checked (runtime::ParseBudgetConf)");
  m.attr("CONF_KEYS") = runtime::BudgetConfKeys();
  m.def(
      "capped_from",
      [](const BudgetConfig& config) { return runtime::CappedFromStep(config); },
      py::arg("config"),
      "The first step (from 0) a run of `config` is held to the cap in "
      "(runtime::CappedFromStep)");
  m.def(
      "holding_outside",
      [](uint64_t budget_bytes, uint64_t outside_allowance_bytes, uint64_t held_outside) {
        runtime::BudgetMemoryFacts facts;
        facts.budget_bytes = budget_bytes;
        facts.outside_allowance_bytes = outside_allowance_bytes;
        facts = runtime::HoldingOutside(facts, held_outside);
        return std::make_tuple(facts.budget_bytes, facts.outside_allowance_bytes);
      },
      py::arg("budget_bytes"), py::arg("outside_allowance_bytes"), py::arg("held_outside"),
      "(budget bytes, outside allowance) once held_outside bytes are outside the pool "
      "(runtime::HoldingOutside)");
}

void BindBudgetRun(py::module_& m) {
  m.attr("_LIFTED_CAP_EXTRA_BYTES") = runtime::kLiftedCapExtraBytes;
  py::class_<runtime::BudgetMemory, PyBudgetMemory>(m, "BudgetMemory").def(py::init<>());
  // The host pool's memory side (torch_plugin/csrc/host_budget_memory.h), which a BudgetRun
  // drives without Python; actpack/_budget_memory.py starts, watches and stops it.
  py::class_<HostBudgetMemory, runtime::BudgetMemory>(m, "HostBudgetMemory")
      .def(py::init<>())
      .def_property_readonly_static(
          "SYSTEM_MEMORY", [](py::object) { return HostBudgetMemory::kSystemMemory; })
      .def("start", &HostBudgetMemory::Start)
      .def("resume_counting", &HostBudgetMemory::ResumeCounting)
      .def("stop_watching", &HostBudgetMemory::StopWatching)
      .def(
          "stop",
          [](HostBudgetMemory& memory, bool snapshot,
             const std::tuple<uint64_t, uint64_t, uint64_t>& run_peaks, uint64_t budget_bytes) {
            const auto [allocated, reserved, system] = run_peaks;
            return ToPython(memory.Stop(snapshot, {allocated, reserved, system}, budget_bytes));
          },
          py::arg("snapshot"), py::arg("run_peaks"), py::arg("budget_bytes"));
  using runtime::BudgetRun;
  py::class_<BudgetRun>(m, "BudgetRun",
                        "One run under a memory budget over a session and a BudgetMemory "
                        "(runtime/budget_run.h): actpack.budget drives it")
      .def(py::init([](PythonHooks& hooks, runtime::BudgetMemory& memory,
                       const runtime::BudgetConfig& config, uint64_t budget_bytes, bool capped,
                       uint64_t outside_allowance_bytes, uint64_t lifted_cap_extra_bytes) {
             ThrowIfError(config.Validate());
             runtime::BudgetMemoryFacts facts;
             facts.budget_bytes = budget_bytes;
             facts.capped = capped;
             facts.outside_allowance_bytes = outside_allowance_bytes;
             facts.lifted_cap_extra_bytes = lifted_cap_extra_bytes;
             return std::make_unique<BudgetRun>(
                 config, facts, hooks.packer().session(), memory,
                 [&hooks](size_t needed) { return hooks.packer().Relieve(needed); });
           }),
           py::keep_alive<1, 2>(), py::keep_alive<1, 3>(), py::arg("hooks"),
           py::arg("memory"), py::arg("config"), py::arg("budget_bytes"), py::arg("capped"),
           py::arg("outside_allowance_bytes"),
           py::arg("lifted_cap_extra_bytes") = runtime::kLiftedCapExtraBytes)
      .def("start", &BudgetRun::Start)
      .def("relieve", &BudgetRun::Relieve, py::arg("needed"))
      .def("note_region", &BudgetRun::NoteRegion)
      .def_property_readonly("steps", &BudgetRun::steps)
      .def(
          "end_step",
          [](BudgetRun& run) -> py::object {
            absl::StatusOr<BudgetRun::StepEnd> end = run.EndStep();
            ThrowIfError(end.status());  // torch.OutOfMemoryError when it does not fit
            return end->warning ? py::object(py::str(*end->warning)) : py::object(py::none());
          },
          "Ends a step: None, or the warning that the regions recompute from the next step")
      .def("stop", &BudgetRun::Stop)
      .def(
          "out_of_memory_while_measuring",
          [](const BudgetRun& run, const std::string& cause) -> py::object {
            std::optional<std::string> text = run.OutOfMemoryWhileMeasuring(cause);
            return text ? py::object(py::str(*text)) : py::object(py::none());
          },
          py::arg("cause"))
      .def(
          "observe_gradients",
          [](BudgetRun& run, const std::vector<std::pair<std::string, double>>& modules) {
            const BudgetRun::GradientVerdict verdict = run.ObserveGradients(modules);
            return std::make_tuple(std::string(VerdictName(verdict.action)), verdict.message);
          },
          py::arg("modules"),
          "The gradient guard's verdict on a step's [(module, gradient norm)]: (\"train_on\" | "
          "\"drop_step\" | \"stop\", message)")
      .def("warn", &BudgetRun::Warn, py::arg("message"))
      .def(
          "run_section",
          [](const BudgetRun& run, std::string torch, std::optional<std::string> python,
             std::string device, std::optional<std::string> system_memory, double wall_seconds,
             int64_t rank, int64_t world_size) {
            return ToPython(run.RunSection({std::move(torch), std::move(python),
                                            std::move(device), std::move(system_memory),
                                            wall_seconds, rank, world_size}));
          },
          py::arg("torch"), py::arg("python"), py::arg("device"), py::arg("system_memory"),
          py::arg("wall_seconds"), py::arg("rank"), py::arg("world_size"),
          "The report's run section (runtime::BudgetRun::RunSection) from what Python knows")
      .def_property_readonly("run_peaks", [](const BudgetRun& run) {
        const runtime::MemoryPeaks& peaks = run.run_peaks();
        return std::make_tuple(peaks.allocated, peaks.reserved, peaks.system);
      });
}

}  // namespace

void BindSavedTensorHooks(py::module_& m) {
  packed_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&packed_spec));
  if (packed_type == nullptr) throw py::error_already_set();
  m.attr("PackedTensor") = py::handle(reinterpret_cast<PyObject*>(packed_type));
  py::class_<PythonHooks>(m, "SavedTensorHooks")
      .def(py::init<const runtime::BudgetConfig&, uint64_t, uint64_t>(), py::arg("config"),
           py::arg("budget_bytes") = 0, py::arg("outside_allowance_bytes") = 0)
      .def("hooks", &MakeHooks,
           "(pack, unpack): the session's saved-tensor hooks as plain functions")
      .def("hook_seconds", &PythonHooks::HookSeconds)
      .def("queue_end_now", [](PythonHooks& s) { return s.step_end().QueueEndNow(); },
           "in the unpack hook: whether to queue the step's end now (StepEndWatch)")
      .def("step_ended", [](PythonHooks& s) { s.step_end().Ended(); },
           "the queued end of step ran")
      .def_static("live", &PythonHooks::Live,
                  "how many are alive (a budget's is freed when its run closes)")
      .def("relieve", [](PythonHooks& s, size_t needed) { return s.packer().Relieve(needed); },
           py::arg("needed"))
      .def("set_module_gradients",
           [](PythonHooks& s,
              const std::map<std::string, std::tuple<double, double, double, double>>& gradients) {
             s.packer().SetModuleGradients(gradients);
           },
           py::arg("gradients"))
      .def("tighten_floor",
           [](PythonHooks& s) { return s.packer().session().TightenFloor(); },
           "halves the fidelity floor of the automatic choices (runtime::Session::TightenFloor); "
           "returns the new floor")
      .def("policy", &PolicyDict)
      .def("totals", &TotalsDict);
  BindBudgetConfig(m);
  BindBudgetRun(m);
  m.def(
      "build_report",
      [](py::handle run, const PythonHooks& hooks) {
        return ToPython(report::MakeRunReport(
            FromPython(run), report::ActivationsSection(hooks.packer().State())));
      },
      py::arg("run"), py::arg("hooks"));
}

}  // namespace actpack::torch_plugin

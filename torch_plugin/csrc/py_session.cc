#include "torch_plugin/csrc/py_session.h"

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/python_variable.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <tuple>
#include <utility>
#include <variant>
#include <vector>

#include "report/writer.h"
#include "runtime/session.h"
#include "torch_plugin/csrc/saved_tensors.h"
#include "torch_plugin/csrc/py_json.h"

namespace actpack::torch_plugin {
namespace {

namespace py = pybind11;

class PySession {
 public:
  explicit PySession(const SessionSettings& settings) : session_(settings) {}

  // New references; nullptr with a Python error set.
  PyObject* Pack(const at::Tensor& tensor, std::string module);
  PyObject* Unpack(PyObject* handle);

  // Wall time inside Pack and Unpack (codecs included), for tools/hook_overhead.py: what the
  // hooks cost beyond it is Python's.
  double HookSeconds() const { return static_cast<double>(hook_nanoseconds_) * 1e-9; }

  SavedTensorSession& session() { return session_; }
  const SavedTensorSession& session() const { return session_; }

 private:
  SavedTensorSession session_;
  uint64_t hook_nanoseconds_ = 0;  // under the GIL, as the hooks run
};

// ---- actpack._C.PackedTensor: a PackedHandle as a Python object ----

struct PackedObject {
  PyObject_HEAD
  PackedHandle handle;
};

PyTypeObject* packed_type = nullptr;  // made by BindSession

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
                                  "policy); only actpack._C.Session makes them.")},
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

// ---- the hooks as CPython functions; `self` is a capsule of the session (see MakeHooks) ----

constexpr char kCapsuleName[] = "actpack._C.Session";

PySession& SessionOf(PyObject* capsule) {
  return *static_cast<PySession*>(PyCapsule_GetPointer(capsule, kCapsuleName));
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
  return SessionOf(self).Pack(THPVariable_Unpack(args[0]),
                              std::string(module, static_cast<size_t>(size)));
  END_HANDLE_TH_ERRORS
}

// unpack(handle)
PyObject* UnpackHook(PyObject* self, PyObject* handle) {
  HANDLE_TH_ERRORS
  return SessionOf(self).Unpack(handle);
  END_HANDLE_TH_ERRORS
}

PyMethodDef pack_def = {"pack", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(PackHook)),
                        METH_FASTCALL,
                        "pack(tensor, module): the tensor itself, or a PackedTensor"};
PyMethodDef unpack_def = {"unpack", UnpackHook, METH_O, "unpack(handle): the saved tensor"};

// (pack, unpack) of the session `self`; they hold a reference to it.
py::tuple MakeHooks(const py::object& self) {
  PySession& session = self.cast<PySession&>();
  py::object capsule = py::reinterpret_steal<py::object>(
      PyCapsule_New(&session, kCapsuleName, [](PyObject* c) {
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

py::dict PolicyDict(const PySession& s) {
  const runtime::PolicyState p = s.session().Policy();
  py::dict d;
  d["plans"] = p.plans;
  d["other_bytes"] = p.other_bytes;
  d["projected_peak_bytes"] = p.projected_peak;
  d["feasible"] = p.feasible;
  d["smallest_feasible_budget"] = p.smallest_feasible_budget;
  d["outside_pool_bytes"] = p.outside_pool_bytes;
  return d;
}

py::dict TotalsDict(const PySession& s) {
  const runtime::SessionTotals t = s.session().Totals();
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

PyObject* PySession::Pack(const at::Tensor& tensor, std::string module) {
  const auto start = std::chrono::steady_clock::now();
  SavedTensor saved = session_.Pack(tensor, std::move(module));
  PyObject* result = nullptr;
  if (at::Tensor* kept = std::get_if<at::Tensor>(&saved)) {
    result = THPVariable_Wrap(std::move(*kept));
  } else {
    result = WrapHandle(std::get<PackedHandle>(std::move(saved)));
  }
  hook_nanoseconds_ += NanosecondsSince(start);
  return result;
}

PyObject* PySession::Unpack(PyObject* handle) {
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
      THPVariable_Wrap(session_.Unpack(reinterpret_cast<PackedObject*>(handle)->handle));
  hook_nanoseconds_ += NanosecondsSince(start);
  return result;
}

}  // namespace

void BindSession(py::module_& m) {
  packed_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&packed_spec));
  if (packed_type == nullptr) throw py::error_already_set();
  m.attr("PackedTensor") = py::handle(reinterpret_cast<PyObject*>(packed_type));
  py::class_<PySession>(m, "Session")
      .def(py::init([](const std::string& codec,
                       const std::vector<std::pair<std::string, std::string>>& rules,
                       int64_t min_bytes, uint64_t seed, bool enabled, int64_t budget_bytes,
                       double headroom, int64_t profile_every,
                       double allowed_loss_increase,
                       int64_t outside_allowance_bytes, double max_rel_rms) {
             return std::make_unique<PySession>(SessionSettings{
                 codec, rules, min_bytes, seed, enabled, budget_bytes, headroom, profile_every,
                 allowed_loss_increase, outside_allowance_bytes, max_rel_rms});
           }),
           py::arg("codec"), py::arg("rules") = std::vector<std::pair<std::string, std::string>>{},
           py::arg("min_bytes") = runtime::kDefaultMinBytes, py::arg("seed") = 0,
           py::arg("enabled") = true, py::arg("budget_bytes") = 0,
           py::arg("headroom") = runtime::kDefaultHeadroom,
           py::arg("profile_every") = runtime::kDefaultProfileEvery,
           py::arg("allowed_loss_increase") = 0.0, py::arg("outside_allowance_bytes") = 0,
           py::arg("max_rel_rms") = runtime::kDefaultMaxRelRms)
      .def("hooks", &MakeHooks,
           "(pack, unpack): the session's saved-tensor hooks as plain functions")
      .def("hook_seconds", &PySession::HookSeconds)
      .def("relieve", [](PySession& s, size_t needed) { return s.session().Relieve(needed); },
           py::arg("needed"))
      .def("set_module_gradients",
           [](PySession& s, const std::map<std::string, std::tuple<double, double, double, double>>&
                                gradients) { s.session().SetModuleGradients(gradients); },
           py::arg("gradients"))
      .def("end_step",
           [](PySession& s, uint64_t peak, uint64_t reserved, uint64_t system) {
             s.session().EndStep(peak, reserved, system);
           },
           py::arg("peak_bytes") = 0, py::arg("reserved_bytes") = 0, py::arg("system_bytes") = 0)
      .def("policy", &PolicyDict)
      .def("totals", &TotalsDict);
  m.def(
      "build_report",
      [](py::handle run, const PySession& session) {
        return ToPython(report::MakeRunReport(
            FromPython(run), report::ActivationsSection(session.session().State())));
      },
      py::arg("run"), py::arg("session"));
}

}  // namespace actpack::torch_plugin

#include "torch_plugin/bindings/python_json.h"

#include <cmath>
#include <cstdint>
#include <string>

namespace py = pybind11;

namespace actpack::torch_plugin {
namespace {

json::Value FromPythonAt(py::handle object, const std::string& path) {
  if (object.is_none()) return nullptr;
  // bool before int: Python's bool is an int.
  if (py::isinstance<py::bool_>(object)) return object.cast<bool>();
  if (py::isinstance<py::int_>(object)) {
    int overflow = 0;
    const long long value = PyLong_AsLongLongAndOverflow(object.ptr(), &overflow);
    if (overflow == 0) return static_cast<int64_t>(value);
    if (overflow > 0) {
      const unsigned long long unsigned_value = PyLong_AsUnsignedLongLong(object.ptr());
      if (!PyErr_Occurred()) return static_cast<uint64_t>(unsigned_value);
      PyErr_Clear();
    }
    throw py::type_error("actpack: " + path + " is the integer " +
                         py::repr(object).cast<std::string>() +
                         ", outside the 64-bit range a report holds");
  }
  if (py::isinstance<py::float_>(object)) return object.cast<double>();
  if (py::isinstance<py::str>(object)) return object.cast<std::string>();
  if (py::isinstance<py::dict>(object)) {
    json::Value result = json::Value::object();
    for (const auto& [key, item] : object.cast<py::dict>()) {
      if (!py::isinstance<py::str>(key)) {
        throw py::type_error("actpack: " + path + " has the key " +
                             py::repr(key).cast<std::string>() + "; expected string keys");
      }
      const std::string name = key.cast<std::string>();
      result[name] = FromPythonAt(item, path.empty() ? name : path + "." + name);
    }
    return result;
  }
  if (py::isinstance<py::list>(object) || py::isinstance<py::tuple>(object)) {
    json::Value result = json::Value::array();
    size_t index = 0;
    for (py::handle item : object) {
      result.push_back(FromPythonAt(item, path + "[" + std::to_string(index++) + "]"));
    }
    return result;
  }
  throw py::type_error("actpack: " + (path.empty() ? std::string("the value") : path) + " is " +
                       py::repr(object).cast<std::string>() + " (" +
                       py::str(object.get_type().attr("__name__")).cast<std::string>() +
                       "); expected dict, list, str, int, float, bool or None");
}

}  // namespace

py::object ToPython(const json::Value& value) {
  switch (value.type()) {
    case json::Value::value_t::null:
    case json::Value::value_t::discarded:
      return py::none();
    case json::Value::value_t::boolean:
      return py::bool_(value.get<bool>());
    case json::Value::value_t::number_integer:
      return py::int_(value.get<int64_t>());
    case json::Value::value_t::number_unsigned:
      return py::int_(value.get<uint64_t>());
    case json::Value::value_t::number_float: {
      const double number = value.get<double>();
      return std::isfinite(number) ? py::object(py::float_(number)) : py::object(py::none());
    }
    case json::Value::value_t::string:
      return py::str(value.get_ref<const std::string&>());
    case json::Value::value_t::array: {
      py::list list(value.size());
      for (size_t i = 0; i < value.size(); ++i) list[i] = ToPython(value[i]);
      return std::move(list);
    }
    case json::Value::value_t::object: {
      py::dict dict;
      for (const auto& [key, item] : value.items()) dict[py::str(key)] = ToPython(item);
      return std::move(dict);
    }
    case json::Value::value_t::binary:
      break;
  }
  throw py::type_error("actpack: a binary JSON value has no Python form");
}

json::Value FromPython(py::handle object) { return FromPythonAt(object, ""); }

}  // namespace actpack::torch_plugin

// JSON documents (runtime/json.h's ordered_json) as Python objects and back, so reports and
// parsed settings cross the binding as dicts and lists rather than JSON text. Member order is
// kept both ways (Debian's pybind11-json bridges only nlohmann::json, whose objects are sorted).
//
//   py::object report = ToPython(document);      // dict, list, str, int, float, bool, None
//   json::Value run = FromPython(run_metadata);   // TypeError naming what it cannot represent
#ifndef ACTPACK_TORCH_PLUGIN_BINDINGS_PYTHON_JSON_H_
#define ACTPACK_TORCH_PLUGIN_BINDINGS_PYTHON_JSON_H_

#include <pybind11/pybind11.h>

#include "runtime/json.h"

namespace actpack::torch_plugin {

// Non-finite numbers become None, as they are written to a file (json::Serialize writes null),
// so a report in memory equals the one read back from its file.
pybind11::object ToPython(const json::Value& value);

// dict (string keys), list, tuple, str, bool, int (int64 or uint64 range), float, None.
// Anything else, or an int out of range, is a TypeError naming its path ("run.budget").
json::Value FromPython(pybind11::handle object);

}  // namespace actpack::torch_plugin

#endif  // ACTPACK_TORCH_PLUGIN_BINDINGS_PYTHON_JSON_H_

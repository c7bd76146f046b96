// `actpack snapshot`: the allocator's memory snapshot of a run report as the Python pickle
// that pytorch.org/memory_viz opens, written here byte by byte (no Python needed).
//
// Usage:
//   if (const json::Value* snapshot = report.Snapshot()) {
//     absl::Status written = WriteFile("snap.pickle", PickleJson(*snapshot));
//   }
#ifndef ACTPACK_REPORT_SNAPSHOT_H_
#define ACTPACK_REPORT_SNAPSHOT_H_

#include <string>

#include "runtime/json.h"

namespace actpack::report {

// PickleJson
//
// `value` as a Python pickle (protocol 2) of plain objects: null -> None, bool, integers ->
// int, other numbers -> float, strings -> str, arrays -> list, objects -> dict in member
// order. pickle.load of the result equals json.loads of json::Serialize(value), and needs no
// class from any module, so it is what `actpack snapshot` writes for torch's memory_viz.
std::string PickleJson(const json::Value& value);

}  // namespace actpack::report

#endif  // ACTPACK_REPORT_SNAPSHOT_H_

// JSON for the run report (report/FORMAT.md) and anything else actpack reads or writes as JSON:
// nlohmann/json's `ordered_json` (members stay in insertion order, so a report reads in the
// order it was written), with the few things the library leaves to its user:
//
//  - `Parse` returns absl::StatusOr instead of throwing, tells a truncated text (kDataLoss) from
//    a malformed one (kInvalidArgument), and refuses what a report never holds but the library
//    would accept: duplicate object keys (it keeps the last) and nesting deeper than `kMaxDepth`;
//  - `Serialize` writes invalid UTF-8 as U+FFFD instead of throwing, and NaN/inf as null;
//  - `Find` answers nullptr for a missing key or a value that is not an object, so reading an
//    untrusted document needs no type check before each step; `IsInt` is "an exact int64".
//
// Usage:
//   json::Value report = json::Value::object();
//   report["schema"] = 1;
//   json::Value& layers = report["layers"] = json::Value::array();
//   layers.push_back("conv1");
//   std::string text = json::Serialize(report);            // indented by 2; 0 = compact
//
//   absl::StatusOr<json::Value> doc = json::Parse(text);
//   if (!doc.ok()) return doc.status();
//   if (const json::Value* b = json::Find(*doc, "budget_bytes"); b && json::IsInt(*b)) {
//     int64_t budget = b->get<int64_t>();
//   }
#ifndef ACTPACK_RUNTIME_JSON_H_
#define ACTPACK_RUNTIME_JSON_H_

#include <cstdint>
#include <limits>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace actpack::json {

using Value = nlohmann::ordered_json;

// Parse refuses arrays and objects nested deeper than this (a report is a few levels deep).
inline constexpr int kMaxDepth = 256;

// Parses one JSON text (RFC 8259; surrounding whitespace allowed). Errors name the line and
// column, e.g. "json: line 1, column 9: syntax error while parsing array - unexpected end of
// input; expected ']'" (kDataLoss when the text ends early, kInvalidArgument otherwise).
absl::StatusOr<Value> Parse(absl::string_view text);

// Pretty-printed with `indent` spaces per level, or compact with indent 0.
std::string Serialize(const Value& value, int indent = 2);

// The member `key` of an object; nullptr when `object` is not an object or lacks it.
inline const Value* Find(const Value& object, absl::string_view key) {
  if (!object.is_object()) return nullptr;
  auto it = object.find(std::string(key));
  return it == object.end() ? nullptr : &*it;
}
inline Value* Find(Value& object, absl::string_view key) {
  return const_cast<Value*>(Find(static_cast<const Value&>(object), key));
}

// A number held as an exact int64 (a parsed integer or one built from an integer type that fits).
inline bool IsInt(const Value& value) {
  if (value.is_number_unsigned()) {
    return value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  }
  return value.is_number_integer();
}

// Elements of an array or members of an object; 0 for anything else (the library says 1 for a
// scalar).
inline size_t Size(const Value& value) {
  return value.is_array() || value.is_object() ? value.size() : 0;
}

}  // namespace actpack::json

#endif  // ACTPACK_RUNTIME_JSON_H_

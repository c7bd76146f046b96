// A small JSON document model, a strict RFC 8259 parser and a serializer, for the run report
// (report/FORMAT.md) and anything else actpack reads or writes as JSON.
//
// A `Value` is null, a bool, a number, a UTF-8 string, an array or an object. Numbers keep the
// exact int64 when the text was an integer that fits; anything else is a double. Objects keep
// their members in insertion order, so a report reads in the order it was written.
//
// The parser accepts exactly RFC 8259 JSON: no comments, no trailing commas, no NaN, no leading
// zeros, strings in valid UTF-8. It also refuses duplicate object keys (RFC 8259 leaves them
// undefined; a report never has them) and nesting deeper than `kMaxDepth`. Errors name the line
// and column and what was expected there. No input crashes it (runtime/json_fuzz.cc).
//
// Usage:
//   json::Value report = json::Value::Object();
//   report.Set("schema", 1);
//   report.Set("budget_bytes", int64_t{6} << 30);
//   json::Value& layers = report.Set("layers", json::Value::Array());
//   layers.Append("conv1");
//   std::string text = json::Serialize(report);            // indented by 2; 0 = compact
//
//   absl::StatusOr<json::Value> doc = json::Parse(text);
//   if (!doc.ok()) return doc.status();                    // kInvalidArgument or kDataLoss
//   if (const json::Value* b = doc->Find("budget_bytes"); b != nullptr && b->is_int()) {
//     int64_t budget = b->as_int();
//   }
//   for (const json::Value::Member& m : doc->members()) { ... m.first, m.second ... }
#ifndef ACTPACK_RUNTIME_JSON_H_
#define ACTPACK_RUNTIME_JSON_H_

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace actpack::json {

// Parse refuses arrays and objects nested deeper than this: the parser recurses, and a bound
// keeps a hostile input from exhausting the stack.
inline constexpr int kMaxDepth = 256;

enum class Type { kNull, kBool, kNumber, kString, kArray, kObject };

// Value
//
// One JSON value, held by value (copying copies the whole tree). Two kinds of accessor:
//  - typed ones (`as_*`, `operator[]`, `Set`, `Append`) require the matching type and abort with
//    a message otherwise: calling them on the wrong type is a programming error;
//  - query ones (`Find`, `size`, `elements`, `members`) answer "nothing" (nullptr, 0, empty) on
//    the wrong type, so reading an untrusted document needs no type check before each step.
class Value {
 public:
  using Member = std::pair<std::string, Value>;

  Value() = default;  // null
  Value(std::nullptr_t) {}
  Value(bool b) : data_(b) {}
  Value(double d) : data_(d) {}
  // Any integer type; an unsigned value above INT64_MAX becomes a double.
  template <typename Int, std::enable_if_t<std::is_integral_v<Int> &&
                                               !std::is_same_v<Int, bool>, int> = 0>
  Value(Int n) {
    if constexpr (std::is_unsigned_v<Int> && sizeof(Int) >= sizeof(int64_t)) {
      if (n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        data_ = static_cast<double>(n);
        return;
      }
    }
    data_ = static_cast<int64_t>(n);
  }
  Value(std::string s) : data_(std::move(s)) {}
  Value(absl::string_view s) : data_(std::string(s)) {}
  Value(const char* s) : data_(std::string(s)) {}
  // Without this, any other pointer would silently convert to bool.
  template <typename T, std::enable_if_t<!std::is_same_v<std::remove_cv_t<T>, char>, int> = 0>
  Value(T*) = delete;

  // An empty array / an empty object.
  static Value Array();
  static Value Object();

  Type type() const;
  bool is_null() const { return type() == Type::kNull; }
  bool is_bool() const { return type() == Type::kBool; }
  bool is_number() const { return type() == Type::kNumber; }
  // A number held as an exact int64 (an integer literal that fits, or built from an integer).
  bool is_int() const { return std::holds_alternative<int64_t>(data_); }
  bool is_string() const { return type() == Type::kString; }
  bool is_array() const { return type() == Type::kArray; }
  bool is_object() const { return type() == Type::kObject; }

  bool as_bool() const;
  int64_t as_int() const;    // requires is_int()
  double as_double() const;  // any number; an int64 is converted (may round above 2^53)
  const std::string& as_string() const;

  // Elements of an array or members of an object; 0 for anything else.
  size_t size() const;

  // Arrays.
  const Value& operator[](size_t i) const;  // requires is_array() and i < size()
  Value& operator[](size_t i);
  Value& Append(Value v);  // returns the appended element
  absl::Span<const Value> elements() const;
  absl::Span<Value> elements();

  // Objects. Lookup is a linear scan: report objects are small, and order matters more.
  const Value* Find(absl::string_view key) const;
  Value* Find(absl::string_view key);
  // Replaces the value of `key` in place if present (keeping its position), else appends.
  Value& Set(std::string key, Value v);  // returns the stored value
  absl::Span<const Member> members() const;

  // Deep equality. Numbers compare by mathematical value, so Value(1) == Value(1.0).
  friend bool operator==(const Value& a, const Value& b);
  friend bool operator!=(const Value& a, const Value& b) { return !(a == b); }

 private:
  friend class Parser;
  using ArrayData = std::vector<Value>;
  using ObjectData = std::vector<Member>;
  std::variant<std::monostate, bool, int64_t, double, std::string, ArrayData, ObjectData> data_;
};

// Parse
//
// Parses one JSON text (RFC 8259; surrounding whitespace allowed). Errors:
//  - kDataLoss when the text ends early (truncated input), e.g.
//    "json: line 1, column 9: unexpected end of input; expected ',' or ']' after array element";
//  - kInvalidArgument for anything else, e.g.
//    "json: line 3, column 14: expected ',' or '}' after object member, found 'x'".
// Lines count from 1 at each '\n'; columns count UTF-8 characters from 1.
absl::StatusOr<Value> Parse(absl::string_view text);

// Serialize
//
// Writes `value` as JSON: pretty-printed with `indent` spaces per level, or compact with
// indent 0. Integers are written exactly; doubles in the shortest form that reads back to the
// same double, with ".0" added when that form looks like an integer so that the number parses
// back as a double. NaN and infinities become null (JSON has none). Control characters are
// escaped; invalid UTF-8 in a string becomes U+FFFD, so the output is always valid JSON.
std::string Serialize(const Value& value, int indent = 2);

}  // namespace actpack::json

#endif  // ACTPACK_RUNTIME_JSON_H_

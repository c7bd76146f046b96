#include "runtime/json.h"

#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace actpack::json {
namespace {

// What the parse callback refuses; caught in Parse and turned into a status.
struct Refused {
  std::string message;
};

// nlohmann's messages start with "[json.exception.parse_error.101] parse error at "; ours say
// "json: " and then where and what.
std::string Reword(absl::string_view what) {
  if (absl::StartsWith(what, "[json.exception.")) what.remove_prefix(what.find("] ") + 2);
  absl::ConsumePrefix(&what, "parse error at ");
  return absl::StrCat("json: ", what);
}

}  // namespace

absl::StatusOr<Value> Parse(absl::string_view text) {
  // Keys of each object being read, innermost last.
  std::vector<std::set<std::string>> keys;
  auto check = [&keys](int depth, Value::parse_event_t event, Value& parsed) {
    switch (event) {
      case Value::parse_event_t::object_start:
      case Value::parse_event_t::array_start:
        if (depth >= kMaxDepth) {
          throw Refused{absl::StrCat("json: arrays and objects nested deeper than ", kMaxDepth)};
        }
        if (event == Value::parse_event_t::object_start) keys.emplace_back();
        break;
      case Value::parse_event_t::object_end:
        keys.pop_back();
        break;
      case Value::parse_event_t::key:
        if (!keys.back().insert(parsed.get<std::string>()).second) {
          throw Refused{absl::StrCat("json: duplicate key ", parsed.dump(), " in an object")};
        }
        break;
      default:
        break;
    }
    return true;
  };
  try {
    return Value::parse(text.begin(), text.end(), check);
  } catch (const Value::parse_error& e) {
    // The lexer met the end of the text where more was expected: the document was cut short
    // (e.g. a partly written report), not malformed.
    const bool truncated = e.byte > text.size() || absl::StrContains(e.what(), "end of input;") ||
                           absl::StrContains(e.what(), "missing closing quote");
    return truncated ? absl::DataLossError(Reword(e.what()))
                     : absl::InvalidArgumentError(Reword(e.what()));
  } catch (const Value::out_of_range& e) {  // a number past double's range, e.g. 1e400
    return absl::InvalidArgumentError(Reword(e.what()));
  } catch (const Refused& e) {
    return absl::InvalidArgumentError(e.message);
  }
}

std::string Serialize(const Value& value, int indent) {
  return value.dump(indent > 0 ? indent : -1, ' ', /*ensure_ascii=*/false,
                    Value::error_handler_t::replace);
}

}  // namespace actpack::json

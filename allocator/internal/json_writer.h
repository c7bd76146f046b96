// json_writer.h — a minimal streaming JSON writer for the allocator's snapshots.
//
// The allocator may not depend on the runtime (where actpack's full JSON library lives), and a
// snapshot only needs objects, arrays, strings, integers and booleans, so this writer is small:
// it places the commas and escapes strings per RFC 8259. It does not check that calls nest
// correctly; the snapshot code is its only user.
//
// Example:
//   JsonWriter json;
//   json.BeginObject();
//   json.Key("action");
//   json.String("alloc");
//   json.EndObject();
//   std::string text = json.Take();  // {"action":"alloc"}
#ifndef ACTPACK_ALLOCATOR_INTERNAL_JSON_WRITER_H_
#define ACTPACK_ALLOCATOR_INTERNAL_JSON_WRITER_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace actpack::allocator::internal {

// Appends `text` to `out` as a quoted JSON string: quotes, backslashes and control characters
// escaped, other bytes (UTF-8) copied as they are.
void AppendJsonString(absl::string_view text, std::string& out);

class JsonWriter {
 public:
  void BeginObject() { Open('{'); }
  void EndObject() { Close('}'); }
  void BeginArray() { Open('['); }
  void EndArray() { Close(']'); }
  void Key(absl::string_view key);
  void String(absl::string_view value);
  void Int(int64_t value);
  void UInt(uint64_t value);
  void Bool(bool value);

  std::string Take() { return std::move(out_); }

 private:
  void BeforeValue();
  void Open(char bracket);
  void Close(char bracket);

  std::string out_;
  // Per open container: whether it has an element yet (a comma goes before the next).
  std::vector<bool> has_element_;
  bool after_key_ = false;
};

}  // namespace actpack::allocator::internal

#endif  // ACTPACK_ALLOCATOR_INTERNAL_JSON_WRITER_H_

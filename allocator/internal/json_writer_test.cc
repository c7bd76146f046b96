#include "allocator/internal/json_writer.h"

#include <string>

#include "gtest/gtest.h"

namespace actpack::allocator::internal {
namespace {

std::string Quoted(absl::string_view text) {
  std::string out;
  AppendJsonString(text, out);
  return out;
}

TEST(JsonWriterTest, EscapesStrings) {
  EXPECT_EQ(Quoted("plain"), "\"plain\"");
  EXPECT_EQ(Quoted("a\"b\\c"), "\"a\\\"b\\\\c\"");
  EXPECT_EQ(Quoted("line\nnext\ttab\r"), "\"line\\nnext\\ttab\\r\"");
  EXPECT_EQ(Quoted(std::string("\x01\x1f\b\f", 4)), "\"\\u0001\\u001f\\b\\f\"");
  EXPECT_EQ(Quoted(std::string("nul\0end", 7)), "\"nul\\u0000end\"");
  EXPECT_EQ(Quoted("caf\xc3\xa9 / \x7f"), "\"caf\xc3\xa9 / \x7f\"");  // UTF-8 and DEL pass
}

TEST(JsonWriterTest, PlacesCommasAndNests) {
  JsonWriter json;
  json.BeginObject();
  json.Key("a");
  json.Int(-3);
  json.Key("list");
  json.BeginArray();
  json.UInt(18446744073709551615ull);
  json.Bool(true);
  json.BeginObject();
  json.EndObject();
  json.BeginArray();
  json.EndArray();
  json.String("x");
  json.EndArray();
  json.Key("b");
  json.Bool(false);
  json.EndObject();
  EXPECT_EQ(json.Take(), "{\"a\":-3,\"list\":[18446744073709551615,true,{},[],\"x\"],\"b\":false}");
}

}  // namespace
}  // namespace actpack::allocator::internal

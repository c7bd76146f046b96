// Tests of what runtime/json adds to nlohmann/json: statuses instead of exceptions, truncation
// told from malformed text, the refusals a report needs, never-throwing serialization, Find.
#include "runtime/json.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace actpack::json {
namespace {

using ::testing::HasSubstr;

constexpr char kReport[] = R"({
  "schema": 1,
  "budget_bytes": 6442450944,
  "activations": {"codec": "auto", "ratio": 15.06, "steps": [{"step": 0, "peak": 123}]},
  "name": "caf\u00e9 \ud83d\ude00",
  "empty": {}, "none": [], "flag": false, "nothing": null
})";

TEST(JsonParseTest, KeepsTheTextsOrderAndExactIntegers) {
  absl::StatusOr<Value> doc = Parse(kReport);
  ASSERT_TRUE(doc.ok()) << doc.status();
  std::string keys;
  for (const auto& member : doc->items()) keys += member.key() + ",";
  EXPECT_EQ(keys, "schema,budget_bytes,activations,name,empty,none,flag,nothing,");
  EXPECT_EQ(Find(*doc, "budget_bytes")->get<int64_t>(), int64_t{6} << 30);
  EXPECT_EQ(Find(*doc, "name")->get<std::string>(), "caf\xc3\xa9 \xf0\x9f\x98\x80");
  EXPECT_DOUBLE_EQ(Find(*Find(*doc, "activations"), "ratio")->get<double>(), 15.06);
  // Serialize -> Parse gives the same document, in the same order.
  for (int indent : {0, 2}) {
    absl::StatusOr<Value> again = Parse(Serialize(*doc, indent));
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, *doc);
    EXPECT_EQ(Serialize(*again, indent), Serialize(*doc, indent));
  }
}

TEST(JsonParseTest, EveryTruncationIsDataLossNotASuccess) {
  const std::string text = kReport;
  // Every proper prefix that ends inside the value (the closing brace is the last byte).
  for (size_t n = 0; n + 1 < text.size(); ++n) {
    absl::StatusOr<Value> doc = Parse(text.substr(0, n));
    ASSERT_FALSE(doc.ok()) << "a prefix of " << n << " bytes parsed";
    EXPECT_EQ(doc.status().code(), absl::StatusCode::kDataLoss) << n << " bytes: " << doc.status();
    EXPECT_THAT(std::string(doc.status().message()), HasSubstr("json: line "));
  }
}

TEST(JsonParseTest, MalformedTextIsInvalidArgumentWithLineAndColumn) {
  struct Case {
    const char* text;
    const char* says;
  };
  for (const Case& c : {
           Case{"[1,2]x", "line 1, column 6"},
           Case{"{\"a\": [}", "line 1, column 8"},
           Case{"[1,]", "unexpected ']'"},
           Case{"01", "line 1, column 2"},
           Case{"{\n  \"a\": 1\n  \"b\": 2}", "line 3, column 5"},
           Case{"\"\xff\"", "ill-formed UTF-8"},
           Case{"[NaN]", "line 1, column 2"},
           Case{"// comment\n1", "line 1, column 1"},
       }) {
    absl::StatusOr<Value> doc = Parse(c.text);
    ASSERT_FALSE(doc.ok()) << c.text;
    EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(std::string(doc.status().message()), HasSubstr(c.says)) << doc.status();
  }
}

TEST(JsonParseTest, RefusesWhatTheLibraryWouldAccept) {
  // Duplicate keys (the library keeps the last), also nested and in a large object.
  std::string large = "{";
  for (int i = 0; i < 1000; ++i) absl::StrAppend(&large, "\"k", i, "\": ", i, ", ");
  large += "\"k500\": 0}";
  for (const std::string& text : {std::string(R"({"a": 1, "a": 2})"),
                                  std::string(R"({"x": {"a": 1, "b": 2, "a": 3}})"), large}) {
    absl::StatusOr<Value> doc = Parse(text);
    ASSERT_FALSE(doc.ok()) << text.substr(0, 40);
    EXPECT_EQ(doc.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(doc.status().message()), HasSubstr("duplicate key"));
  }
  // The same key in sibling objects is fine.
  EXPECT_TRUE(Parse(R"([{"a": 1}, {"a": 2}, {"b": {"a": 3}, "a": 4}])").ok());

  // Numbers past double's range.
  absl::StatusOr<Value> huge = Parse("[1e400]");
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(huge.status().message()), HasSubstr("1e400"));
}

TEST(JsonParseTest, NestingUpToTheLimitParsesBeyondItIsRefused) {
  const auto nested = [](int depth) {
    return std::string(depth - 1, '[') + "{\"a\": 1}" + std::string(depth - 1, ']');
  };
  EXPECT_TRUE(Parse(nested(kMaxDepth)).ok());
  absl::StatusOr<Value> deep = Parse(nested(kMaxDepth + 1));
  ASSERT_FALSE(deep.ok());
  EXPECT_EQ(deep.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(deep.status().message()), HasSubstr("nested deeper than 256"));
}

TEST(JsonSerializeTest, PrettyAndCompactKeepInsertionOrder) {
  Value o = Value::object();
  o["zeta"] = 1;
  o["alpha"] = Value::array({1.5, "s", nullptr, true});
  o["empty"] = Value::object();
  o["zeta"] = "replaced";  // in place
  EXPECT_EQ(Serialize(o, 0), R"({"zeta":"replaced","alpha":[1.5,"s",null,true],"empty":{}})");
  EXPECT_EQ(Serialize(o),
            "{\n  \"zeta\": \"replaced\",\n  \"alpha\": [\n    1.5,\n    \"s\",\n    null,\n"
            "    true\n  ],\n  \"empty\": {}\n}");
}

TEST(JsonSerializeTest, NeverThrowsAndAlwaysWritesValidJson) {
  Value o = Value::object();
  o["nan"] = std::nan("");
  o["inf"] = -std::numeric_limits<double>::infinity();
  o["bad_utf8"] = std::string(
      "a\xff"
      "b\xc3");
  o["control"] = std::string("tab\tnul", 7) + std::string(1, '\0');
  const std::string text = Serialize(o, 0);
  EXPECT_EQ(text,
            "{\"nan\":null,\"inf\":null,\"bad_utf8\":\"a\xef\xbf\xbd"
            "b\xef\xbf\xbd\","
            "\"control\":\"tab\\tnul\\u0000\"}");
  EXPECT_TRUE(Parse(text).ok());
}

TEST(JsonSerializeTest, NumbersRoundTripExactlyAndKeepTheirKind) {
  Value a = Value::array({std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                          std::numeric_limits<uint64_t>::max(), 1.0, -0.0, 0.1, 1e-300});
  std::mt19937_64 rng(7);
  for (int i = 0; i < 1000; ++i) {
    const uint64_t bits = rng();
    double d;
    std::memcpy(&d, &bits, sizeof d);
    if (std::isfinite(d)) a.push_back(d);
  }
  absl::StatusOr<Value> back = Parse(Serialize(a, 0));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->size(), a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ((*back)[i].is_number_float(), a[i].is_number_float()) << Serialize(a[i]);
    EXPECT_EQ((*back)[i], a[i]) << Serialize(a[i]);
  }
  EXPECT_EQ(Serialize(Value(1.0)), "1.0");  // reads back as a double, not an integer
}

TEST(JsonFindTest, AnswersNullptrOnAMissingKeyOrTheWrongType) {
  Value o = Value::object();
  o["n"] = 5;
  ASSERT_NE(Find(o, "n"), nullptr);
  EXPECT_EQ(Find(o, "n")->get<int64_t>(), 5);
  *Find(o, "n") = 6;
  EXPECT_EQ(o["n"], 6);
  EXPECT_EQ(Find(o, "missing"), nullptr);
  EXPECT_EQ(o.size(), 1u);  // Find never inserts
  for (const Value& not_object : {Value(1), Value("n"), Value::array({1}), Value()}) {
    EXPECT_EQ(Find(not_object, "n"), nullptr) << Serialize(not_object);
    EXPECT_EQ(Size(not_object), not_object.is_array() ? 1u : 0u);
  }
}

TEST(JsonIsIntTest, OnlyExactInt64s) {
  EXPECT_TRUE(IsInt(Value(-3)));
  EXPECT_TRUE(IsInt(Value(uint64_t{1} << 62)));
  EXPECT_TRUE(IsInt(*Parse("9223372036854775807")));
  EXPECT_FALSE(IsInt(*Parse("9223372036854775808")));  // past INT64_MAX
  EXPECT_FALSE(IsInt(Value(std::numeric_limits<uint64_t>::max())));
  EXPECT_FALSE(IsInt(Value(2.0)));
  EXPECT_FALSE(IsInt(Value("2")));
}

}  // namespace
}  // namespace actpack::json

#include "common/json.h"

#include <catch2/catch.hpp>

namespace muster {
namespace {

TEST_CASE("JsonWriter builds nested documents with commas in the right places") {
  JsonWriter w;
  w.BeginObject().Key("a").Int(1).Key("b").String("x\"y\n").Key("c").BeginArray();
  w.Int(1).Int(2).BeginObject().Key("d").Bool(true).EndObject().EndArray().EndObject();
  CHECK(w.str() == R"({"a":1,"b":"x\"y\n","c":[1,2,{"d":true}]})");
}

TEST_CASE("JsonQuote escapes control characters") {
  CHECK(JsonQuote(std::string("\x01z", 2)) == "\"\\u0001z\"");
}

TEST_CASE("ParseFlatJsonObject round-trips what JsonWriter writes") {
  JsonWriter w;
  w.BeginObject().Key("pid").Int(42).Key("socket").String("/tmp/a b\"c").Key("ok").Bool(false);
  w.EndObject();
  auto parsed = ParseFlatJsonObject(w.str());
  REQUIRE(parsed.ok());
  CHECK(parsed->at("pid") == "42");
  CHECK(parsed->at("socket") == "/tmp/a b\"c");
  CHECK(parsed->at("ok") == "false");
  CHECK(parsed->size() == 3);
}

TEST_CASE("ParseFlatJsonObject rejects malformed input with the offset") {
  CHECK(ParseFlatJsonObject("").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseFlatJsonObject("{\"a\":1").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseFlatJsonObject("{\"a\":{}}").status().message().find("nested") !=
        absl::string_view::npos);
  CHECK(ParseFlatJsonObject("{\"a\":1} x").status().message().find("trailing") !=
        absl::string_view::npos);
  CHECK(ParseFlatJsonObject(" { } ").ok());
}

}  // namespace
}  // namespace muster

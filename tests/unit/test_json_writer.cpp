// The JSON writer of --dry-run --json and --report-json: commas, nesting, escapes, exact integers and
// non-finite numbers as null.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <limits>

#include "app/json_writer.hpp"

using namespace piper;

TEST_CASE("json writer places commas between values and keys at every depth", "[json]") {
  JsonWriter w;
  w.begin_object().key("a").value(1).key("b").begin_array().value("x").begin_object().end_object().begin_array();
  w.end_array().value(true).null().end_array().key("c").begin_object().key("d").value(false).end_object();
  w.end_object();
  CHECK(w.str() == R"({"a":1,"b":["x",{},[],true,null],"c":{"d":false}})");
}

TEST_CASE("json writer keeps 64-bit integers exact and writes non-finite numbers as null", "[json]") {
  JsonWriter w;
  w.begin_array().value(uint64_t(18446744073709551615ull)).value(int64_t(-9007199254740993ll)).value(0.25);
  w.value(std::nan("")).value(std::numeric_limits<double>::infinity()).value(size_t(7)).end_array();
  CHECK(w.str() == "[18446744073709551615,-9007199254740993,0.25,null,null,7]");
}

TEST_CASE("json strings escape quotes, backslashes and control characters", "[json]") {
  CHECK(json_escape("plain") == "plain");
  CHECK(json_escape("a\"b\\c") == "a\\\"b\\\\c");
  CHECK(json_escape("line\nnext\ttab\x01") == "line\\nnext\\ttab\\u0001");
  JsonWriter w;
  w.begin_object().key("k\"ey").value(std::string("v\n")).key("raw").raw("{\"x\":1}").end_object();
  CHECK(w.str() == "{\"k\\\"ey\":\"v\\n\",\"raw\":{\"x\":1}}");
}

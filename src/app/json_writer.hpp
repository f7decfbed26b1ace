// A small JSON writer for piper's machine-readable reports (--dry-run --json, --report-json): objects,
// arrays, escaped strings, exact integers, and numbers whose non-finite values become null.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace piper {

// `s` as the inside of a JSON string: quotes, backslashes and control characters escaped.
std::string json_escape(const std::string& s);

// Builds one JSON text in order, placing the commas: inside an object, key() comes before every value.
//   JsonWriter w;
//   w.begin_object().key("rank").value(0).key("kinds").begin_array().value("a").end_array().end_object();
//   w.str() == R"({"rank":0,"kinds":["a"]})"
class JsonWriter {
 public:
  JsonWriter& begin_object();
  JsonWriter& end_object();
  JsonWriter& begin_array();
  JsonWriter& end_array();
  JsonWriter& key(const std::string& name);
  JsonWriter& value(const std::string& s);
  JsonWriter& value(const char* s);
  JsonWriter& value(bool b);
  JsonWriter& value(int v) { return raw(std::to_string(v)); }
  JsonWriter& value(long v) { return raw(std::to_string(v)); }
  JsonWriter& value(long long v) { return raw(std::to_string(v)); }
  JsonWriter& value(unsigned v) { return raw(std::to_string(v)); }
  JsonWriter& value(unsigned long v) { return raw(std::to_string(v)); }
  JsonWriter& value(unsigned long long v) { return raw(std::to_string(v)); }
  JsonWriter& value(double v);  // 9 significant digits; NaN and infinities: null
  JsonWriter& null();
  // An already formatted JSON value (an object another rank wrote, say), placed as one value.
  JsonWriter& raw(const std::string& json);

  // The text so far; complete once every object and array is closed.
  const std::string& str() const { return out_; }

 private:
  void before_value();
  JsonWriter& open(char bracket);   // '{' or '['
  JsonWriter& close(char bracket);  // '}' or ']'


  std::string out_;
  std::vector<bool> first_;  // per open object or array: nothing written in it yet
  bool after_key_ = false;
};

}  // namespace piper

// Typed, range-checked access to one TOML table. Each getter records the key as known; finish()
// rejects every key that no getter asked for. Errors name file:line:col, the key path, found and expected.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <toml++/toml.h>

#include "config/job.hpp"

namespace piper {

// Shared state of one load: file name and which key paths came from --set.
struct LoadContext {
  std::string file;
  // dotted key paths set on the command line, each with the key of the --set that set it ("job.steps" from
  // --set 'job={steps=3}' names "job")
  std::map<std::string, std::string> overridden;
  bool from_command_line(const std::string& key_path) const;
};

class TomlReader {
 public:
  TomlReader(const toml::table& table, std::string path, const LoadContext& ctx);

  bool has(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback, int64_t min, int64_t max);
  double get_float(const std::string& key, double fallback, double min, double max, bool min_exclusive = false);
  bool get_bool(const std::string& key, bool fallback);
  std::string get_string(const std::string& key, const std::string& fallback,
                         const std::vector<std::string>& allowed = {});
  const toml::node* get_node(const std::string& key);  // marks known; nullptr when absent
  // A reader of the sub-table `key` ([model.moe]); false when absent, an error when not a table.
  bool sub_table(const std::string& key, std::unique_ptr<TomlReader>& out);

  // Location of a key (or of this table when key is empty).
  SourceLoc loc(const std::string& key = "") const;
  std::string key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

  // Rejects keys nobody asked for, suggesting the nearest known one.
  void finish() const;

  [[noreturn]] void error(const std::string& key, const std::string& expected, const toml::node* found) const;
  [[noreturn]] void error_msg(const std::string& key, const std::string& message) const;

 private:
  const toml::table& table_;
  std::string path_;
  const LoadContext& ctx_;
  std::set<std::string> known_;
};

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(const std::string& a, const std::string& b);
// "integer -3", "string \"abc\"", "array of 2", ...
std::string describe_node(const toml::node* n);
// The shortest decimal text that reads back as exactly `x` ("10.0000001", "0.999999999", "1e-08").
std::string number_text(double x);
// Location of an arbitrary node (file:line:col), or the --set that created it.
SourceLoc node_loc(const toml::node* n, const std::string& key_path, const LoadContext& ctx);

}  // namespace piper

// Typed, range-checked access to TOML tables with precise error messages (see toml_reader.hpp).
#include "config/toml_reader.hpp"

#include <algorithm>
#include <cmath>
#include <charconv>

#include "util/error.hpp"

namespace piper {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string number_text(double x) {
  char b[40];
  const auto r = std::to_chars(b, b + sizeof b, x);  // the shortest text that reads back as x
  return std::string(b, r.ptr);
}

std::string describe_node(const toml::node* n) {
  if (!n) return "nothing";
  if (auto v = n->as_integer()) return cat("integer ", v->get());
  if (auto v = n->as_floating_point()) return cat("float ", number_text(v->get()));
  if (auto v = n->as_boolean()) return cat("boolean ", v->get() ? "true" : "false");
  if (auto v = n->as_string()) return cat("string \"", v->get(), "\"");
  if (auto v = n->as_array()) return cat("array of ", v->size());
  if (n->as_table()) return "table";
  return "date/time";
}

bool LoadContext::from_command_line(const std::string& key_path) const {
  for (const auto& [path, shown] : overridden)
    if (key_path == path || key_path.rfind(path + ".", 0) == 0) return true;
  return false;
}

SourceLoc node_loc(const toml::node* n, const std::string& key_path, const LoadContext& ctx) {
  for (const auto& [path, shown] : ctx.overridden)
    if (key_path == path || key_path.rfind(path + ".", 0) == 0) return SourceLoc{"--set " + shown, 0, 0};
  if (n && n->source().begin.line > 0)
    return SourceLoc{ctx.file, int(n->source().begin.line), int(n->source().begin.column)};
  return SourceLoc{ctx.file, 0, 0};
}

TomlReader::TomlReader(const toml::table& table, std::string path, const LoadContext& ctx)
    : table_(table), path_(std::move(path)), ctx_(ctx) {}

bool TomlReader::has(const std::string& key) const { return table_.contains(key); }

SourceLoc TomlReader::loc(const std::string& key) const {
  if (key.empty()) return node_loc(&table_, path_, ctx_);
  return node_loc(table_.get(key), key_path(key), ctx_);
}

void TomlReader::error(const std::string& key, const std::string& expected, const toml::node* found) const {
  throw UserError(cat(loc(key).str(), ": ", key_path(key), ": expected ", expected, ", found ",
                      describe_node(found)));
}

void TomlReader::error_msg(const std::string& key, const std::string& message) const {
  throw UserError(cat(loc(key).str(), ": ", key_path(key), ": ", message));
}

const toml::node* TomlReader::get_node(const std::string& key) {
  known_.insert(key);
  return table_.get(key);
}

bool TomlReader::sub_table(const std::string& key, std::unique_ptr<TomlReader>& out) {
  const toml::node* n = get_node(key);
  if (!n) return false;
  if (!n->as_table()) error(key, cat("a table ([", key_path(key), "])"), n);
  out = std::make_unique<TomlReader>(*n->as_table(), key_path(key), ctx_);
  return true;
}

int64_t TomlReader::get_int(const std::string& key, int64_t fallback, int64_t min, int64_t max) {
  const toml::node* n = get_node(key);
  if (!n) return fallback;
  auto expected = [&] {
    if (max == INT64_MAX) return cat("an integer >= ", min);
    return cat("an integer in [", min, ", ", max, "]");
  };
  auto v = n->as_integer();
  if (!v) error(key, expected(), n);
  if (v->get() < min || v->get() > max) error(key, expected(), n);
  return v->get();
}

double TomlReader::get_float(const std::string& key, double fallback, double min, double max,
                             bool min_exclusive) {
  const toml::node* n = get_node(key);
  if (!n) return fallback;
  auto expected = [&] {
    std::string lo = cat(min_exclusive ? "> " : ">= ", number_text(min));
    if (std::isinf(max)) return cat("a number ", lo);
    return cat("a number ", lo, " and <= ", number_text(max));
  };
  double x;
  if (auto f = n->as_floating_point()) x = f->get();
  else if (auto i = n->as_integer()) x = double(i->get());
  else error(key, expected(), n);
  if (!std::isfinite(x) || x < min || (min_exclusive && x == min) || x > max) error(key, expected(), n);
  return x;
}

bool TomlReader::get_bool(const std::string& key, bool fallback) {
  const toml::node* n = get_node(key);
  if (!n) return fallback;
  auto v = n->as_boolean();
  if (!v) error(key, "a boolean (true or false)", n);
  return v->get();
}

std::string TomlReader::get_string(const std::string& key, const std::string& fallback,
                                   const std::vector<std::string>& allowed) {
  const toml::node* n = get_node(key);
  if (!n) return fallback;
  std::string expected = "a string";
  if (!allowed.empty()) {
    expected = "one of";
    for (size_t i = 0; i < allowed.size(); ++i) expected += cat(i ? ", " : " ", "\"", allowed[i], "\"");
  }
  auto v = n->as_string();
  if (!v) error(key, expected, n);
  if (!allowed.empty() && std::find(allowed.begin(), allowed.end(), v->get()) == allowed.end())
    error(key, expected, n);
  return v->get();
}

void TomlReader::finish() const {
  for (const auto& [k, node] : table_) {
    std::string key(k.str());
    if (known_.count(key)) continue;
    std::string best;
    size_t best_d = 3;
    for (const auto& cand : known_) {
      size_t d = edit_distance(key, cand);
      if (d < best_d) { best_d = d; best = cand; }
    }
    std::string where = path_.empty() ? "at the top level" : cat("in [", path_, "]");
    std::string msg = cat(node_loc(&node, key_path(key), ctx_).str(), ": unknown key '", key_path(key), "' ", where);
    if (!best.empty()) msg += cat(" (did you mean '", key_path(best), "'?)");
    else {
      msg += "; known keys:";
      for (const auto& c : known_) msg += " " + c;
    }
    throw UserError(msg);
  }
}

}  // namespace piper

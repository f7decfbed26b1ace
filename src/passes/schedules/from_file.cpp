// kind = "file": per-rank action lists written by hand. TOML: one [[rank]] table per pipeline rank with
// `slots = ["F0.0", "F0.1", "B0.0", "F0.2 + B0.1", ...]` (PASS stage.microbatch; "+" joins actions of one
// slot, which may interleave). CSV: a header `rank,slot,pass,stage,mb`, one action per line; equal
// (rank, slot) pairs form one slot. Errors name the file and line.
#include <algorithm>
#include <charconv>
#include <climits>
#include <map>
#include <regex>
#include <sstream>

#include <toml++/toml.h>

#include "passes/schedules/schedules.hpp"
#include "util/error.hpp"
#include "util/input_file.hpp"

namespace piper {

namespace {

const std::vector<std::string> kPasses = {"F", "B", "BI", "BW"};

// A number of the file (`what`: "stage", "microbatch", ...): digits only, at most INT_MAX.
int parse_number(const std::string& text, const char* what, const std::string& where) {
  int v = 0;
  const auto r = std::from_chars(text.data(), text.data() + text.size(), v);
  if (text.empty() || text.find_first_not_of("0123456789") != std::string::npos || r.ec == std::errc::invalid_argument)
    throw UserError(cat(where, ": ", what, " must be a number >= 0, found '", text, "'"));
  if (r.ec == std::errc::result_out_of_range)
    throw UserError(cat(where, ": ", what, " ", text, " is out of range (at most ", INT_MAX, ")"));
  return v;
}

Action parse_action(const std::string& text, const std::string& where) {
  static const std::regex re(R"(\s*(F|B|BI|BW)\s*(\d+)\s*\.\s*(\d+)\s*)");
  std::smatch m;
  if (!std::regex_match(text, m, re))
    throw UserError(cat(where, ": '", text, "' is not an action; write PASS<stage>.<microbatch>, e.g. F0.3 or BW1.0"));
  return Action{m[1], parse_number(m[2], "stage", where), parse_number(m[3], "microbatch", where)};
}

std::vector<std::vector<Slot>> from_toml(const std::string& path, size_t pipeline_ranks) {
  const std::string text = read_input_file(path, "schedule file", kMaxScheduleFileBytes);
  toml::table root;
  try {
    root = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw UserError(cat(path, ":", e.source().begin.line, ":", e.source().begin.column, ": TOML syntax error: ",
                        e.description()));
  }
  const toml::array* ranks = root["rank"].as_array();
  if (!ranks || !ranks->is_array_of_tables() || ranks->empty())
    throw UserError(cat(path, ": expected [[rank]] tables, one per pipeline rank, each with slots = [...]"));
  std::vector<std::vector<Slot>> out;
  for (const auto& node : *ranks) {
    const toml::table& t = *node.as_table();
    if (out.size() == pipeline_ranks)
      throw UserError(cat(path, ":", t.source().begin.line, ": [[rank]] table ", out.size() + 1, ", but the pipeline has ",
                          pipeline_ranks, " rank", pipeline_ranks == 1 ? "" : "s", " (one [[rank]] table each)"));
    for (const auto& [k, v] : t)
      if (k.str() != "slots")
        throw UserError(cat(path, ":", v.source().begin.line, ": unknown key '", k.str(), "' in [[rank]] (only slots)"));
    const toml::array* slots = t["slots"].as_array();
    if (!slots) throw UserError(cat(path, ":", t.source().begin.line, ": [[rank]] needs slots = [\"F0.0\", ...]"));
    std::vector<Slot> rank;
    for (const auto& s : *slots) {
      std::string where = cat(path, ":", s.source().begin.line, ":", s.source().begin.column);
      if (!s.as_string()) throw UserError(cat(where, ": a slot is a string such as \"F0.2 + B1.0\""));
      Slot slot;
      std::stringstream ss(s.as_string()->get());
      std::string part;
      while (std::getline(ss, part, '+')) slot.push_back(parse_action(part, where));
      rank.push_back(std::move(slot));
    }
    out.push_back(std::move(rank));
  }
  return out;
}

std::vector<std::vector<Slot>> from_csv(const std::string& path, size_t pipeline_ranks) {
  std::istringstream in(read_input_file(path, "schedule file", kMaxScheduleFileBytes));
  std::string line;
  int lineno = 0;
  std::map<int, std::map<int, Slot>> ranks;  // rank → slot number → actions
  bool header = false;
  while (std::getline(in, line)) {
    ++lineno;
    line.erase(std::remove(line.begin(), line.end(), '\r'), line.end());
    if (line.empty() || line[0] == '#') continue;
    std::vector<std::string> f;
    std::stringstream ss(line);
    std::string cell;
    while (std::getline(ss, cell, ',')) f.push_back(cell);
    for (auto& c : f) c.erase(std::remove(c.begin(), c.end(), ' '), c.end());
    std::string where = cat(path, ":", lineno);
    if (!header) {
      if (f != std::vector<std::string>{"rank", "slot", "pass", "stage", "mb"})
        throw UserError(cat(where, ": the first line must be the header rank,slot,pass,stage,mb"));
      header = true;
      continue;
    }
    if (f.size() != 5) throw UserError(cat(where, ": expected 5 fields (rank,slot,pass,stage,mb), found ", f.size()));
    if (std::find(kPasses.begin(), kPasses.end(), f[2]) == kPasses.end())
      throw UserError(cat(where, ": pass must be F, B, BI or BW, found '", f[2], "'"));
    const int rank = parse_number(f[0], "rank", where);
    if (size_t(rank) >= pipeline_ranks)
      throw UserError(cat(where, ": rank ", rank, ", but the pipeline has ", pipeline_ranks, " rank",
                          pipeline_ranks == 1 ? "" : "s", " (0 to ", pipeline_ranks - 1, ")"));
    ranks[rank][parse_number(f[1], "slot", where)].push_back(
        Action{f[2], parse_number(f[3], "stage", where), parse_number(f[4], "mb", where)});
  }
  if (ranks.empty()) throw UserError(cat(path, ": no actions"));
  std::vector<std::vector<Slot>> out;
  for (auto& [r, slots] : ranks) {
    std::vector<Slot> rank;
    for (auto& [n, slot] : slots) rank.push_back(std::move(slot));
    out.push_back(std::move(rank));
  }
  return out;
}

}  // namespace

std::vector<std::vector<Slot>> file_slots(const std::string& path, size_t pipeline_ranks) {
  const bool csv = path.size() > 4 && path.substr(path.size() - 4) == ".csv";
  return csv ? from_csv(path, pipeline_ranks) : from_toml(path, pipeline_ranks);
}

}  // namespace piper

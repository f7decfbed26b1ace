// piper-ckpt (see tool.hpp): inspect, compare, verify, export and import checkpoints. Reading goes through
// CheckpointReader; verify through verify_checkpoint; import writes the same file piper's save writes.
#include "ckpt/tool.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <utility>

#include <nlohmann/json.hpp>

#include "ckpt/file_writer.hpp"
#include "ckpt/hf_config.hpp"
#include "ckpt/hf_names.hpp"
#include "ckpt/reader.hpp"
#include "ckpt/safetensors.hpp"
#include "ckpt/verify.hpp"
#include "config/load.hpp"
#include "data/data.hpp"
#include "model/family.hpp"
#include "util/byte_size.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"

namespace piper {

namespace fs = std::filesystem;

const char* ckpt_tool_usage() {
  return "usage: piper-ckpt COMMAND ...\n"
         "  ls FILE                          tensors with shapes and bytes, and the root attributes\n"
         "  show FILE NAME [--stats] [--slice A:B[,C:D]] [--all]\n"
         "                                   a tensor's values (NAME: params/wte, adam_m/wte, or wte for params/wte),\n"
         "                                   or with --stats its min, max, mean, std, norm and non-finite count\n"
         "  diff A B [--rtol R] [--atol T] [--only PREFIX]\n"
         "                                   per tensor the max abs difference and |a-b|/|b| (2-norms); the job lines\n"
         "                                   that differ; exit 1 where an element has |a-b| > T + R|b|\n"
         "                                   (default 0 and 0: any difference), or a tensor is missing or reshaped\n"
         "  verify FILE|DIR                  checksums, readable finite tensors, step = name; exit 1 if any fails\n"
         "  meta FILE                        the job text, layout, model and data the file was written with\n"
         "  export FILE --to OUT.safetensors|DIR [--dtype fp32|bf16] [--max-shard-size 5GB]\n"
         "                                   the parameters with Hugging Face names (GPT-2: GPT2LMHeadModel), as\n"
         "                                   float32 (default) or rounded to bfloat16; to DIR: a model folder for\n"
         "                                   from_pretrained (config.json, shards and their index past the size)\n"
         "  import IN.safetensors|INDEX.json|DIR --job JOB.toml [--set KEY=VALUE ...] --to OUT.h5\n"
         "                                   a step-0 checkpoint of JOB's model with these weights and fresh\n"
         "                                   optimizer state, to start a fine-tuning run with --resume OUT.h5\n"
         "exit codes: 0 done, 1 a difference or a damaged file found, 2 bad input\n";
}

namespace {

// A Hugging Face model folder at `dir` (which must not exist): config.json and the tensors, one file or shards of
// at most `max_shard` bytes each (a larger tensor alone in its shard) listed by model.safetensors.index.json.
// Written into a hidden sibling folder first and renamed, so `dir` appears complete or not at all.
void write_model_folder(const std::string& dir, const std::string& config, const std::vector<NamedTensor>& tensors,
                        const std::map<std::string, std::string>& meta, bool bf16, uint64_t max_shard) {
  const fs::path final_dir(dir), tmp = final_dir.parent_path() / ("." + final_dir.filename().string() + ".partial");
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) || ec)
    throw SystemError(cat("export: cannot create ", tmp.string(), ": ", ec.message()));
  try {
    const uint64_t width = bf16 ? 2 : 4;
    std::vector<std::vector<NamedTensor>> shards(1);
    uint64_t in_shard = 0, total = 0;
    for (const NamedTensor& t : tensors) {
      const uint64_t bytes = uint64_t(t.data.size()) * width;
      if (in_shard > 0 && in_shard + bytes > max_shard) shards.emplace_back(), in_shard = 0;
      shards.back().push_back(t);
      in_shard += bytes, total += bytes;
    }
    if (std::ofstream f(tmp / "config.json"); !(f << config).flush())
      throw SystemError(cat("export: cannot write ", (tmp / "config.json").string()));
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    for (size_t s = 0; s < shards.size(); ++s) {
      char name[64];
      std::snprintf(name, sizeof(name), "model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      const std::string file = shards.size() == 1 ? "model.safetensors" : name;
      write_safetensors((tmp / file).string(), shards[s], meta, bf16);
      for (const NamedTensor& t : shards[s]) weight_map[t.name] = file;
    }
    if (shards.size() > 1) {
      const nlohmann::ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
      if (std::ofstream f(tmp / "model.safetensors.index.json"); !(f << index.dump(2) << "\n").flush())
        throw SystemError(cat("export: cannot write ", (tmp / "model.safetensors.index.json").string()));
    }
    fs::rename(tmp, final_dir, ec);
    if (ec) throw SystemError(cat("export: cannot rename ", tmp.string(), " to ", dir, ": ", ec.message()));
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

// The tensors of what import is given: a .safetensors file; a model.safetensors.index.json (its shards, from its
// folder); or a model folder (its index, else its model.safetensors). A folder's config.json, where there is one,
// must describe the job's model: each key that disagrees is named (an error, exit 2).
SafetensorsFile read_model_files(const std::string& in, const std::vector<std::pair<std::string, std::string>>& keys) {
  std::error_code ec;
  fs::path index, folder;
  if (fs::is_directory(in, ec)) {
    folder = in;
    if (fs::exists(folder / "model.safetensors.index.json", ec)) index = folder / "model.safetensors.index.json";
    else if (!fs::exists(folder / "model.safetensors", ec))
      throw UserError(cat("import: ", in, ": a folder with neither model.safetensors nor model.safetensors.index.json"));
  } else if (in.size() >= 5 && in.compare(in.size() - 5, 5, ".json") == 0) {
    index = in;
    folder = fs::path(in).parent_path();
  } else {
    return read_safetensors(in);
  }
  if (const fs::path config = folder / "config.json"; fs::exists(config, ec)) {
    std::ifstream f(config);
    const std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    const std::vector<std::string> wrong = hf_config_mismatches(text, config.string(), keys);
    if (!wrong.empty()) {
      std::string all;
      for (const std::string& w : wrong) all += "\n  " + w;
      throw UserError(cat("import: the folder's config.json does not describe the job's model (fix the job or its ",
                          "--set):", all));
    }
  }
  if (index.empty()) return read_safetensors((folder / "model.safetensors").string());
  std::ifstream f(index);
  if (!f) throw UserError(cat("import: ", index.string(), ": cannot be read"));
  nlohmann::json doc;
  try {
    doc = nlohmann::json::parse(f);
  } catch (const nlohmann::json::exception& e) {  // a syntax error, or a number past what it holds
    throw UserError(cat("import: ", index.string(), ": not JSON (", e.what(), ")"));
  }
  if (!doc.is_object() || !doc.contains("weight_map") || !doc["weight_map"].is_object())
    throw UserError(cat("import: ", index.string(), ": no weight_map object"));
  std::map<std::string, std::string> file_of;  // tensor → shard, as the index says
  for (const auto& [name, file] : doc["weight_map"].items()) {
    if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
      throw UserError(cat("import: ", index.string(), ": weight_map['", name, "'] is not a file name in its folder"));
    file_of[name] = file.get<std::string>();
  }
  SafetensorsFile all;
  std::set<std::string> shards;
  for (const auto& [name, file] : file_of) shards.insert(file);
  for (const std::string& file : shards) {
    SafetensorsFile one = read_safetensors((folder / file).string());
    for (NamedTensor& t : one.tensors) {
      auto it = file_of.find(t.name);
      if (it == file_of.end() || it->second != file)
        throw UserError(cat("import: ", (folder / file).string(), ": tensor '", t.name, "' is not listed there by ",
                            index.string()));
      file_of.erase(it);
      all.tensors.push_back(std::move(t));
    }
  }
  if (!file_of.empty())
    throw UserError(cat("import: ", index.string(), ": tensor '", file_of.begin()->first, "' is in none of its shards"));
  return all;
}

// The lines of ckpt_tool_usage() that describe `cmd` (its synopsis and what follows it up to the next command), or
// "" for no such command.
std::string command_usage(const std::string& cmd) {
  std::istringstream all(ckpt_tool_usage());
  std::string line, out;
  bool in = false;
  while (std::getline(all, line)) {
    const bool synopsis = line.size() > 2 && line[0] == ' ' && line[1] == ' ' && line[2] != ' ';
    if (synopsis) in = line.compare(2, cmd.size() + 1, cmd + " ") == 0;
    if (in && (synopsis || line.rfind("   ", 0) == 0)) out += line + "\n";
  }
  return out;
}

// The lines of a and b that differ, as "- line" (only in a) and "+ line" (only in b), in order, from a longest common
// subsequence of lines; texts past 4,000 lines each are compared line by line at the same positions.
std::string line_diff(const std::string& a, const std::string& b) {
  auto lines = [](const std::string& t) {
    std::vector<std::string> v;
    std::istringstream in(t);
    for (std::string l; std::getline(in, l);) v.push_back(l);
    return v;
  };
  const std::vector<std::string> x = lines(a), y = lines(b);
  const size_t n = x.size(), m = y.size();
  std::string out;
  if (n > 4000 || m > 4000) {
    for (size_t i = 0; i < std::max(n, m); ++i) {
      if (i < n && i < m && x[i] == y[i]) continue;
      if (i < n) out += "- " + x[i] + "\n";
      if (i < m) out += "+ " + y[i] + "\n";
    }
    return out;
  }
  std::vector<std::vector<uint16_t>> common(n + 1, std::vector<uint16_t>(m + 1, 0));  // LCS of x[i:], y[j:]
  for (size_t i = n; i-- > 0;)
    for (size_t j = m; j-- > 0;)
      common[i][j] = x[i] == y[j] ? uint16_t(common[i + 1][j + 1] + 1) : std::max(common[i + 1][j], common[i][j + 1]);
  size_t i = 0, j = 0;
  while (i < n || j < m) {
    if (i < n && j < m && x[i] == y[j]) {
      ++i, ++j;
    } else if (j == m || (i < n && common[i + 1][j] >= common[i][j + 1])) {
      out += "- " + x[i++] + "\n";
    } else {
      out += "+ " + y[j++] + "\n";
    }
  }
  return out;
}

struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> options;  // --name value
  std::set<std::string> flags;                 // --name
  std::vector<std::string> sets;               // --set, in order
};

// Splits words into positionals, flags (those in `flag_names`) and options taking one value.
Args parse(const std::vector<std::string>& words, size_t from, const std::set<std::string>& flag_names,
           const std::set<std::string>& option_names) {
  Args a;
  for (size_t i = from; i < words.size(); ++i) {
    const std::string& w = words[i];
    if (w.rfind("--", 0) != 0) {
      a.positional.push_back(w);
      continue;
    }
    if (flag_names.count(w)) {
      a.flags.insert(w);
      continue;
    }
    if (!option_names.count(w)) throw UserError(cat(words[0], ": unknown option ", w));
    if (i + 1 >= words.size()) throw UserError(cat(words[0], ": ", w, " needs a value"));
    if (w == "--set") a.sets.push_back(words[++i]);
    else a.options[w] = words[++i];
  }
  return a;
}

void need_positionals(const Args& a, size_t n, const std::string& command, const char* what) {
  if (a.positional.size() != n)
    throw UserError(cat(command, ": expected ", what, ", got ", a.positional.size(), " argument(s)"));
}

double number_option(const Args& a, const std::string& name, double fallback) {
  auto it = a.options.find(name);
  if (it == a.options.end()) return fallback;
  try {
    size_t used = 0;
    double v = std::stod(it->second, &used);
    if (used != it->second.size() || !(v >= 0) || !std::isfinite(v)) throw std::invalid_argument("");
    return v;
  } catch (const std::exception&) {
    throw UserError(cat(name, " ", it->second, ": not a non-negative number"));
  }
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "(";
  for (size_t i = 0; i < s.size(); ++i) t += cat(i ? ", " : "", s[i]);
  return t + (s.size() == 1 ? ",)" : ")");
}

// "wte" names params/wte; a name with a group stays.
std::string tensor_path(const CheckpointReader& r, const std::string& name) {
  if (r.has_tensor(name)) return name;
  if (r.has_tensor("params/" + name)) return "params/" + name;
  throw UserError(cat(r.path(), ": no tensor '", name, "' (piper-ckpt ls ", r.path(), " lists them)"));
}

// The model family a checkpoint was written for, from its `model` attribute.
std::string model_kind(const CheckpointReader& r) {
  for (const auto& [k, v] : parse_model_keys_text(r.attribute("model")))
    if (k == "kind") return v;
  throw UserError(cat(r.path(), ": has no 'model' attribute naming its family (written by an older piper); ",
                      "export needs it"));
}

// Before a command reads values: the checks verify makes of the whole file (format, the name's step, every
// tensor's recorded block hashes and the checksum over them and the attributes), the tensors' data aside;
// each tensor read is then checked against its block hashes (CheckpointReader::read). A file verify
// fails is not shown as if it were sound.
void check_as_verify(const CheckpointReader& r) { verify_checkpoint(r.path(), "", /*read_data=*/false); }

int cmd_ls(const Args& a) {
  need_positionals(a, 1, "ls", "one checkpoint file");
  CheckpointReader r(a.positional[0]);
  std::printf("%s\n", r.path().c_str());
  std::printf("attributes:\n");
  for (const auto& at : r.attributes()) {
    std::string v = at.value;
    size_t lines = size_t(std::count(v.begin(), v.end(), '\n'));
    if (lines > 0) v = cat("(", lines + 1, " lines; piper-ckpt meta prints them)");
    std::printf("  %-16s %s\n", at.name.c_str(), v.c_str());
  }
  auto tensors = r.tensors();
  int64_t total = 0;
  std::set<std::string> dtypes;
  for (const auto& t : tensors) total += t.numel * t.element_bytes, dtypes.insert(t.dtype);
  std::string of;
  for (const std::string& d : dtypes) of += cat(of.empty() ? " of " : ", ", d);
  std::printf("tensors: %zu, %lld bytes%s\n", tensors.size(), static_cast<long long>(total), of.c_str());
  for (const auto& t : tensors)
    std::printf("  %-48s %-16s %-8s %12lld bytes\n", t.path.c_str(), shape_text(t.shape).c_str(), t.dtype.c_str(),
                static_cast<long long>(t.numel * t.element_bytes));
  return kExitOk;
}

// "A:B" (either end may be empty) → [begin, end) within n.
std::pair<int64_t, int64_t> parse_range(const std::string& s, int64_t n, const std::string& whole) {
  size_t colon = s.find(':');
  auto num = [&](const std::string& t, int64_t fallback) -> int64_t {
    if (t.empty()) return fallback;
    try {
      size_t used = 0;
      long long v = std::stoll(t, &used);
      if (used != t.size()) throw std::invalid_argument("");
      return v < 0 ? v + n : v;
    } catch (const std::exception&) {
      throw UserError(cat("--slice ", whole, ": '", t, "' is not an integer"));
    }
  };
  int64_t b = colon == std::string::npos ? num(s, 0) : num(s.substr(0, colon), 0);
  int64_t e = colon == std::string::npos ? b + 1 : num(s.substr(colon + 1), n);
  if (b < 0 || e > n || b >= e)
    throw UserError(cat("--slice ", whole, ": '", s, "' selects nothing of a dimension of size ", n));
  return {b, e};
}

int cmd_show(const Args& a) {
  need_positionals(a, 2, "show", "a checkpoint file and a tensor name");
  CheckpointReader r(a.positional[0]);
  check_as_verify(r);
  const std::string path = tensor_path(r, a.positional[1]);
  std::vector<int64_t> shape;
  for (const auto& t : r.tensors())
    if (t.path == path) shape = t.shape;
  std::vector<float> v = r.read(path);
  // As (rows, cols): a slice selects rows and, for 2-D and more, columns of the trailing dimensions.
  const int64_t rows = shape.empty() ? 1 : shape[0];
  const int64_t cols = rows == 0 ? 0 : int64_t(v.size()) / rows;
  int64_t r0 = 0, r1 = rows, c0 = 0, c1 = cols;
  if (auto it = a.options.find("--slice"); it != a.options.end()) {
    const std::string& s = it->second;
    size_t comma = s.find(',');
    std::tie(r0, r1) = parse_range(s.substr(0, comma), rows, s);
    if (comma != std::string::npos) {
      if (shape.size() < 2) throw UserError(cat("--slice ", s, ": '", path, "' has one dimension"));
      std::tie(c0, c1) = parse_range(s.substr(comma + 1), cols, s);
    }
  }
  std::vector<float> sel;
  for (int64_t i = r0; i < r1; ++i)
    for (int64_t j = c0; j < c1; ++j) sel.push_back(v[size_t(i * cols + j)]);
  std::printf("%s %s", path.c_str(), shape_text(shape).c_str());
  if (r0 != 0 || r1 != rows || c0 != 0 || c1 != cols)
    std::printf(" rows [%lld, %lld) cols [%lld, %lld)", (long long)r0, (long long)r1, (long long)c0, (long long)c1);
  std::printf("\n");
  if (a.flags.count("--stats")) {
    double mn = std::numeric_limits<double>::infinity(), mx = -mn, sum = 0, sq = 0;
    int64_t finite = 0, bad = 0;
    for (float x : sel) {
      if (!std::isfinite(x)) {
        ++bad;
        continue;
      }
      ++finite, mn = std::min(mn, double(x)), mx = std::max(mx, double(x)), sum += x, sq += double(x) * x;
    }
    const double mean = finite ? sum / double(finite) : 0, var = finite ? std::max(0.0, sq / double(finite) - mean * mean) : 0;
    std::printf("count %zu  min %.9g  max %.9g  mean %.9g  std %.9g  norm %.9g  non-finite %lld\n", sel.size(),
                finite ? mn : 0.0, finite ? mx : 0.0, mean, std::sqrt(var), std::sqrt(sq), static_cast<long long>(bad));
    return kExitOk;
  }
  const size_t limit = a.flags.count("--all") ? sel.size() : std::min<size_t>(sel.size(), 1000);
  const int64_t width = shape.size() >= 2 ? c1 - c0 : 8;  // a matrix row per line; vectors 8 a line
  for (size_t i = 0; i < limit; ++i)
    std::printf("%.9g%s", sel[i], (int64_t(i + 1) % width == 0 || i + 1 == limit) ? "\n" : " ");
  if (limit < sel.size())
    std::printf("... %zu more values (--all prints them, --slice selects some)\n", sel.size() - limit);
  return kExitOk;
}

int cmd_diff(const Args& a) {
  need_positionals(a, 2, "diff", "two checkpoint files");
  const double rtol = number_option(a, "--rtol", 0), atol = number_option(a, "--atol", 0);
  const std::string only = a.options.count("--only") ? a.options.at("--only") : "";
  CheckpointReader A(a.positional[0]), B(a.positional[1]);
  check_as_verify(A);
  check_as_verify(B);
  std::map<std::string, std::vector<int64_t>> sa, sb;
  for (const auto& t : A.tensors()) if (t.path.rfind(only, 0) == 0) sa[t.path] = t.shape;
  for (const auto& t : B.tensors()) if (t.path.rfind(only, 0) == 0) sb[t.path] = t.shape;
  std::set<std::string> all;
  for (auto& [k, _] : sa) all.insert(k);
  for (auto& [k, _] : sb) all.insert(k);
  int differing = 0;
  // rel: ‖a − b‖₂ / ‖b‖₂ over the tensor, which elements near zero cannot blow up (an elementwise ratio would)
  std::printf("%-48s %14s %14s %12s\n", "tensor", "max abs diff", "rel (norm)", "beyond tol");
  for (const std::string& p : all) {
    if (!sa.count(p) || !sb.count(p)) {
      std::printf("%-48s only in %s\n", p.c_str(), (sa.count(p) ? A : B).path().c_str());
      ++differing;
      continue;
    }
    if (sa[p] != sb[p]) {
      std::printf("%-48s shape %s against %s\n", p.c_str(), shape_text(sa[p]).c_str(), shape_text(sb[p]).c_str());
      ++differing;
      continue;
    }
    std::vector<float> x = A.read(p), y = B.read(p);
    double max_abs = 0, diff_sq = 0, ref_sq = 0;
    int64_t beyond = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      ref_sq += double(y[i]) * double(y[i]);
      const double d = std::fabs(double(x[i]) - double(y[i]));
      const bool same = x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]));
      if (same) continue;
      max_abs = std::max(max_abs, std::isnan(d) ? std::numeric_limits<double>::infinity() : d);
      diff_sq += std::isnan(d) ? std::numeric_limits<double>::infinity() : d * d;
      if (!(d <= atol + rtol * std::fabs(double(y[i])))) ++beyond;
    }
    const double rel = diff_sq == 0  ? 0
                       : ref_sq > 0 ? std::sqrt(diff_sq / ref_sq)
                                    : std::numeric_limits<double>::infinity();
    if (beyond) ++differing;
    std::printf("%-48s %14.6g %14.6g %12lld\n", p.c_str(), max_abs, rel, static_cast<long long>(beyond));
  }
  std::map<std::string, std::string> b_attrs;
  for (const auto& at : B.attributes()) b_attrs[at.name] = at.value;
  for (const auto& at : A.attributes()) {
    if (at.name == "checksum") continue;
    const std::string other = b_attrs.count(at.name) ? b_attrs.at(at.name) : "<absent>";
    if (other == at.value) continue;
    if (at.value.find('\n') == std::string::npos && other.find('\n') == std::string::npos) {
      std::printf("attribute %s: %s against %s\n", at.name.c_str(), at.value.c_str(), other.c_str());
      continue;
    }
    std::printf("attribute %s differs (- %s, + %s):\n%s", at.name.c_str(), A.path().c_str(), B.path().c_str(),
                line_diff(at.value, other).c_str());
  }
  std::printf("%d of %zu tensors differ beyond atol %g + rtol %g * |b|\n", differing, all.size(), atol, rtol);
  return differing ? kExitFailure : kExitOk;
}

int cmd_verify(const Args& a) {
  need_positionals(a, 1, "verify", "a checkpoint file or folder");
  const std::string target = a.positional[0];
  std::error_code ec;
  std::vector<std::string> files;
  if (fs::is_directory(target, ec)) {
    for (const auto& e : fs::directory_iterator(target, ec)) {
      const std::string n = e.path().filename().string();
      if (n.rfind("step_", 0) == 0 && n.size() > 8 && n.substr(n.size() - 3) == ".h5") files.push_back(e.path().string());
    }
    std::sort(files.begin(), files.end());
    if (files.empty()) throw UserError(cat(target, ": no step_*.h5 checkpoint in this folder"));
  } else if (fs::exists(target, ec)) {
    files.push_back(target);
  } else {
    throw UserError(cat(target, ": no such file or folder"));
  }
  int bad = 0;
  for (const std::string& f : files) {
    try {
      CheckpointInfo info = verify_checkpoint(f);
      std::printf("ok    %s  step %lld, format version %lld%s\n", f.c_str(), static_cast<long long>(info.step),
                  static_cast<long long>(info.format_version), info.checksummed ? ", checksum matches" : ", no checksum");
    } catch (const UserError& e) {
      std::printf("FAIL  %s\n", e.what());
      ++bad;
    }
  }
  if (files.size() > 1) std::printf("%zu of %zu checkpoints verify\n", files.size() - size_t(bad), files.size());
  return bad ? kExitFailure : kExitOk;
}

int cmd_meta(const Args& a) {
  need_positionals(a, 1, "meta", "one checkpoint file");
  CheckpointReader r(a.positional[0]);
  for (const char* k : {"step", "seed", "sampler", "job_name", "layout", "model", "data_path", "data_bytes", "data_hash"})
    std::printf("%-10s %s\n", k, r.attribute(k, "<absent>").c_str());
  std::printf("job:\n%s", r.attribute("job", "<absent>").c_str());
  const std::string job = r.attribute("job");
  if (!job.empty() && job.back() != '\n') std::printf("\n");
  return kExitOk;
}

// --to OUT.safetensors: one file. --to DIR: a Hugging Face model folder, written under a temporary name and
// renamed when complete: config.json, and model.safetensors or, past --max-shard-size, numbered shards with
// model.safetensors.index.json. Neither ever replaces something that exists.
int cmd_export(const Args& a) {
  need_positionals(a, 1, "export", "one checkpoint file");
  if (!a.options.count("--to"))
    throw UserError("export: --to OUT.safetensors (a file) or --to DIR (a model folder) is required");
  const std::string dtype = a.options.count("--dtype") ? a.options.at("--dtype") : "fp32";
  if (dtype != "fp32" && dtype != "bf16")
    throw UserError(cat("export: --dtype ", dtype, ": expected fp32 or bf16"));
  const uint64_t max_shard = parse_byte_size(a.options.count("--max-shard-size") ? a.options.at("--max-shard-size")
                                                                                 : "5GB", "export: --max-shard-size");
  const std::string to = a.options.at("--to");
  std::error_code ec;
  if (fs::exists(to, ec) || fs::is_symlink(to, ec))
    throw UserError(cat("export: --to ", to, ": exists already (piper-ckpt never overwrites)"));
  CheckpointReader r(a.positional[0]);
  check_as_verify(r);
  const std::string kind = model_kind(r);
  const bool folder = to.size() < 12 || to.compare(to.size() - 12, 12, ".safetensors") != 0;
  std::vector<std::string> notes;
  const std::string config =
      folder ? hf_config_json(parse_model_keys_text(r.attribute("model")), dtype == "bf16" ? "bfloat16" : "float32",
                              notes)
             : "";
  std::vector<NamedTensor> out;
  for (const auto& t : r.tensors()) {
    if (t.path.rfind("params/", 0) != 0) continue;
    NamedTensor p{t.path.substr(7), t.shape, r.read(t.path)};
    out.push_back(to_hf(kind, p));
  }
  std::sort(out.begin(), out.end(), [](const NamedTensor& x, const NamedTensor& y) { return x.name < y.name; });
  const std::map<std::string, std::string> meta = {
      {"format", "pt"}, {"piper_model", r.attribute("model")}, {"piper_step", r.attribute("step")}};
  const bool bf16 = dtype == "bf16";
  if (!folder) {
    write_safetensors(to, out, meta, bf16);
  } else {
    write_model_folder(to, config, out, meta, bf16, max_shard);
  }
  for (const std::string& n : notes) std::printf("note: %s\n", n.c_str());
  std::printf("exported %zu tensors of %s (model %s) to %s%s as %s\n", out.size(), r.path().c_str(), kind.c_str(),
              to.c_str(), folder ? " (a Hugging Face model folder)" : "", bf16 ? "bfloat16" : "float32");
  return kExitOk;
}

int cmd_import(const Args& a) {
  need_positionals(a, 1, "import", "one safetensors file, index or model folder");
  if (!a.options.count("--job")) throw UserError("import: --job JOB.toml is required (it names the model)");
  if (!a.options.count("--to")) throw UserError("import: --to OUT.h5 is required");
  const std::string in = a.positional[0], out = a.options.at("--to");
  const std::string out_name = fs::path(out).filename().string();
  if (out_name.rfind("step_", 0) == 0 && out_name != "step_00000000.h5")
    throw UserError(cat("import: --to ", out, ": an imported checkpoint is step 0; name it step_00000000.h5 or give ",
                        "it a name that does not start with step_"));
  std::error_code ec;
  if (fs::exists(out, ec)) throw UserError(cat("import: --to ", out, ": exists already (piper-ckpt never overwrites)"));
  JobSpec spec = load_job(a.options.at("--job"), a.sets);
  const Family* family = find_family(spec.model.kind);
  PIPER_CHECK(family, "no family ", spec.model.kind);
  const Model model = family->build(spec.model);
  std::map<std::string, const ParamSpec*> wanted;
  for (const ParamSpec& p : model.params) wanted[p.name] = &p;
  const bool tied_head = !wanted.count("lm_head.weight");
  SafetensorsFile st = read_model_files(in, model_key_values(spec.model));
  std::map<std::string, NamedTensor> got;
  std::vector<std::string> unknown;
  for (const NamedTensor& t : st.tensors) {
    NamedTensor p = from_hf(spec.model.kind, t, tied_head);
    if (p.name.empty()) continue;
    if (!wanted.count(p.name)) {
      unknown.push_back(t.name);
      continue;
    }
    const ParamSpec& ps = *wanted.at(p.name);
    if (p.shape != ps.shape)
      throw UserError(cat(in, ": tensor '", t.name, "' has shape ", shape_text(p.shape), " as piper's '", p.name,
                          "' but ", spec.path, "'s model needs ", shape_text(ps.shape)));
    for (size_t i = 0; i < p.data.size(); ++i)
      if (!std::isfinite(p.data[i]))
        throw UserError(cat(in, ": tensor '", t.name, "' holds a non-finite value at element ", i));
    got[p.name] = std::move(p);
  }
  if (!unknown.empty()) {
    std::string list;
    for (size_t i = 0; i < unknown.size() && i < 8; ++i) list += cat(i ? ", " : "", unknown[i]);
    throw UserError(cat(in, ": ", unknown.size(), " tensor(s) that ", spec.path, "'s model (", spec.model.kind,
                        ") does not have: ", list, unknown.size() > 8 ? ", ..." : ""));
  }
  std::vector<std::string> missing;
  for (const ParamSpec& p : model.params)
    if (!got.count(p.name)) missing.push_back(p.name);
  if (!missing.empty()) {
    std::string list;
    for (size_t i = 0; i < missing.size() && i < 8; ++i) list += cat(i ? ", " : "", missing[i]);
    throw UserError(cat(in, ": lacks ", missing.size(), " parameter(s) of ", spec.path, "'s model: ", list,
                        missing.size() > 8 ? ", ..." : ""));
  }
  CheckpointHeader h;
  h.step = 0;
  h.job_name = spec.job.name;
  h.job_text = spec.text;
  h.layout = cat("imported from ", fs::path(in).filename().string());
  h.record.has_seed = true;
  h.record.seed = int64_t(spec.job.seed);
  h.record.sampler = spec.data.sampler;
  h.record.model = model_keys_text(spec.model);
  if (family->reads_tokens) {
    FileIdentity id = file_identity(spec.data.path);
    h.record.has_data = true, h.record.data_path = spec.data.path, h.record.data_bytes = id.bytes,
    h.record.data_hash = id.hash;
  }
  // Written like a save: a temporary file, fsync, verify, rename; fresh (zero) AdamW moments.
  CheckpointFileWriter file(out, h);
  for (int g = 0; g < 3; ++g)
    for (const ParamSpec& p : model.params) {
      std::vector<float> zeros;
      const float* data = got.at(p.name).data.data();
      if (g > 0) zeros.assign(size_t(p.numel), 0.f), data = zeros.data();
      file.tensor(g, p.name, p.shape, data, size_t(p.numel));
    }
  if (int code = file.finish()) {
    std::fprintf(stderr, "piper-ckpt: error: %s not written: %s\n", out.c_str(), file.failure().c_str());
    return code;
  }
  std::printf("imported %zu parameters of %s into %s (step 0, fresh optimizer state) for %s\n", got.size(),
              in.c_str(), out.c_str(), spec.path.c_str());
  return kExitOk;
}

}  // namespace

int ckpt_tool(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    std::printf("%s", ckpt_tool_usage());
    return args.empty() ? kExitBadInput : kExitOk;
  }
  std::vector<std::string> words = args;
  const std::string cmd = words[0];
  if (std::find(words.begin() + 1, words.end(), "--help") != words.end() ||
      std::find(words.begin() + 1, words.end(), "-h") != words.end()) {
    const std::string usage = command_usage(cmd);
    if (usage.empty()) throw UserError(cat("unknown command '", cmd, "' (ls, show, diff, verify, meta, export, import)"));
    std::printf("usage: piper-ckpt %s", usage.c_str() + 2);
    return kExitOk;
  }
  if (cmd == "ls") return cmd_ls(parse(words, 1, {}, {}));
  if (cmd == "show") return cmd_show(parse(words, 1, {"--stats", "--all"}, {"--slice"}));
  if (cmd == "diff") return cmd_diff(parse(words, 1, {}, {"--rtol", "--atol", "--only"}));
  if (cmd == "verify") return cmd_verify(parse(words, 1, {}, {}));
  if (cmd == "meta") return cmd_meta(parse(words, 1, {}, {}));
  if (cmd == "export") return cmd_export(parse(words, 1, {}, {"--to", "--dtype", "--max-shard-size"}));
  if (cmd == "import") return cmd_import(parse(words, 1, {}, {"--to", "--job", "--set"}));
  throw UserError(cat("unknown command '", cmd, "' (ls, show, diff, verify, meta, export, import)"));
}

}  // namespace piper

// Job file loading: TOML parse, --set overrides, then section-by-section validation into a JobSpec.
// Cross-key rules (heads divide d_model, annotation ranges inside the model) are checked here too.
#include "config/load.hpp"

#include <filesystem>
#include <map>
#include <regex>
#include <sstream>

#include "config/toml_reader.hpp"
#include "config/model_families.hpp"
#include "util/error.hpp"
#include "util/input_file.hpp"

namespace piper {

namespace {

const std::vector<std::string> kScheduleKinds = {"gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipev", "file"};

std::vector<std::string> split_dots(const std::string& s) {
  std::vector<std::string> parts;
  std::stringstream ss(s);
  std::string p;
  while (std::getline(ss, p, '.')) parts.push_back(p);
  return parts;
}

// An array index of a key path ("3"): digits only, at most 9 of them (no array is larger, and std::stoul
// would throw past unsigned long); false otherwise.
bool parse_index(const std::string& s, size_t& index) {
  if (s.empty() || s.size() > 9 || s.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoul(s);
  return true;
}

// Sets `key` of `table` to `value` and records the key path it sets, with the --set key that set it. A table
// value given to a table of the job's sections ([job], [model.moe], ...: `merge`) merges into it key by key, so
// that --set 'job={steps=3}' is --set job.steps=3 and the other keys of [job] stay as they are.
void set_key(toml::table& table, const std::string& key, toml::node&& value, const std::string& path, bool merge,
             const std::string& shown, std::map<std::string, std::string>& overridden) {
  toml::node* old = table.get(key);
  if (merge && old && old->as_table() && value.as_table()) {
    for (auto&& [k, v] : *value.as_table())
      set_key(*old->as_table(), std::string(k.str()), std::move(v), cat(path, ".", k.str()), true, shown, overridden);
    return;
  }
  table.insert_or_assign(key, std::move(value));
  overridden[path] = shown;
}

// Applies one "--set a.b.c=value" to the parsed document, recording the key paths it sets. Value is TOML
// ("4", "\"x\"", "[1,2]", "{steps = 3}"), or a bare string when it does not parse as TOML. Inside arrays
// ([[directive]], [[annotate]]) a value replaces what was there.
void apply_override(toml::table& root, const std::string& arg, std::map<std::string, std::string>& overridden) {
  auto eq = arg.find('=');
  if (eq == std::string::npos || eq == 0)
    throw UserError(cat("--set ", arg, ": expected key.path=value (e.g. --set model.n_layers=4)"));
  std::string key = arg.substr(0, eq), text = arg.substr(eq + 1);
  auto parts = split_dots(key);
  for (const auto& p : parts)
    if (p.empty()) throw UserError(cat("--set ", arg, ": empty component in key path '", key, "'"));

  toml::table parsed;
  try {
    parsed = toml::parse("v = " + text);
  } catch (const toml::parse_error&) {
    parsed = toml::table{};
    parsed.insert("v", text);
  }
  toml::node* cur = &root;
  bool sections = true;  // every step so far went through a table, none through an array
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (auto* t = cur->as_table()) {
      if (!t->contains(parts[i])) t->insert(parts[i], toml::table{});
      cur = t->get(parts[i]);
    } else if (auto* a = cur->as_array()) {
      size_t index = 0;
      if (!parse_index(parts[i], index) || index >= a->size())
        throw UserError(cat("--set ", arg, ": '", parts[i], "' is not an index of the ", a->size(),
                            "-element array before it"));
      cur = a->get(index);
      sections = false;
    } else {
      throw UserError(cat("--set ", arg, ": '", parts[i - 1], "' is not a table"));
    }
  }
  const std::string& last = parts.back();
  toml::node* v = parsed.get("v");
  if (auto* t = cur->as_table()) {
    set_key(*t, last, std::move(*v), key, sections, key, overridden);
  } else if (auto* a = cur->as_array()) {
    size_t index = 0;
    if (!parse_index(last, index) || index >= a->size())
      throw UserError(cat("--set ", arg, ": '", last, "' is not an index of the array before it"));
    a->replace(a->cbegin() + long(index), std::move(*v));
    overridden[key] = key;
  } else {
    throw UserError(cat("--set ", arg, ": the key before '", last, "' is not a table"));
  }
}

const toml::table* section(TomlReader& top, const std::string& name) {
  const toml::node* n = top.get_node(name);
  if (!n) return nullptr;
  if (!n->as_table()) top.error(name, "a table ([" + name + "])", n);
  return n->as_table();
}

// {PP = 0, MB = "*", PASS = "B"}
Filter parse_filter(const toml::node* n, const std::string& key_path, const LoadContext& ctx) {
  Filter f;
  const toml::table* t = n ? n->as_table() : nullptr;
  if (!t)
    throw UserError(cat(node_loc(n, key_path, ctx).str(), ": ", key_path,
                        ": expected a filter table such as { PP = 0, MB = \"*\" }, found ", describe_node(n)));
  for (const auto& [k, v] : *t) {
    std::string tag(k.str());
    TagMatch m;
    std::string where = cat(node_loc(&v, key_path + "." + tag, ctx).str(), ": ", key_path, ".", tag);
    if (auto i = v.as_integer()) {
      if (i->get() < 0) throw UserError(cat(where, ": expected a tag value >= 0 or \"*\", found ", describe_node(&v)));
      m.kind = TagMatch::Kind::Int;
      m.value = i->get();
    } else if (auto s = v.as_string()) {
      if (s->get() == "*") m.kind = TagMatch::Kind::Any;
      else if (tag == "PASS") {
        static const std::vector<std::string> passes = {"F", "B", "BI", "BW"};
        if (std::find(passes.begin(), passes.end(), s->get()) == passes.end())
          throw UserError(cat(where, ": expected one of \"F\", \"B\", \"BI\", \"BW\" or \"*\", found ", describe_node(&v)));
        m.kind = TagMatch::Kind::Name;
        m.name = s->get();
      } else {
        throw UserError(cat(where, ": expected an integer tag value or \"*\", found ", describe_node(&v)));
      }
    } else {
      throw UserError(cat(where, ": expected an integer tag value or \"*\", found ", describe_node(&v)));
    }
    f.match[tag] = m;
  }
  return f;
}

void load_job_section(TomlReader& r, JobSection& j) {
  j.name = r.get_string("name", j.name);
  if (j.name.find_first_not_of(" \t") == std::string::npos)
    r.error("name", "a non-empty name for the run (it heads the output and the checkpoints)", r.get_node("name"));
  j.steps = r.get_int("steps", j.steps, 1, INT64_MAX);
  j.seed = uint64_t(r.get_int("seed", int64_t(j.seed), 0, INT64_MAX));
  j.backend = r.get_string("backend", j.backend, {"cpu", "cuda"});
  j.precision = r.get_string("precision", j.precision, {"fp32", "bf16"});
  j.grad_reduce = r.get_string("grad_reduce", j.grad_reduce, {"fp32", "bf16"});
  j.threads = int(r.get_int("threads", j.threads, 0, 1024));
  j.watchdog_s = r.get_float("watchdog_s", j.watchdog_s, 0, 1e9);
  j.log_every = r.get_int("log_every", j.log_every, 1, INT64_MAX);
  j.peak_tflops = r.get_float("peak_tflops", j.peak_tflops, 0, 1e6);
  j.on_nonfinite = r.get_string("on_nonfinite", j.on_nonfinite, {"stop", "skip"});
  j.max_skipped = r.get_int("max_skipped", j.max_skipped, 1, INT64_MAX);
  r.finish();
}

void load_model(TomlReader& r, ModelSpec& m) {
  m.kind = r.get_string("kind", m.kind, model_family_reader_kinds());
  find_model_family_reader(m.kind)->read_keys(r, m);
  r.finish();
}

void load_data(TomlReader& r, DataSpec& d, const ModelSpec& m) {
  d.path = r.get_string("path", d.path);
  d.batch = int(r.get_int("batch", d.batch, 1, 1 << 24));
  d.sampler = r.get_string("sampler", d.sampler, {"random", "sequential"});
  d.token_bytes = int(r.get_int("token_bytes", d.token_bytes, 0, 4));
  if (d.token_bytes == 3) r.error_msg("token_bytes", "expected 1, 2 or 4 bytes per token id (or 0: by the file name)");
  r.finish();
  if (find_model_family_reader(m.kind)->reads_tokens) {
    if (d.path.empty())
      throw UserError(cat(r.loc().str(), ": data.path: expected the path of a token file for model.kind = \"", m.kind,
                          "\", found nothing"));
    const std::string why = not_regular_file(d.path);
    if (why == "does not exist")
      r.error_msg("path", cat("no readable file '", d.path, "' (relative to ", std::filesystem::current_path().string(),
                              "); run `make data` or tools/prepare-data.sh to build the default corpus"));
    if (!why.empty()) r.error_msg("path", cat("'", d.path, "' ", why, "; a token file must be one"));
  } else if (!d.path.empty()) {
    r.error_msg("path", cat("model.kind = \"", m.kind, "\" trains on synthetic data; remove data.path"));
  }
}

void load_eval(TomlReader& r, EvalSpec& e, const ModelSpec& m) {
  e.path = r.get_string("path", "");
  e.every = r.get_int("every", e.every, 1, INT64_MAX);
  e.batches = r.get_int("batches", e.batches, 1, 1 << 20);
  r.finish();
  if (!find_model_family_reader(m.kind)->reads_tokens)
    throw UserError(cat(r.loc().str(), ": [eval]: model.kind = \"", m.kind, "\" trains on synthetic data; an ",
                        "evaluation needs a token file"));
  if (e.path.empty())
    throw UserError(cat(r.loc().str(), ": eval.path: expected the path of a validation token file (",
                        "tools/text-to-tokens.py writes STEM.val.u16.bin), found nothing"));
  const std::string why = not_regular_file(e.path);
  if (!why.empty()) r.error_msg("path", cat("'", e.path, "' ", why == "does not exist" ? "cannot be read" : why,
                                           "; a validation token file must be one"));
}

void load_optimizer(TomlReader& r, OptimizerSpec& o) {
  o.kind = r.get_string("kind", o.kind, {"adamw"});
  o.lr = r.get_float("lr", o.lr, 0.0, 10.0, true);
  o.min_lr = r.get_float("min_lr", o.min_lr, 0.0, 10.0);
  o.beta1 = r.get_float("beta1", o.beta1, 0.0, 0.999999);
  o.beta2 = r.get_float("beta2", o.beta2, 0.0, 0.999999999);
  o.eps = r.get_float("eps", o.eps, 0.0, 1.0, true);
  o.weight_decay = r.get_float("weight_decay", o.weight_decay, 0.0, 10.0);
  o.grad_clip = r.get_float("grad_clip", o.grad_clip, 0.0, INFINITY);
  o.warmup_steps = r.get_int("warmup_steps", o.warmup_steps, 0, INT64_MAX);
  o.decay_steps = r.get_int("decay_steps", o.decay_steps, 0, INT64_MAX);
  const std::string schedule = r.get_string("schedule", lr_schedule_name(o.schedule), {"cosine", "linear", "constant", "wsd"});
  for (LrSchedule s : {LrSchedule::Cosine, LrSchedule::Linear, LrSchedule::Constant, LrSchedule::Wsd})
    if (schedule == lr_schedule_name(s)) o.schedule = s;
  const bool fraction_given = r.get_node("decay_fraction") != nullptr;
  o.decay_fraction = r.get_float("decay_fraction", o.decay_fraction, 0.0, 1.0);
  if (fraction_given && o.schedule != LrSchedule::Wsd)
    r.error_msg("decay_fraction", cat("decay_fraction is the decay phase of schedule = \"wsd\"; this schedule is \"",
                                      schedule, "\""));
  if (o.min_lr > o.lr) r.error_msg("min_lr", cat("min_lr (", number_text(o.min_lr), ") must not exceed lr (", number_text(o.lr), ")"));
  r.finish();
}

// The settings --resume compares with the checkpoint, named as checkpoint.allow_changes names them.
std::vector<std::string> resume_settings() {
  std::vector<std::string> names = {"job.seed", "data.sampler", "data.path"};
  for (const std::string& k : model_family_reader_keys()) names.push_back("model." + k);
  return names;
}

void load_checkpoint(TomlReader& r, CheckpointSpec& c, const LoadContext& ctx) {
  c.dir = r.get_string("dir", c.dir);
  c.every = r.get_int("every", c.every, 0, INT64_MAX);
  c.keep = int(r.get_int("keep", c.keep, 0, 1 << 20));
  c.async = r.get_bool("async", c.async);
  if (const toml::node* n = r.get_node("allow_changes")) {
    const toml::array* a = n->as_array();
    if (!a) r.error("allow_changes", "an array of setting names such as [\"job.seed\", \"data.path\"]", n);
    const std::vector<std::string> known = resume_settings();
    for (size_t i = 0; i < a->size(); ++i) {
      const toml::node* e = a->get(i);
      const std::string kp = cat(r.key_path("allow_changes"), "[", i, "]");
      // the element's line and column, or the --set that wrote the array
      const std::string where = cat(node_loc(e, r.key_path("allow_changes"), ctx).str(), ": ", kp, ": ");
      const std::string expected =
          "expected \"job.seed\", \"data.sampler\", \"data.path\" or \"model.KEY\" for a key of [model] "
          "(\"model.d_ff\", \"model.moe.top_k\", ...)";
      const auto* s = e->as_string();
      if (!s) throw UserError(cat(where, expected, ", found ", describe_node(e)));
      if (std::find(known.begin(), known.end(), s->get()) == known.end()) {
        std::string best;
        size_t best_d = 3;
        for (const auto& k : known)
          if (size_t d = edit_distance(s->get(), k); d < best_d) { best_d = d; best = k; }
        throw UserError(cat(where, "unknown setting \"", s->get(), "\"",
                            best.empty() ? cat("; ", expected) : cat(" (did you mean \"", best, "\"?)")));
      }
      c.allow_changes.push_back(s->get());
    }
  }
  r.finish();
  // An empty dir given by --set turns checkpoints off whatever the job file's `every` says; anything else
  // that asks for checkpoints every N steps without a folder to write them to is a mistake.
  const bool off_switch = r.has("dir") && ctx.from_command_line(r.key_path("dir")) &&
                          !ctx.from_command_line(r.key_path("every"));
  if (c.every > 0 && c.dir.empty() && !off_switch) {
    const std::string dir = r.has("dir") ? cat("is empty (", r.loc("dir").str(), ")") : "is not given";
    r.error_msg("every", cat("a checkpoint every ", c.every, " steps needs a folder, but checkpoint.dir ", dir,
                             ": give checkpoint.dir a folder, or set checkpoint.every = 0 (or remove it) for none"));
  }
}

void load_mesh(TomlReader& r, MeshSpec& m) {
  m.present = true;
  m.loc = r.loc();
  m.pp = int(r.get_int("pp", 1, 1, 1 << 20));
  m.dp = int(r.get_int("dp", 1, 1, 1 << 24));
  m.microbatches = int(r.get_int("microbatches", 0, 0, 1 << 20));
  m.zero = int(r.get_int("zero", 0, 0, 3));
  m.bucket_mb = r.get_float("bucket_mb", 25.0, 0.0, 1e6, true);
  m.grad_buckets_in_flight = int(r.get_int("grad_buckets_in_flight", 2, 1, 1 << 20));
  m.ep = int(r.get_int("ep", 1, 1, 1 << 24));
  m.tp = int(r.get_int("tp", 1, 1, 1 << 20));
  m.chunks = int(r.get_int("chunks", 1, 1, 1 << 16));
  m.sequence = r.get_bool("sequence", false);
  if (m.sequence && m.tp < 2) r.error_msg("sequence", "sequence = true splits the activations over a tensor-parallel group: set tp >= 2");
  m.schedule = r.get_string("schedule", "", kScheduleKinds);
  m.recompute = r.get_string("recompute", "", {"none", "full", "selective"});
  if (m.chunks > 1 && m.schedule != "interleaved-1f1b")
    r.error_msg("chunks", cat("chunks = ", m.chunks, " stages per pipeline rank need schedule = \"interleaved-1f1b\""));
  r.finish();
}

void load_cost(TomlReader& r, CostSpec& c) {
  c.present = true;
  c.preset_given = r.get_node("preset") != nullptr;
  c.preset = r.get_string("preset", c.preset, {"cpu", "h100", "h200"});
  c.flops = r.get_float("flops", 0, 0, INFINITY);
  c.p2p_bandwidth = r.get_float("p2p_bandwidth", 0, 0, INFINITY);
  c.collective_bandwidth = r.get_float("collective_bandwidth", 0, 0, INFINITY);
  c.latency = r.get_float("latency", 0, 0, INFINITY);
  c.uniform = r.get_bool("uniform", false);
  r.finish();
}

const toml::array* array_of_tables(TomlReader& top, const std::string& name) {
  const toml::node* n = top.get_node(name);
  if (!n) return nullptr;
  const toml::array* a = n->as_array();
  if (!a || !a->is_array_of_tables()) top.error(name, cat("an array of tables ([[", name, "]])"), n);
  return a;
}

void load_annotations(const toml::array& arr, JobSpec& spec, const LoadContext& ctx) {
  int index = 0;
  for (const auto& node : arr) {
    std::string path = cat("annotate.", index);
    TomlReader r(*node.as_table(), path, ctx);
    Annotation a;
    a.index = index;
    a.loc = r.loc();
    const toml::node* tag = r.get_node("tag");
    if (!tag || !tag->as_string()) r.error("tag", "a tag name such as \"PP\"", tag);
    a.tag = tag->as_string()->get();
    if (!std::regex_match(a.tag, std::regex("[A-Z][A-Z0-9_]*")))
      r.error("tag", "an upper-case tag name such as \"PP\"", tag);
    if (a.tag == "PASS" || a.tag == "MB") r.error_msg("tag", cat("'", a.tag, "' is reserved for the compiler"));
    const toml::node* seg_node = r.get_node("segments");
    const toml::node* layers = r.get_node("layers");
    if (seg_node && layers) r.error_msg("segments", "give either layers or segments, not both");
    if (seg_node && seg_node->as_string()) {
      // a pattern such as "model.layers.*.mlp.experts": a region per matching segment
      a.pattern = seg_node->as_string()->get();
      if (a.pattern.empty()) r.error("segments", "a pattern such as \"model.layers.*.mlp.experts\"", seg_node);
    } else if (seg_node) {
      // [first, last] segment names, e.g. ["model.embed_tokens", "model.layers.3.self_attn"]; they are
      // resolved against the model when the graph is built
      const toml::array* sa = seg_node->as_array();
      if (!sa || sa->empty())
        r.error("segments", "a non-empty array of [first, last] segment-name ranges, or a pattern string", seg_node);
      for (size_t i = 0; i < sa->size(); ++i) {
        const toml::node* rn = sa->get(i);
        const toml::array* ra = rn->as_array();
        if (!ra || ra->size() != 2 || !ra->get(0)->as_string() || !ra->get(1)->as_string()) {
          std::string kp = cat(path, ".segments[", i, "]");
          throw UserError(cat(node_loc(rn, kp, ctx).str(), ": ", kp,
                              ": expected a [first, last] pair of segment names, found ", describe_node(rn)));
        }
        a.segments.push_back({ra->get(0)->as_string()->get(), ra->get(1)->as_string()->get()});
      }
    } else {
    const toml::array* la = layers ? layers->as_array() : nullptr;
    if (!la || la->empty()) r.error("layers", "a non-empty array of [first, last] layer ranges (or segments = [...])", layers);
    int prev_last = -1;
    for (size_t i = 0; i < la->size(); ++i) {
      const toml::node* rn = la->get(i);
      const toml::array* ra = rn->as_array();
      std::string kp = cat(path, ".layers[", i, "]");
      auto bad = [&](const std::string& what) {
        throw UserError(cat(node_loc(rn, kp, ctx).str(), ": ", kp, ": ", what));
      };
      if (!ra || ra->size() != 2 || !ra->get(0)->as_integer() || !ra->get(1)->as_integer())
        bad(cat("expected a [first, last] pair of layer indices, found ", describe_node(rn)));
      // compared as read (int64): a value past int must not wrap into range
      const int64_t lo64 = ra->get(0)->as_integer()->get(), hi64 = ra->get(1)->as_integer()->get();
      if (lo64 > hi64) bad(cat("first layer ", lo64, " is after last layer ", hi64));
      if (lo64 < 0 || hi64 >= spec.model.n_layers)
        bad(cat("layers [", lo64, ", ", hi64, "] outside the model's layers 0..", spec.model.n_layers - 1));
      const int lo = int(lo64), hi = int(hi64);
      if (lo <= prev_last) bad(cat("range starts at layer ", lo, ", inside or before the previous range (ends at ", prev_last, ")"));
      prev_last = hi;
      a.layers.push_back({lo, hi});
    }
    }
    r.finish();
    for (const auto& other : spec.annotations)
      if (other.tag == a.tag)
        throw UserError(cat(a.loc.str(), ": ", path, ".tag: tag '", a.tag, "' is already annotated at ", other.loc.str()));
    spec.annotations.push_back(std::move(a));
    ++index;
  }
}

void load_directives(const toml::array& arr, JobSpec& spec, const LoadContext& ctx) {
  int index = 0;
  for (const auto& node : arr) {
    std::string path = cat("directive.", index);
    TomlReader r(*node.as_table(), path, ctx);
    Directive d;
    d.index = index;
    d.loc = r.loc();
    if (!r.has("op"))
      r.error("op",
              "one of \"split\", \"place\", \"replicate\", \"shard\", \"tp\", \"order\", \"schedule\", \"recompute\"",
              nullptr);
    d.op = r.get_string("op", "", {"split", "place", "replicate", "shard", "tp", "order", "schedule", "recompute"});
    auto filter_or_all = [&](bool required) {
      const toml::node* f = r.get_node("filter");
      if (!f) {
        if (required) r.error("filter", "a filter table such as { PP = 0 }", nullptr);
        return Filter{};
      }
      return parse_filter(f, r.key_path("filter"), ctx);
    };
    if (d.op == "split") {
      d.filter = filter_or_all(false);
      d.dim = r.get_string("dim", "MB");
      if (d.dim != "MB") r.error_msg("dim", cat("only dim = \"MB\" (microbatches) is supported, found \"", d.dim, "\""));
      if (!r.has("count")) r.error("count", "an integer >= 1 (number of microbatches)", nullptr);
      d.count = int(r.get_int("count", 1, 1, 1 << 20));
    } else if (d.op == "place") {
      d.filter = filter_or_all(true);
      const toml::node* dev = r.get_node("devices");
      const toml::array* da = dev ? dev->as_array() : nullptr;
      if (!da || da->empty()) r.error("devices", "a non-empty array of rank numbers", dev);
      for (const auto& e : *da) {
        if (!e.as_integer() || e.as_integer()->get() < 0 || e.as_integer()->get() > INT32_MAX)
          r.error("devices", "rank numbers >= 0 (and below 2^31)", &e);
        int rank = int(e.as_integer()->get());
        if (std::find(d.devices.begin(), d.devices.end(), rank) != d.devices.end())
          r.error_msg("devices", cat("rank ", rank, " appears twice"));
        d.devices.push_back(rank);
      }
    } else if (d.op == "replicate") {
      d.filter = filter_or_all(false);
      d.zero = int(r.get_int("zero", 0, 0, 3));
      d.bucket_mb = r.get_float("bucket_mb", 25.0, 0.0, 1e6, true);
      d.grad_buckets_in_flight = int(r.get_int("grad_buckets_in_flight", 2, 1, 1 << 20));
      d.stream = r.get_string("stream", "dp");
    } else if (d.op == "shard") {
      d.filter = filter_or_all(true);
      d.stream = r.get_string("stream", "ep");
      d.group = int(r.get_int("group", 0, 1, 1 << 24));
    } else if (d.op == "tp") {
      d.filter = filter_or_all(false);
      d.stream = r.get_string("stream", "tp");
      if (!r.has("group")) r.error("group", "an integer >= 2 (ranks per tensor-parallel group)", nullptr);
      d.group = int(r.get_int("group", 0, 2, 1 << 20));
      d.sequence = r.get_bool("sequence", false);
    } else if (d.op == "recompute") {
      d.filter = filter_or_all(false);
      d.policy = r.get_string("policy", "full", {"full", "selective"});
      d.every = int(r.get_int("every", 1, 1, 1 << 20));
      if (const toml::node* n = r.get_node("types")) {  // segment type names, checked by the recompute pass
        const toml::array* a = n->as_array();
        if (!a || a->empty()) r.error("types", "a non-empty array of segment type names such as [\"qwen3.mlp\"]", n);
        for (size_t i = 0; i < a->size(); ++i) {
          const auto* s = a->get(i)->as_string();
          if (!s)
            throw UserError(cat(node_loc(a->get(i), r.key_path("types"), ctx).str(), ": ", r.key_path("types"), "[", i,
                                "]: expected a segment type name such as \"qwen3.mlp\", found ",
                                describe_node(a->get(i))));
          d.types.push_back(s->get());
        }
      }
    } else if (d.op == "order") {
      const toml::node* fs = r.get_node("filters");
      const toml::array* fa = fs ? fs->as_array() : nullptr;
      if (!fa || fa->empty()) r.error("filters", "a non-empty array of slots, each an array of filters", fs);
      for (size_t i = 0; i < fa->size(); ++i) {
        const toml::node* slot = fa->get(i);
        std::vector<Filter> filters;
        std::string kp = cat(r.key_path("filters"), "[", i, "]");
        if (slot->as_table()) {
          filters.push_back(parse_filter(slot, kp, ctx));
        } else if (const toml::array* sa = slot->as_array(); sa && !sa->empty()) {
          for (size_t j = 0; j < sa->size(); ++j) filters.push_back(parse_filter(sa->get(j), cat(kp, "[", j, "]"), ctx));
        } else {
          throw UserError(cat(node_loc(slot, kp, ctx).str(), ": ", kp,
                              ": expected a slot (an array of filters), found ", describe_node(slot)));
        }
        d.slots.push_back(std::move(filters));
      }
    } else if (d.op == "schedule") {
      if (!r.has("kind")) r.error("kind", "a schedule kind", nullptr);
      d.kind = r.get_string("kind", "", kScheduleKinds);
      d.chunks = int(r.get_int("chunks", 0, 0, 1 << 16));
      d.file = r.get_string("file", "");
      d.tag = r.get_string("tag", "PP");
      if (d.kind == "file" && d.file.empty()) r.error("file", "the path of a TOML or CSV action list", nullptr);
      if (d.kind != "file" && !d.file.empty()) r.error_msg("file", "only kind = \"file\" reads a file");
    }
    r.finish();
    spec.directives.push_back(std::move(d));
    ++index;
  }
}

// The TOML document in `text`; a syntax error names `name`, line and column.
toml::table parse_toml(const std::string& text, const std::string& name) {
  try {
    return toml::parse(text, name);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    throw UserError(cat(name, ":", b.line, ":", b.column, ": TOML syntax error: ", e.description()));
  }
}

}  // namespace

ModelSpec load_model_text(const std::string& text, const std::string& name) {
  LoadContext ctx;
  ctx.file = name;
  toml::table root = parse_toml(text, name);
  TomlReader top(root, "", ctx);
  ModelSpec model;
  const toml::table* t = section(top, "model");
  if (!t) throw UserError(cat(name, ": no [model] table"));
  TomlReader r(*t, "model", ctx);
  load_model(r, model);
  return model;
}

JobSpec load_job_text(const std::string& text, const std::string& name, const std::vector<std::string>& overrides) {
  LoadContext ctx;
  ctx.file = name;
  toml::table root = parse_toml(text, name);
  JobSpec spec;
  spec.path = name;
  spec.text = text;
  for (const auto& o : overrides) {
    apply_override(root, o, ctx.overridden);
    spec.text += "\n# --set " + o;
  }

  TomlReader top(root, "", ctx);
  auto with = [&](const std::string& name, auto&& fn) {
    if (const toml::table* t = section(top, name)) {
      TomlReader r(*t, name, ctx);
      fn(r);
    }
  };
  with("job", [&](TomlReader& r) { load_job_section(r, spec.job); });
  if (!root.contains("model")) {
    std::string kinds;
    for (const auto& k : model_family_reader_kinds()) kinds += cat(kinds.empty() ? "" : " | ", k);
    throw UserError(cat(name, ": [model]: missing; say what to train: a [model] table with kind = ", kinds,
                        " and the family's keys (README, \"The job file\")"));
  }
  with("model", [&](TomlReader& r) { load_model(r, spec.model); });
  with("data", [&](TomlReader& r) { load_data(r, spec.data, spec.model); });
  if (!root.contains("data") && find_model_family_reader(spec.model.kind)->reads_tokens)
    throw UserError(cat(name, ": [data]: missing; a ", spec.model.kind,
                        " model trains on a token file: add a [data] table with path = \"...\" (README, \"The job file\")"));
  with("eval", [&](TomlReader& r) { load_eval(r, spec.eval, spec.model); });
  with("optimizer", [&](TomlReader& r) { load_optimizer(r, spec.optimizer); });
  with("checkpoint", [&](TomlReader& r) { load_checkpoint(r, spec.checkpoint, ctx); });
  with("mesh", [&](TomlReader& r) { load_mesh(r, spec.mesh); });
  with("cost", [&](TomlReader& r) { load_cost(r, spec.cost); });
  if (!spec.cost.preset_given && spec.job.backend == "cuda") spec.cost.preset = "h100";  // not a CPU's rates
  if (const toml::array* a = array_of_tables(top, "annotate")) load_annotations(*a, spec, ctx);
  if (const toml::array* a = array_of_tables(top, "directive")) load_directives(*a, spec, ctx);
  top.finish();
  if (spec.optimizer.decay_steps == 0) spec.optimizer.decay_steps = spec.job.steps;
  return spec;
}

JobSpec load_job(const std::string& path, const std::vector<std::string>& overrides) {
  return load_job_text(read_input_file(path, "job file", kMaxJobFileBytes), path, overrides);
}

}  // namespace piper

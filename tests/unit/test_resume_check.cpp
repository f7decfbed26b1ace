// What a checkpoint records about its run and what --resume compares: seed, sampler, data file (size and
// hash of its first and last MiB), every model key; checkpoint.allow_changes turns a difference into a
// warning; a resumed run's metrics file keeps only the steps up to the checkpoint.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "app/metrics_file.hpp"
#include "ckpt/resume_check.hpp"
#include "config/load.hpp"
#include "data/data.hpp"
#include "model/family.hpp"
#include "test_util.hpp"
#include "util/error.hpp"

using namespace piper;

namespace {

RunRecord gpt_record() {
  RunRecord r;
  r.has_seed = true;
  r.seed = 11;
  r.sampler = "random";
  ModelSpec m;
  m.kind = "gpt";
  r.model = model_keys_text(m);
  r.has_data = true;
  r.data_path = "data/fortunes.txt";
  r.data_bytes = 1000;
  r.data_hash = "fnv1a64:0000000000000001";
  return r;
}

std::string refusal(const RunRecord& ck, const RunRecord& job, const std::vector<std::string>& allowed = {}) {
  try {
    check_resume(ck, job, allowed, "ck.h5");
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

std::string temp_path(const std::string& name) {
  return std::string(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp") + "/" + name;
}

}  // namespace

TEST_CASE("model keys: every key of every family, in a text that reads back", "[resume]") {
  ModelSpec m;
  m.kind = "gpt";
  m.d_ff = 512;
  CHECK(model_keys_text(m) == "kind=gpt vocab=256 seq_len=128 d_model=256 n_layers=4 n_heads=8 d_ff=512");
  m.kind = "qwen3";
  m.norm_eps = 1e-6;
  m.rope_theta = 10000;
  const std::string q = model_keys_text(m);
  CHECK(q.find(" norm_eps=1e-06 ") != std::string::npos);
  CHECK(q.find(" rope_theta=10000 ") != std::string::npos);
  CHECK(q.find(" moe.capacity_factor=0") != std::string::npos);
  CHECK(parse_model_keys_text(q) == model_key_values(m));
  // each family's keys are keys its [model] table accepts: the values it resolves read back the same
  for (const Family* f : families()) {
    const bool moe = std::any_of(f->keys.begin(), f->keys.end(), [](const ModelKey& k) { return key_table_of(k) == "moe"; });
    const std::string data = f->reads_tokens ? "[data]\npath = \"" + test::scratch_data_file() + "\"\n" : "";
    const JobSpec first = load_job_text("[model]\nkind = \"" + f->kind + "\"\n" + (moe ? "[model.moe]\n" : "") + data,
                                        "job.toml");
    std::string text = "[model]\n", moe_text = "[model.moe]\n";
    for (const auto& [k, v] : model_key_values(first.model)) {
      const std::string line = (k.rfind("moe.", 0) == 0 ? k.substr(4) : k) + " = " + (k == "kind" ? "\"" + v + "\"" : v) + "\n";
      (k.rfind("moe.", 0) == 0 ? moe_text : text) += line;
    }
    text += (moe ? moe_text : "") + data;
    INFO(text);
    const JobSpec again = load_job_text(text, "job.toml");
    CHECK(model_keys_text(again.model) == model_keys_text(first.model));
  }
  CHECK(all_model_keys().front() == "kind");
}

TEST_CASE("model key tables hold a plan's dimensions to the job file's ranges and rules", "[resume]") {
  const Family* q = find_family("qwen3");
  REQUIRE(q != nullptr);
  ModelDims d;  // qwen3's defaults as the job loader resolves them
  d.n_kv_heads = d.n_heads;
  d.head_dim = d.d_model / d.n_heads;
  CHECK_FALSE(check_model_keys(q->keys, d).has_value());
  auto problem_key = [&](ModelDims bad) {
    const std::optional<KeyProblem> p = check_model_keys(q->keys, bad);
    return p ? p->key : std::string("none");
  };
  ModelDims bad = d;
  bad.n_kv_heads = 3;  // does not divide n_heads: a rule
  CHECK(problem_key(bad) == "n_kv_heads");
  bad = d;
  bad.head_dim = 1 << 17;  // a range
  CHECK(problem_key(bad) == "head_dim");
  bad = d;
  bad.norm_eps = 0;  // an exclusive bound
  CHECK(problem_key(bad) == "norm_eps");
  bad = d;
  bad.moe_experts = 4;
  bad.moe_top_k = 5;  // a rule inside [model.moe]
  CHECK(problem_key(bad) == "moe.top_k");
  // Without [model.moe] (experts 0) its keys are left out, and a spec built from the dimensions keeps
  // them at their defaults, so that the model it builds differs from dimensions that hold other values.
  ModelDims no_moe = d;
  no_moe.moe_top_k = 99;
  CHECK_FALSE(check_model_keys(q->keys, no_moe).has_value());
  CHECK(spec_from_keys(q->keys, "qwen3", no_moe).moe_top_k == ModelDims{}.moe_top_k);
  CHECK(spec_from_keys(q->keys, "qwen3", bad).moe_top_k == 5);
  // Every key of every family has a default and a line of documentation.
  for (const Family* f : families())
    for (const ModelKey& k : f->keys) {
      INFO(f->kind << " " << k.name);
      CHECK(k.fallback != nullptr);
      CHECK(std::string(k.doc).size() > 10);
    }
}

TEST_CASE("a family's own key (mlp's init_gain, kept in a family slot) is read, checked, recorded and used", "[resume]") {
  const JobSpec plain = load_job_text("[model]\nkind = \"mlp\"\n", "job.toml");
  const JobSpec scaled = load_job_text("[model]\nkind = \"mlp\"\ninit_gain = 2.5\n", "job.toml");
  CHECK(model_keys_text(plain.model).find(" init_gain=1") != std::string::npos);
  CHECK(model_keys_text(scaled.model).find(" init_gain=2.5") != std::string::npos);
  // the family's build uses it: every weight's initial std scales with it, the biases stay zero
  const Model a = find_family("mlp")->build(plain.model), b = find_family("mlp")->build(scaled.model);
  REQUIRE(a.params.size() == b.params.size());
  for (size_t i = 0; i < a.params.size(); ++i) {
    INFO(a.params[i].name);
    CHECK(b.params[i].init_std == Approx(2.5 * a.params[i].init_std));
  }
  // dimensions made in code, without the key table, have the key's default
  ModelSpec in_code;
  in_code.kind = "mlp";
  CHECK(family_value(in_code, find_family("mlp")->keys, 0) == 1.0);
  CHECK(family_value(scaled.model, find_family("mlp")->keys, 0) == 2.5);
  // its range, in a job file (file, line, key) and in a received plan's dimensions
  try {
    load_job_text("[model]\nkind = \"mlp\"\ninit_gain = 0\n", "job.toml");
    FAIL("init_gain = 0 was accepted");
  } catch (const UserError& e) {
    CHECK(std::string(e.what()).find("job.toml:3") != std::string::npos);
    CHECK(std::string(e.what()).find("init_gain") != std::string::npos);
  }
  ModelDims bad = scaled.model;
  bad.family_values[0] = 1000;
  const std::optional<KeyProblem> p = check_model_keys(find_family("mlp")->keys, bad);
  REQUIRE(p.has_value());
  CHECK(p->key == "init_gain");
  // another family's dimensions keep the slot at 0 and never read it
  CHECK(load_job_text("[model]\nkind = \"gpt\"\n[data]\npath = \"" + test::scratch_data_file() + "\"\n", "job.toml")
            .model.family_values[0] == 0);
  // a checkpoint written before the key existed resumes with a warning naming it; a changed value is refused
  RunRecord ck, job;
  ck.has_seed = job.has_seed = true;
  job.model = model_keys_text(scaled.model);
  ck.model = job.model.substr(0, job.model.find(" init_gain="));
  const std::vector<std::string> w = check_resume(ck, job, {}, "ck.h5");
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("does not record model.init_gain") != std::string::npos);
  CHECK(w[0].find("job's value 2.5") != std::string::npos);
  ck.model = model_keys_text(plain.model);
  CHECK(refusal(ck, job).find("model.init_gain: checkpoint 1, job 2.5") != std::string::npos);
}

TEST_CASE("resume checks: the same settings pass, each difference is named with both values", "[resume]") {
  const RunRecord ck = gpt_record();
  CHECK(check_resume(ck, ck, {}, "ck.h5").empty());

  RunRecord job = ck;
  job.data_path = "elsewhere/fortunes.txt";  // the same content under another name is the same data
  CHECK(check_resume(ck, job, {}, "ck.h5").empty());

  job = ck;
  job.seed = 12;
  std::string e = refusal(ck, job);
  CHECK(e.find("ck.h5") != std::string::npos);
  CHECK(e.find("job.seed: checkpoint 11, job 12") != std::string::npos);
  CHECK(e.find("allow_changes = [\"job.seed\"]") != std::string::npos);

  job = ck;
  job.sampler = "sequential";
  CHECK(refusal(ck, job).find("data.sampler: checkpoint \"random\", job \"sequential\"") != std::string::npos);
  RunRecord synthetic = ck;  // a synthetic task (mlp) has no data file and no sampler to compare
  synthetic.has_data = false;
  job = synthetic;
  job.sampler = "sequential";
  CHECK(check_resume(synthetic, job, {}, "ck.h5").empty());

  job = ck;
  job.data_path = "other.txt";
  job.data_hash = "fnv1a64:0000000000000002";
  e = refusal(ck, job);
  CHECK(e.find("data.path: checkpoint 'data/fortunes.txt' (1000 bytes, fnv1a64:0000000000000001), job 'other.txt' "
               "(1000 bytes, fnv1a64:0000000000000002)") != std::string::npos);
  job.data_hash = ck.data_hash;
  job.data_bytes = 999;
  CHECK(refusal(ck, job).find("data.path: checkpoint") != std::string::npos);

  ModelSpec m;
  m.kind = "gpt";
  m.d_ff = 2048;
  m.n_heads = 4;
  job = ck;
  job.model = model_keys_text(m);
  e = refusal(ck, job);
  CHECK(e.find("model.d_ff: checkpoint 1024, job 2048") != std::string::npos);
  CHECK(e.find("model.n_heads: checkpoint 8, job 4") != std::string::npos);
  CHECK(e.find("allow_changes = [\"model.n_heads\", \"model.d_ff\"]") != std::string::npos);
}

TEST_CASE("resume checks: allow_changes turns a difference into a warning, older checkpoints warn", "[resume]") {
  const RunRecord ck = gpt_record();
  RunRecord job = ck;
  job.seed = 12;
  job.data_hash = "fnv1a64:0000000000000002";
  std::vector<std::string> w = check_resume(ck, job, {"job.seed", "data.path"}, "ck.h5");
  REQUIRE(w.size() == 2);
  CHECK(w[0].find("job.seed: checkpoint 11, job 12") != std::string::npos);
  CHECK(w[1].find("data.path: checkpoint") != std::string::npos);
  // allowing one setting does not allow another
  CHECK(refusal(ck, job, {"job.seed"}).find("data.path") != std::string::npos);
  CHECK(refusal(ck, job, {"job.seed"}).find("job.seed") == std::string::npos);

  RunRecord old;  // a checkpoint of an older piper: seed and sampler only
  old.has_seed = true;
  old.seed = 11;
  old.sampler = "random";
  w = check_resume(old, ck, {}, "ck.h5");
  REQUIRE(w.size() == 1);
  CHECK(w[0].find("cannot be checked") != std::string::npos);
  job = ck;
  job.seed = 5;
  CHECK(refusal(old, job).find("job.seed: checkpoint 11, job 5") != std::string::npos);
}

TEST_CASE("checkpoint.allow_changes names settings --resume compares, others are errors with file:line", "[resume]") {
  const std::string base = "[model]\nkind = \"mlp\"\n[checkpoint]\ndir = \"x\"\n";
  JobSpec s = load_job_text(base + "allow_changes = [\"job.seed\", \"data.path\", \"model.d_hidden\", \"model.moe.top_k\"]\n",
                            "job.toml");
  CHECK(s.checkpoint.allow_changes == std::vector<std::string>{"job.seed", "data.path", "model.d_hidden", "model.moe.top_k"});
  auto error_of = [&](const std::string& text) {
    try {
      load_job_text(text, "job.toml");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = error_of(base + "allow_changes = [\"job.seed\", \"job.sed\"]\n");
  CHECK(e.find("job.toml:5:30: checkpoint.allow_changes[1]: unknown setting \"job.sed\" (did you mean \"job.seed\"?)") !=
        std::string::npos);
  e = error_of(base + "allow_changes = [\"mesh.pp\"]\n");
  CHECK(e.find("job.toml:5:18: checkpoint.allow_changes[0]: unknown setting \"mesh.pp\"; expected \"job.seed\"") !=
        std::string::npos);
  e = error_of(base + "allow_changes = [3]\n");
  CHECK(e.find("checkpoint.allow_changes[0]: expected \"job.seed\"") != std::string::npos);
  CHECK(e.find("found integer 3") != std::string::npos);
  e = error_of(base + "allow_changes = \"job.seed\"\n");
  CHECK(e.find("checkpoint.allow_changes: expected an array of setting names") != std::string::npos);
}

TEST_CASE("a job file without a model table, or a token model without a data table, says what is missing", "[resume]") {
  auto error_of = [&](const std::string& text) {
    try {
      load_job_text(text, "job.toml");
    } catch (const UserError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  std::string e = error_of("[job]\nsteps = 3\n[data]\npath = \"" + test::scratch_data_file() + "\"\n");
  CHECK(e.find("job.toml: [model]: missing") != std::string::npos);
  e = error_of("[job]\nsteps = 3\n[model]\nkind = \"qwen3\"\n");
  CHECK(e.find("job.toml: [data]: missing") != std::string::npos);
  CHECK(error_of("[model]\nkind = \"mlp\"\n").empty());  // synthetic data needs no [data]
}

TEST_CASE("file identity: size and a hash of the first and last MiB", "[resume]") {
  const std::string a = temp_path("piper-unit-identity-a.bin"), b = temp_path("piper-unit-identity-b.bin");
  std::string bytes(3 << 20, 'x');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(i * 7 % 251);
  auto write = [](const std::string& path, const std::string& content) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << content;
  };
  write(a, bytes);
  FileIdentity ia = file_identity(a);
  CHECK(ia.bytes == int64_t(bytes.size()));
  CHECK(ia.hash.rfind("fnv1a64:", 0) == 0);
  CHECK(ia.hash.size() == 8 + 16);
  std::string changed = bytes;
  changed[10] ^= 1;  // first MiB
  write(b, changed);
  CHECK(file_identity(b).hash != ia.hash);
  changed = bytes;
  changed[changed.size() - 10] ^= 1;  // last MiB
  write(b, changed);
  CHECK(file_identity(b).hash != ia.hash);
  changed = bytes;
  changed[bytes.size() / 2] ^= 1;  // the middle is not hashed
  write(b, changed);
  CHECK(file_identity(b).hash == ia.hash);
  write(b, bytes);
  CHECK(file_identity(b).hash == ia.hash);
  std::remove(a.c_str());
  std::remove(b.c_str());
  CHECK_THROWS_AS(file_identity(a), UserError);
}

TEST_CASE("a resumed run's metrics file keeps the steps up to the checkpoint, once each", "[resume]") {
  CHECK(metrics_line_step("{\"step\": 12, \"loss\": 3.5}") == 12);
  CHECK(metrics_line_step("{\"loss\": 3.5}") == -1);
  const std::string path = temp_path("piper-unit-metrics.jsonl");
  {
    std::ofstream f(path, std::ios::trunc);
    for (int s = 1; s <= 7; ++s) f << "{\"step\": " << s << ", \"loss\": " << s << ".5}\n";
    f << "{\"step\": 8, \"lo";  // cut short by a stopped run
  }
  std::ofstream out;
  open_metrics(out, path, 5);
  out << "{\"step\": 6, \"loss\": 60}\n";
  out.close();
  std::ifstream in(path);
  std::vector<int64_t> steps;
  for (std::string line; std::getline(in, line);) steps.push_back(metrics_line_step(line));
  CHECK(steps == std::vector<int64_t>{1, 2, 3, 4, 5, 6});
  std::ofstream fresh;
  open_metrics(fresh, path, 0);  // from scratch: emptied
  fresh.close();
  CHECK(std::ifstream(path).peek() == std::char_traits<char>::eof());
  std::remove(path.c_str());
}

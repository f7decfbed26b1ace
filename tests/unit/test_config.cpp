// Job-file validation: every class of error names file:line:column, the key, what was found and what
// was expected; --set overrides apply and are named as the source when they are wrong.
#include <catch2/catch.hpp>

#include "config/load.hpp"
#include "test_util.hpp"
#include "util/error.hpp"

using namespace piper;

namespace {

const char* kBase = R"(
[job]
name = "t"
steps = 10

[model]
kind = "mlp"
d_in = 8
d_hidden = 16
n_layers = 2
n_classes = 4

[data]
batch = 8
)";

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    load_job_text(text, "job.toml", sets);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("a valid job loads with defaults and overrides", "[config]") {
  JobSpec s = load_job_text(kBase, "job.toml", {"model.n_layers=3", "optimizer.lr=0.01", "job.name=renamed"});
  CHECK(s.model.n_layers == 3);
  CHECK(s.optimizer.lr == Approx(0.01));
  CHECK(s.job.name == "renamed");
  CHECK(s.optimizer.decay_steps == 10);  // defaults to job.steps
  CHECK(s.text.find("# --set model.n_layers=3") != std::string::npos);
}

TEST_CASE("job.watchdog_s: 600 s by default, 0 turns it off, a negative or non-number is an error at its line",
          "[config]") {
  CHECK(load_job_text(kBase, "job.toml", {}).job.watchdog_s == 600);
  CHECK(load_job_text(kBase, "job.toml", {"job.watchdog_s=0"}).job.watchdog_s == 0);
  CHECK(load_job_text(kBase, "job.toml", {"job.watchdog_s=2.5"}).job.watchdog_s == 2.5);
  std::string text = kBase;
  text.replace(text.find("steps = 10\n"), 11, "steps = 10\nwatchdog_s = -1\n");
  std::string e = error_of(text);
  CHECK(e.find("job.toml:5:14: job.watchdog_s: expected a number >= 0 and <= 1e+09, found integer -1") !=
        std::string::npos);
  e = error_of(kBase, {"job.watchdog_s=\"long\""});
  CHECK(e.find("job.watchdog_s: expected a number >= 0") != std::string::npos);
}

TEST_CASE("unknown keys are rejected with location and a suggestion", "[config]") {
  std::string e = error_of(std::string(kBase) + "\n[optimizer]\nlearning_rate = 0.1\n");
  CHECK(e.find("job.toml:17:1") != std::string::npos);
  CHECK(e.find("unknown key 'optimizer.learning_rate'") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[optimizer]\nwarmup_step = 3\n");
  CHECK(e.find("did you mean 'optimizer.warmup_steps'") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[nonsense]\nx = 1\n");
  CHECK(e.find("unknown key 'nonsense'") != std::string::npos);
}

TEST_CASE("wrong types name the key, what was found and what was expected", "[config]") {
  std::string e = error_of(std::string(kBase) + "\n[optimizer]\nlr = \"fast\"\n");
  CHECK(e.find("job.toml:17:6") != std::string::npos);
  CHECK(e.find("optimizer.lr") != std::string::npos);
  CHECK(e.find("expected a number > 0") != std::string::npos);
  CHECK(e.find("found string \"fast\"") != std::string::npos);
  e = error_of("[job]\nsteps = 2.5\n[model]\nkind=\"mlp\"\n");
  CHECK(e.find("job.steps: expected an integer >= 1, found float 2.5") != std::string::npos);
  e = error_of("[job]\nname = 3\n[model]\nkind=\"mlp\"\n");
  CHECK(e.find("job.name: expected a string, found integer 3") != std::string::npos);
}

TEST_CASE("out-of-range values are rejected", "[config]") {
  std::string e = error_of(kBase, {"model.n_layers=0"});
  CHECK(e.find("--set model.n_layers") != std::string::npos);
  CHECK(e.find("expected an integer in [1, 100000], found integer 0") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[optimizer]\nbeta1 = 1.5\n");
  CHECK(e.find("optimizer.beta1: expected a number >= 0 and <= 0.999999, found float 1.5") != std::string::npos);
  e = error_of(kBase, {"job.backend=\"tpu\""});
  CHECK(e.find("expected one of \"cpu\", \"cuda\", found string \"tpu\"") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[mesh]\nzero = 4\n");
  CHECK(e.find("mesh.zero: expected an integer in [0, 3], found integer 4") != std::string::npos);
}

TEST_CASE("cross-key rules name both keys", "[config]") {
  std::string e = error_of("[model]\nkind = \"gpt\"\nd_model = 10\nn_heads = 3\n[data]\npath = \"data/fortunes.txt\"\n");
  CHECK(e.find("model.n_heads: n_heads (3) must divide d_model (10)") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[optimizer]\nlr = 0.001\nmin_lr = 0.01\n");
  CHECK(e.find("min_lr (0.01) must not exceed lr (0.001)") != std::string::npos);
}

TEST_CASE("TOML syntax errors give line and column", "[config]") {
  std::string e = error_of("[job]\nsteps = = 3\n");
  CHECK(e.find("job.toml:2:") != std::string::npos);
  CHECK(e.find("TOML syntax error") != std::string::npos);
}

TEST_CASE("missing data is an error that says how to get it", "[config]") {
  std::string e = error_of("[model]\nkind = \"gpt\"\n[data]\npath = \"no/such/file.txt\"\n");
  CHECK(e.find("data.path") != std::string::npos);
  CHECK(e.find("no readable file 'no/such/file.txt'") != std::string::npos);
  CHECK(e.find("make data") != std::string::npos);
  e = error_of("[model]\nkind = \"gpt\"\n");
  CHECK(e.find("[data]: missing") != std::string::npos);
}

TEST_CASE("annotations are checked against the model", "[config]") {
  std::string e = error_of(std::string(kBase) + "\n[[annotate]]\ntag = \"PP\"\nlayers = [[0, 0], [1, 5]]\n");
  CHECK(e.find("annotate.0.layers[1]") != std::string::npos);
  CHECK(e.find("outside the model's layers 0..1") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[[annotate]]\ntag = \"PP\"\nlayers = [[1, 1], [0, 0]]\n");
  CHECK(e.find("inside or before the previous range") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[[annotate]]\ntag = \"MB\"\nlayers = [[0, 1]]\n");
  CHECK(e.find("'MB' is reserved") != std::string::npos);
}

TEST_CASE("directives are checked per op", "[config]") {
  std::string e = error_of(std::string(kBase) + "\n[[directive]]\nop = \"spilt\"\n");
  CHECK(e.find("directive.0.op: expected one of \"split\"") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[[directive]]\nop = \"place\"\nfilter = { PP = 0 }\n");
  CHECK(e.find("directive.0.devices: expected a non-empty array of rank numbers, found nothing") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[[directive]]\nop = \"split\"\ncount = 2\ndevices = [0]\n");
  CHECK(e.find("unknown key 'directive.0.devices'") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[[directive]]\nop = \"order\"\nfilters = [[{ PASS = \"X\" }]]\n");
  CHECK(e.find("expected one of \"F\", \"B\", \"BI\", \"BW\"") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[[directive]]\nop = \"place\"\nfilter = { PP = 0 }\ndevices = [0, 0]\n");
  CHECK(e.find("rank 0 appears twice") != std::string::npos);
}

TEST_CASE("malformed --set overrides are rejected", "[config]") {
  CHECK(error_of(kBase, {"model.n_layers"}).find("expected key.path=value") != std::string::npos);
  CHECK(error_of(kBase, {"model..x=1"}).find("empty component") != std::string::npos);
  CHECK(error_of(kBase, {"model.n_layer=2"}).find("--set model.n_layer") != std::string::npos);
  // an unquoted word is taken as a string
  JobSpec s = load_job_text(kBase, "job.toml", {"job.name=plain"});
  CHECK(s.job.name == "plain");
}

TEST_CASE("qwen3 keys: defaults, derived head_dim and checked head counts", "[config]") {
  // data.path must name a file that exists
  const std::string data = "\n[data]\npath = \"" + test::scratch_data_file() + "\"\n";
  const std::string model = "[model]\nkind = \"qwen3\"\nvocab = 151936\nd_model = 64\nn_heads = 8\n";
  JobSpec s = load_job_text(model + data, "job.toml", {});
  CHECK(s.model.kind == "qwen3");
  CHECK(s.model.vocab == 151936);  // above the uint16 range
  CHECK(s.model.n_kv_heads == 8);  // defaults to n_heads
  CHECK(s.model.head_dim == 8);    // d_model / n_heads
  CHECK(s.model.rope_theta == 1e6);
  CHECK(s.model.norm_eps == 1e-6);
  CHECK(s.model.qk_norm);
  CHECK_FALSE(s.model.tie_embeddings);
  s = load_job_text(model + "n_kv_heads = 2\nhead_dim = 128\ntie_embeddings = true\nqk_norm = false\n" + data,
                    "job.toml", {"model.rope_theta=10000.0"});
  CHECK(s.model.n_kv_heads == 2);
  CHECK(s.model.head_dim == 128);
  CHECK(s.model.tie_embeddings);
  CHECK_FALSE(s.model.qk_norm);
  CHECK(s.model.rope_theta == 10000.0);
  CHECK(error_of(model + "n_kv_heads = 3\n" + data).find("job.toml:6:14: model.n_kv_heads: n_kv_heads (3) must divide n_heads (8)") !=
        std::string::npos);
  CHECK(error_of(model + "head_dim = 9\n" + data).find("model.head_dim: head_dim (9) must be even") != std::string::npos);
  CHECK(error_of(model + data, {"model.n_heads=7"}).find("n_heads (7) must divide d_model (64) unless head_dim is given") !=
        std::string::npos);
  CHECK(error_of(model + "d_inner = 3\n" + data).find("model.d_inner") != std::string::npos);  // unknown key
  CHECK(error_of("[model]\nkind = \"qwen4\"\n" + data).find("model.kind") != std::string::npos);
  // a gpt key the qwen3 family does not read, and a qwen3 key gpt does not read, are unknown keys
  CHECK(error_of("[model]\nkind = \"gpt\"\nn_kv_heads = 2\n" + data).find("model.n_kv_heads") != std::string::npos);
}

TEST_CASE("integers past int and array indices past unsigned long are errors and neither wrap nor throw", "[config]") {
  const std::string base = std::string(kBase) + "\n[[directive]]\nop = \"split\"\ncount = 2\n";
  // 2^32 and 2^32 + 1 would wrap to layers 0 and 1 as int
  std::string e = error_of(std::string(kBase) + "\n[[annotate]]\ntag = \"PP\"\nlayers = [[4294967296, 4294967297]]\n");
  CHECK(e.find("layers [4294967296, 4294967297] outside the model's layers 0..1") != std::string::npos);
  e = error_of(std::string(kBase) + "\n[[directive]]\nop = \"place\"\nfilter = { PP = 0 }\ndevices = [4294967296]\n");
  CHECK(e.find("directive.0.devices: expected rank numbers >= 0 (and below 2^31), found integer 4294967296") !=
        std::string::npos);
  // an index of a --set key path too long for std::stoul (found by fuzz_job)
  e = error_of(base, {"directive.99999999999999999999999.count=1"});
  CHECK(e.find("'99999999999999999999999' is not an index of the 1-element array before it") != std::string::npos);
  e = error_of(base, {"directive.0.filter=[1]", "directive.0.filter.99999999999999999999=2"});
  CHECK(e.find("'99999999999999999999' is not an index of the array before it") != std::string::npos);
}

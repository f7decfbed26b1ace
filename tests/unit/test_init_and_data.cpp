// Parameter initialization and data sampling are pure functions: init of (seed, name, index) with GPT-2
// statistics, token windows and synthetic samples of (seed, step, position in the global batch), so any
// rank can produce exactly its slice. Token files are written to a temporary directory by the tests.
#include <catch2/catch.hpp>

#include "compile/compile.hpp"
#include "config/load.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "config/job.hpp"
#include "data/data.hpp"
#include "model/build.hpp"
#include "model/segment_type.hpp"
#include "plan/plan.hpp"
#include "test_util.hpp"
#include "util/error.hpp"

using namespace piper;
using namespace piper::test;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::vector<float> full_init(const ParamSpec& p, uint64_t seed) {
  std::vector<float> v(size_t(p.numel));
  init_param_range(p, seed, 0, p.numel, v.data());
  return v;
}

struct Stats {
  double mean = 0, std = 0, within_one_std = 0;
};

Stats stats_of(const std::vector<float>& v) {
  Stats s;
  for (float x : v) s.mean += x;
  s.mean /= double(v.size());
  for (float x : v) s.std += (x - s.mean) * (x - s.mean);
  s.std = std::sqrt(s.std / double(v.size()));
  for (float x : v) s.within_one_std += std::fabs(x - s.mean) < s.std ? 1 : 0;
  s.within_one_std /= double(v.size());
  return s;
}

// A file in a fresh temporary directory, removed with it.
struct TempFile {
  std::filesystem::path dir, path;
  TempFile(const std::string& name, const std::vector<uint8_t>& bytes) {
    dir = std::filesystem::temp_directory_path() / ("piper_test_" + std::to_string(::getpid()) + "_" + name);
    std::filesystem::create_directories(dir);
    path = dir / name;
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
  }
  ~TempFile() {
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
};

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  Rand rng(seed);
  auto v = rng.ints(n, 0, 256);
  return std::vector<uint8_t>(v.begin(), v.end());
}

DataConfig token_config(const std::string& path, int T, int batch, uint64_t seed, bool sequential) {
  DataConfig c;
  c.kind = DataConfig::Kind::Tokens;
  c.path = path;
  c.vocab = 256;
  c.seq_len = T;
  c.batch = batch;
  c.seed = seed;
  c.sequential = sequential;
  return c;
}

// Token ids as a file of `width`-byte little-endian words.
std::vector<uint8_t> le_bytes(const std::vector<uint32_t>& ids, int width) {
  std::vector<uint8_t> bytes;
  for (uint32_t id : ids)
    for (int b = 0; b < width; ++b) bytes.push_back(uint8_t(id >> (8 * b)));
  return bytes;
}

// The message of the UserError validate_data throws, or "" if it accepts the data.
std::string data_error(const DataConfig& cfg) {
  try {
    validate_data(cfg);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::vector<int32_t> rows(const std::vector<int32_t>& v, int T, int first, int count) {
  return std::vector<int32_t>(v.begin() + int64_t(first) * T, v.begin() + int64_t(first + count) * T);
}

}  // namespace

TEST_CASE("parameter init is a pure function of (seed, name, index)", "[init]") {
  ModelSpec spec;
  spec.kind = "gpt";
  spec.vocab = 40, spec.seq_len = 8, spec.d_model = 16, spec.n_layers = 2, spec.n_heads = 2, spec.d_ff = 32;
  const Model m = build_model(spec), again = build_model(spec);
  REQUIRE(m.params.size() == again.params.size());
  const uint64_t seed = 42;
  for (size_t p = 0; p < m.params.size(); ++p) {
    const ParamSpec& ps = m.params[p];
    INFO(ps.name);
    auto full = full_init(ps, seed);
    CHECK(bitwise_equal(full, full_init(again.params[p], seed)));
    // Any sub-range equals the same elements of the full range.
    const int64_t n = ps.numel;
    for (auto [begin, count] : {std::pair<int64_t, int64_t>{0, 1}, {1, n - 1}, {n / 3, n / 2}, {n - 1, 1}}) {
      std::vector<float> part(static_cast<size_t>(count));
      init_param_range(ps, seed, begin, count, part.data());
      CHECK(std::memcmp(part.data(), full.data() + begin, size_t(count) * sizeof(float)) == 0);
    }
    bool same = true;
    for (int64_t i = 0; i < n; i += 5) same = same && init_value(ps, seed, i) == full[size_t(i)];
    CHECK(same);
    // The shape plays no part: the same name with more elements starts with the same values.
    ParamSpec longer = ps;
    longer.shape = {2 * n};
    longer.numel = 2 * n;
    auto longer_full = full_init(longer, seed);
    CHECK(std::memcmp(longer_full.data(), full.data(), size_t(n) * sizeof(float)) == 0);
    if (ps.init == InitKind::Normal) {
      // Seed and name both select the stream.
      auto other_seed = full_init(ps, seed + 1);
      ParamSpec renamed = ps;
      renamed.name += "_";
      auto other_name = full_init(renamed, seed);
      size_t diff_seed = 0, diff_name = 0;
      for (size_t i = 0; i < full.size(); ++i) {
        diff_seed += other_seed[i] != full[i];
        diff_name += other_name[i] != full[i];
      }
      CHECK(diff_seed == full.size());
      CHECK(diff_name == full.size());
    }
  }
}

TEST_CASE("GPT-2 init: std 0.02, residual projections 0.02/sqrt(2 n_layers), LN weights 1, biases 0",
          "[init]") {
  ModelSpec spec;
  spec.kind = "gpt";
  spec.vocab = 256, spec.seq_len = 64, spec.d_model = 64, spec.n_layers = 4, spec.n_heads = 4, spec.d_ff = 256;
  const Model m = build_model(spec);
  const int L = spec.n_layers;
  CHECK(m.params.size() == size_t(2 + 12 * L + 2));  // wte, wpe, 12 per block, ln_f; the head reuses wte
  REQUIRE(m.segments.size() == size_t(2 * L + 3));  // embedding, each block's attention and MLP halves, head, loss
  const char* block[] = {"ln1.weight",       "ln1.bias",       "attn.qkv.weight", "attn.qkv.bias",
                         "attn.proj.weight", "attn.proj.bias", "ln2.weight",      "ln2.bias",
                         "mlp.fc.weight",    "mlp.fc.bias",    "mlp.proj.weight", "mlp.proj.bias"};
  for (int l = 0; l < L; ++l) {  // the parameters in the order of a whole block's, as checkpoints have them
    const Segment &att = m.segments[size_t(1 + 2 * l)], &mlp = m.segments[size_t(2 + 2 * l)];
    CHECK(att.name == "blocks." + std::to_string(l) + ".attn");
    CHECK(mlp.name == "blocks." + std::to_string(l) + ".mlp");
    CHECK((att.layer == l && mlp.layer == l));
    // the block's FLOPs, split: matmuls 2T(4C² + 2CF); causal attention 4C·T(T+1)/2, what a selective rerun redoes
    const double T = spec.seq_len, C = spec.d_model, F = spec.d_ff, attention = 4.0 * C * T * (T + 1) / 2.0;
    CHECK(att.fwd_flops_per_sample + mlp.fwd_flops_per_sample ==
          Approx(2.0 * T * (4.0 * C * C + 2.0 * C * F) + attention));
    CHECK((att.tail_flops_per_sample == Approx(attention) && mlp.tail_flops_per_sample == 0));
    REQUIRE((att.params.size() == 6 && mlp.params.size() == 6));
    for (int i = 0; i < 12; ++i) {
      const int p = i < 6 ? att.params[size_t(i)] : mlp.params[size_t(i - 6)];
      CHECK(p == 2 + 12 * l + i);
      CHECK(m.params[size_t(p)].name == "blocks." + std::to_string(l) + "." + block[i]);
    }
  }
  const Segment& head = m.segments[m.segments.size() - 2];
  CHECK((head.name == "head" && head.type->name == "gpt2.head"));
  CHECK(head.params.size() == 3);
  CHECK(head.params[2] == m.segments.front().params[0]);  // tied wte
  CHECK(head.fwd_flops_per_sample == Approx(2.0 * spec.seq_len * spec.d_model * spec.vocab));
  // the cross-entropy, apart: no parameters, no FLOPs, the head's stash
  CHECK((m.segments.back().name == "loss" && m.segments.back().type->name == "gpt2.loss"));
  CHECK((m.segments.back().params.empty() && m.segments.back().fwd_flops_per_sample == 0));
  CHECK((m.segments.back().type->computes_loss && m.segments.back().type->link_offset == -1));
  CHECK(m.segments.back().layer == L - 1);
  CHECK(m.params[size_t(m.segments.front().params[0])].name == "wte");
  const double proj_std = 0.02 / std::sqrt(2.0 * L);
  int normals = 0;
  for (const ParamSpec& p : m.params) {
    INFO(p.name);
    auto v = full_init(p, 7);
    const bool ln_weight = ends_with(p.name, "ln1.weight") || ends_with(p.name, "ln2.weight") ||
                           p.name == "ln_f.weight";
    if (ln_weight || ends_with(p.name, ".bias")) {
      const float expected = ln_weight ? 1.f : 0.f;
      bool all = true;
      for (float x : v) all = all && x == expected;
      CHECK(all);
      CHECK(!p.decay);  // no weight decay on gains and biases
      continue;
    }
    const bool residual = ends_with(p.name, "attn.proj.weight") || ends_with(p.name, "mlp.proj.weight");
    const double expected_std = residual ? proj_std : 0.02;
    Stats s = stats_of(v);
    // Sampling error of the std is std/sqrt(2n) (≤ 1.1% here) and of the mean std/sqrt(n).
    CHECK(s.std == Approx(expected_std).epsilon(0.05));
    CHECK(std::fabs(s.mean) < 5 * expected_std / std::sqrt(double(v.size())));
    CHECK(std::fabs(s.within_one_std - 0.6827) < 0.03);  // Gaussian, not uniform
    CHECK(p.decay);
    ++normals;
  }
  CHECK(normals == 2 + 4 * L);  // wte, wpe; qkv, proj, fc, mlp.proj per block
}

TEST_CASE("MLP init: weights with std 1/sqrt(fan_in), zero biases", "[init]") {
  ModelSpec spec;
  spec.kind = "mlp";
  spec.d_in = 32, spec.d_hidden = 96, spec.n_layers = 3, spec.n_classes = 10;
  const Model m = build_model(spec);
  REQUIRE(m.params.size() == size_t(2 * (spec.n_layers + 1)));
  for (const ParamSpec& p : m.params) {
    INFO(p.name);
    auto v = full_init(p, 3);
    if (ends_with(p.name, ".bias")) {
      bool all_zero = true;
      for (float x : v) all_zero = all_zero && x == 0.f;
      CHECK(all_zero);
      CHECK(!p.decay);
      continue;
    }
    REQUIRE(p.shape.size() == 2);
    const double fan_in = double(p.shape[1]);
    CHECK(fan_in == (p.name == "layers.0.weight" ? spec.d_in : spec.d_hidden));
    const double expected_std = 1.0 / std::sqrt(fan_in);
    Stats s = stats_of(v);
    // 4 standard errors of the sample std (std/sqrt(2n)) and of the mean (std/sqrt(n)).
    CHECK(s.std == Approx(expected_std).epsilon(4.0 / std::sqrt(2.0 * double(v.size()))));
    CHECK(std::fabs(s.mean) < 4 * expected_std / std::sqrt(double(v.size())));
    CHECK(p.decay);
  }
}

TEST_CASE("token windows are pure functions of (seed, step, index): slices, shifted targets, file bytes",
          "[data]") {
  const auto bytes = random_bytes(6000, 1);
  TempFile file("tokens.txt", bytes);
  const int T = 16, B = 8;
  for (bool sequential : {false, true}) {
    INFO("sequential " << sequential);
    DataConfig cfg = token_config(file.path.string(), T, B, 5, sequential);
    DataLoader loader(cfg), twin(cfg);
    REQUIRE(loader.num_tokens() == int64_t(bytes.size()));
    for (int64_t step : {0, 1, 7, 1000}) {
      INFO("step " << step);
      std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T), in2(in.size()), tg2(tg.size());
      loader.inputs(step, 0, B, in.data());
      loader.targets(step, 0, B, tg.data());
      twin.inputs(step, 0, B, in2.data());
      twin.targets(step, 0, B, tg2.data());
      CHECK(in == in2);
      CHECK(tg == tg2);
      for (auto [first, count] : {std::pair<int, int>{0, 3}, {3, 5}, {5, 1}, {7, 1}}) {
        std::vector<int32_t> part(size_t(count) * T);
        loader.inputs(step, first, count, part.data());
        CHECK(part == rows(in, T, first, count));
        loader.targets(step, first, count, part.data());
        CHECK(part == rows(tg, T, first, count));
      }
      for (int i = 0; i < B; ++i) {
        const int64_t start = loader.window_start(step, i);
        REQUIRE(start >= 0);
        REQUIRE(start + T + 1 <= loader.num_tokens());  // the last target is inside the file
        bool ok = true;
        for (int t = 0; t < T; ++t) {
          ok = ok && in[size_t(i) * T + t] == int32_t(bytes[size_t(start + t)]);
          ok = ok && tg[size_t(i) * T + t] == int32_t(bytes[size_t(start + t + 1)]);
          if (t + 1 < T) ok = ok && tg[size_t(i) * T + t] == in[size_t(i) * T + t + 1];
        }
        CHECK(ok);
      }
    }
  }
}

TEST_CASE("sequential windows advance through the file, random windows differ across steps and seeds",
          "[data]") {
  const auto bytes = random_bytes(6000, 2);
  TempFile file("tokens.txt", bytes);
  const int T = 16, B = 8;
  {
    DataLoader seq(token_config(file.path.string(), T, B, 5, true));
    CHECK(seq.window_start(0, 0) == 0);
    // Sequence k+1 of the run starts where sequence k ended, across step boundaries.
    int64_t expected = 0;
    for (int64_t step = 0; step < 3; ++step)
      for (int i = 0; i < B; ++i) {
        INFO("step " << step << " index " << i);
        CHECK(seq.window_start(step, i) == expected);
        expected += T;
      }
  }
  {
    // A short file: the sequential sampler wraps and every window stays inside it.
    TempFile small("small.txt", random_bytes(100, 3));
    DataLoader seq(token_config(small.path.string(), T, B, 5, true));
    bool in_range = true;
    for (int64_t step = 0; step < 50; ++step)
      for (int i = 0; i < B; ++i) {
        int64_t s = seq.window_start(step, i);
        in_range = in_range && s >= 0 && s + T + 1 <= seq.num_tokens();
      }
    CHECK(in_range);
  }
  DataLoader rnd(token_config(file.path.string(), T, B, 5, false));
  DataLoader other_seed(token_config(file.path.string(), T, B, 6, false));
  std::set<int64_t> starts;
  for (int64_t step = 0; step < 4; ++step) {
    size_t same_as_other_seed = 0, same_as_previous_step = 0;
    for (int i = 0; i < B; ++i) {
      starts.insert(rnd.window_start(step, i));
      same_as_other_seed += rnd.window_start(step, i) == other_seed.window_start(step, i);
      if (step > 0) same_as_previous_step += rnd.window_start(step, i) == rnd.window_start(step - 1, i);
    }
    CHECK(same_as_other_seed <= 1);
    CHECK(same_as_previous_step <= 1);
  }
  CHECK(starts.size() >= size_t(4 * B - 2));  // ~6000 possible starts: collisions are rare
}

TEST_CASE("uint16 .bin token files are read little-endian and validated against the vocabulary", "[data]") {
  const int n = 3000, T = 8, B = 4;
  std::vector<uint16_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[size_t(i)] = uint16_t((i * 7919 + 13) % 1000);
  std::vector<uint8_t> bytes;
  for (uint16_t t : tokens) {
    bytes.push_back(uint8_t(t & 0xff));
    bytes.push_back(uint8_t(t >> 8));
  }
  TempFile file("tokens.bin", bytes);
  DataConfig cfg = token_config(file.path.string(), T, B, 9, false);
  cfg.vocab = 1000;
  DataLoader loader(cfg);
  CHECK(loader.num_tokens() == n);
  int32_t max_tok = 0;
  for (uint16_t t : tokens) max_tok = std::max<int32_t>(max_tok, t);
  CHECK(loader.max_token().first == max_tok);
  std::vector<int32_t> in(size_t(B) * T);
  loader.inputs(3, 0, B, in.data());
  bool ok = true;
  for (int i = 0; i < B; ++i) {
    int64_t s = loader.window_start(3, i);
    for (int t = 0; t < T; ++t) ok = ok && in[size_t(i) * T + t] == int32_t(tokens[size_t(s + t)]);
  }
  CHECK(ok);
  CHECK_NOTHROW(validate_data(cfg));
  cfg.vocab = max_tok;  // one too small
  CHECK_THROWS_AS(validate_data(cfg), UserError);
}

TEST_CASE("uint32 .u32.bin token files carry ids above 65535 through inputs and targets", "[data]") {
  const int n = 4000, T = 12, B = 5, vocab = 1 << 20;
  std::vector<uint32_t> ids(n);
  for (int i = 0; i < n; ++i) ids[size_t(i)] = uint32_t((int64_t(i) * 104729 + 65521) % vocab);
  TempFile file("tokens.u32.bin", le_bytes(ids, 4));
  DataConfig cfg = token_config(file.path.string(), T, B, 11, false);
  cfg.vocab = vocab;
  CHECK(token_bytes_of(cfg) == 4);
  DataLoader loader(cfg);
  CHECK(loader.num_tokens() == n);
  const auto max_it = std::max_element(ids.begin(), ids.end());
  CHECK(loader.max_token().first == int64_t(*max_it));
  CHECK(loader.max_token().second == max_it - ids.begin());
  std::vector<int32_t> in(size_t(B) * T), tgt(in.size());
  bool ok = true, above_u16 = false;
  for (int64_t step = 0; step < 3; ++step) {
    loader.inputs(step, 0, B, in.data());
    loader.targets(step, 0, B, tgt.data());
    for (int i = 0; i < B; ++i) {
      int64_t s = loader.window_start(step, i);
      for (int t = 0; t < T; ++t) {
        ok = ok && in[size_t(i) * T + t] == int32_t(ids[size_t(s + t)]);
        ok = ok && tgt[size_t(i) * T + t] == int32_t(ids[size_t(s + t + 1)]);
        above_u16 = above_u16 || in[size_t(i) * T + t] > 65535;
      }
    }
  }
  CHECK(ok);
  CHECK(above_u16);
  CHECK(data_error(cfg) == "");
  // The width can be set whatever the name: the same bytes under a plain name read as uint32.
  TempFile plain("tokens.dat", le_bytes(ids, 4));
  DataConfig explicit_cfg = cfg;
  explicit_cfg.path = plain.path.string();
  CHECK(token_bytes_of(explicit_cfg) == 1);
  explicit_cfg.token_bytes = 4;
  CHECK(token_bytes_of(explicit_cfg) == 4);
  DataLoader explicit_loader(explicit_cfg);
  std::vector<int32_t> again(in.size());
  explicit_loader.inputs(2, 0, B, again.data());
  CHECK(again == in);
  CHECK(data_error(explicit_cfg) == "");
  explicit_cfg.token_bytes = 3;
  CHECK(has(data_error(explicit_cfg), "data.token_bytes = 3: expected 1, 2 or 4"));
}

TEST_CASE("the token width comes from the file name: .u16.bin and .bin uint16, .u32.bin uint32, else bytes",
          "[data]") {
  DataConfig cfg = token_config("x", 8, 2, 1, false);
  for (auto [name, width] : {std::pair<const char*, int>{"a.u16.bin", 2}, {"a.bin", 2}, {"a.u32.bin", 4},
                             {"a.txt", 1}, {"a.u32", 1}, {"bin", 1}}) {
    cfg.path = name;
    INFO(name);
    CHECK(token_bytes_of(cfg) == width);
  }
  // A .u16.bin file reads exactly as the same bytes named .bin.
  std::vector<uint32_t> ids(500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint32_t((i * 7919 + 13) % 40000);
  TempFile u16("tokens.u16.bin", le_bytes(ids, 2)), bin("tokens.bin", le_bytes(ids, 2));
  DataConfig a = token_config(u16.path.string(), 8, 2, 4, false), b = a;
  b.path = bin.path.string();
  a.vocab = b.vocab = 40000;
  DataLoader la(a), lb(b);
  CHECK(la.num_tokens() == int64_t(ids.size()));
  std::vector<int32_t> xa(16), xb(16);
  la.inputs(5, 0, 2, xa.data());
  lb.inputs(5, 0, 2, xb.data());
  CHECK(xa == xb);
  CHECK(xa[0] == int32_t(ids[size_t(la.window_start(5, 0))]));
  CHECK(data_error(a) == "");
}

TEST_CASE("a token file that is not a whole number of tokens is rejected with the right width", "[data]") {
  std::vector<uint8_t> bytes = le_bytes(std::vector<uint32_t>(301, 7), 2);
  bytes.pop_back();  // 601 bytes
  TempFile odd("odd.bin", bytes);
  DataConfig cfg = token_config(odd.path.string(), 8, 2, 1, false);
  std::string e = data_error(cfg);
  INFO(e);
  CHECK(has(e, "data.path: '" + cfg.path + "' is 601 bytes, not a whole number of 2-byte tokens"));
  CHECK(has(e, "by its .bin suffix"));
  CHECK(has(e, "give it a name that does not end in .bin"));
  // 602 bytes named .u32.bin: a whole number of uint16 words, so the message suggests .u16.bin.
  TempFile half("half.u32.bin", le_bytes(std::vector<uint32_t>(301, 7), 2));
  cfg.path = half.path.string();
  e = data_error(cfg);
  INFO(e);
  CHECK(has(e, "is 602 bytes, not a whole number of 4-byte tokens"));
  CHECK(has(e, "name it .u16.bin"));
}

TEST_CASE("uint16 files cannot serve a vocabulary above 65536, and uint32 ids read as uint16 are caught",
          "[data]") {
  std::vector<uint32_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint32_t((i * 7919 + 13) % 60000);
  TempFile u16("big_vocab.bin", le_bytes(ids, 2));
  DataConfig cfg = token_config(u16.path.string(), 8, 2, 1, false);
  cfg.vocab = 100000;
  std::string e = data_error(cfg);
  INFO(e);
  CHECK(has(e, "data.path: '" + cfg.path + "'"));
  CHECK(has(e, "model.vocab = 100000"));
  CHECK(has(e, "ids >= 65536 cannot be stored in a .bin of uint16"));
  CHECK(has(e, ".u32.bin"));
  // Set explicitly, the width is trusted: the ids fit the larger vocabulary.
  cfg.token_bytes = 2;
  CHECK(data_error(cfg) == "");

  // uint32 ids (some above 65535) in a file named .bin: every second uint16 word is a small high half.
  for (auto& id : ids) id += 70000;
  TempFile misnamed("misnamed.bin", le_bytes(ids, 4));
  cfg.path = misnamed.path.string();
  cfg.token_bytes = 0;
  cfg.vocab = 140000;
  e = data_error(cfg);
  INFO(e);
  CHECK(has(e, "looks like little-endian uint32 token ids"));
  CHECK(has(e, "every second 16-bit word is at most 2"));
  CHECK(has(e, "name it .u32.bin"));
  // The same with ids below 65536 and a vocabulary uint16 can hold: the high halves are all 0.
  for (auto& id : ids) id -= 70000;
  TempFile small_ids("small_ids.bin", le_bytes(ids, 4));
  cfg.path = small_ids.path.string();
  cfg.vocab = 60000;
  e = data_error(cfg);
  INFO(e);
  CHECK(has(e, "every second 16-bit word is 0"));
  CHECK(has(e, "name it .u32.bin"));
}

TEST_CASE("an id not below the vocabulary in a uint32 file is rejected with its value and position", "[data]") {
  std::vector<uint32_t> ids(800, 5);
  ids[123] = 3000000000u;  // above INT32_MAX too
  ids[500] = 3000000000u;
  TempFile file("ids.u32.bin", le_bytes(ids, 4));
  DataConfig cfg = token_config(file.path.string(), 8, 2, 1, false);
  cfg.vocab = 200000;
  std::string e = data_error(cfg);
  INFO(e);
  CHECK(has(e, "data.path: '" + cfg.path + "' holds token id 3000000000 at position 123, not below model.vocab = "
               "200000 (read as little-endian uint32 by its .u32.bin suffix)"));
  CHECK(has(e, "a larger vocabulary than this model's"));
  CHECK(!has(e, ".u16.bin"));  // two bad ids of 800: not a uint16 file
  // uint16 tokens in a .u32.bin: pairs read as one id are too large, and as uint16 they would fit.
  std::vector<uint32_t> words(800);
  for (size_t i = 0; i < words.size(); ++i) words[i] = uint32_t(1 + (i * 31) % 1000);
  TempFile u16("really_u16.u32.bin", le_bytes(words, 2));
  cfg.path = u16.path.string();
  cfg.vocab = 1000 + 1;
  e = data_error(cfg);
  INFO(e);
  CHECK(has(e, "400 of its 400 ids are that large, but read as uint16 every id would be below model.vocab: "
               "if it holds uint16 ids, name it .u16.bin"));
}

TEST_CASE("the plan carries the data token width to every rank", "[data]") {
  // compiled plans, serialized and read back as each rank does (the deserializer checks them)
  auto body = [](const std::string& text) {
    JobSpec spec = load_job_text(text, "job.toml");
    CompileResult r;
    compile_job(spec, 1, r);
    const auto bytes = serialize_plan(r.bodies.at(0));
    return deserialize_plan(bytes.data(), bytes.size());
  };
  std::vector<uint32_t> ids(4096);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = uint32_t(i % 256);
  TempFile tokens("t.u32.bin", le_bytes(ids, 4));
  Plan q = body("[model]\nkind = \"gpt\"\nvocab = 256\nseq_len = 16\nd_model = 32\nn_layers = 1\nn_heads = 4\n"
                "d_ff = 64\n[data]\npath = \"" + tokens.path.string() + "\"\nbatch = 2\ntoken_bytes = 4\n");
  CHECK(q.data.path == tokens.path.string());
  CHECK(q.data.token_bytes == 4);
  Plan m = body("[model]\nkind = \"mlp\"\nd_in = 8\nd_hidden = 16\nn_layers = 2\nn_classes = 3\n[data]\nbatch = 4\n");
  CHECK(m.data.n_classes == 3);
}

TEST_CASE("synthetic features and labels are deterministic, sliceable and in range", "[data]") {
  DataConfig cfg;
  cfg.kind = DataConfig::Kind::Synthetic;
  cfg.seed = 3;
  cfg.batch = 16;
  cfg.d_in = 12;
  cfg.n_classes = 5;
  DataLoader loader(cfg), twin(cfg);
  DataConfig other = cfg;
  other.seed = 4;
  DataLoader other_seed(other);
  const int B = cfg.batch, D = cfg.d_in;
  std::vector<float> all_features;
  std::vector<int> class_count(size_t(cfg.n_classes), 0);
  for (int64_t step = 0; step < 64; ++step) {
    INFO("step " << step);
    std::vector<float> f(size_t(B) * D), f2(f.size()), f_other(f.size());
    std::vector<int32_t> l(static_cast<size_t>(B)), l2(l.size());
    loader.features(step, 0, B, f.data());
    twin.features(step, 0, B, f2.data());
    other_seed.features(step, 0, B, f_other.data());
    loader.labels(step, 0, B, l.data());
    twin.labels(step, 0, B, l2.data());
    CHECK(bitwise_equal(f, f2));
    CHECK(l == l2);
    CHECK(!bitwise_equal(f, f_other));
    for (int32_t y : l) {
      REQUIRE(y >= 0);
      REQUIRE(y < cfg.n_classes);
      ++class_count[size_t(y)];
    }
    if (step < 4) {
      for (auto [first, count] : {std::pair<int, int>{0, 5}, {5, 11}, {9, 1}}) {
        std::vector<float> fp(size_t(count) * D);
        std::vector<int32_t> lp(static_cast<size_t>(count));
        loader.features(step, first, count, fp.data());
        loader.labels(step, first, count, lp.data());
        CHECK(std::memcmp(fp.data(), f.data() + size_t(first) * D, fp.size() * sizeof(float)) == 0);
        CHECK(std::equal(lp.begin(), lp.end(), l.begin() + first));
      }
    }
    if (step > 0) {
      std::vector<float> prev(f.size());
      loader.features(step - 1, 0, B, prev.data());
      CHECK(!bitwise_equal(f, prev));
    }
    all_features.insert(all_features.end(), f.begin(), f.end());
  }
  Stats s = stats_of(all_features);  // 12288 standard normal draws
  CHECK(std::fabs(s.mean) < 0.05);
  CHECK(std::fabs(s.std - 1.0) < 0.05);
  int used = 0;
  for (int c : class_count) used += c > 0;
  CHECK(used >= 3);  // 1024 labels from a random linear teacher use most classes
}

TEST_CASE("a token file that changes size under a loader is an error naming it, not a crash", "[data]") {
  const auto bytes = random_bytes(8000, 3);
  TempFile file("shrinks.txt", bytes);
  const int T = 16, B = 4;
  DataLoader loader(token_config(file.path.string(), T, B, 5, false));
  std::vector<int32_t> in(size_t(B) * T);
  loader.inputs(0, 0, B, in.data());
  auto message = [&](auto&& call) -> std::string {
    try {
      call();
    } catch (const DataFileChanged& e) {
      return e.what();
    }
    return "";
  };
  std::filesystem::resize_file(file.path, 100);  // every window now ends past the end of the file
  std::string e = message([&] { loader.inputs(1, 0, B, in.data()); });
  CHECK(has(e, "data.path: '" + file.path.string() + "' changed during the run"));
  CHECK(has(e, "it was 8000 bytes when the run started, now 100 bytes"));
  CHECK(has(message([&] { loader.targets(1, 0, B, in.data()); }), "now 100 bytes"));
  std::filesystem::resize_file(file.path, 9000);  // grown: also a change
  CHECK(has(message([&] { loader.inputs(1, 0, B, in.data()); }), "now 9000 bytes"));
  std::filesystem::resize_file(file.path, 8000);  // the same size again: reads go on
  CHECK(message([&] { loader.inputs(1, 0, B, in.data()); }) == "");
}

TEST_CASE("files larger than a read chunk are validated across chunk boundaries", "[data]") {
  // 3 Mi uint16 tokens (6 MiB, two 4 MiB chunks): the largest id sits in the second chunk
  const size_t n = size_t(3) << 20;
  std::vector<uint32_t> ids(n);
  for (size_t i = 0; i < n; ++i) ids[i] = uint32_t((i * 7919) % 1000);
  const size_t at = (size_t(5) << 20) / 2 + 17;  // token index in the second chunk
  ids[at] = 4242;
  ids[at + 1000] = 4242;
  TempFile file("big.u16.bin", le_bytes(ids, 2));
  DataConfig cfg = token_config(file.path.string(), 32, 4, 1, false);
  cfg.vocab = 5000;
  DataLoader loader(cfg);
  CHECK(loader.max_token() == std::pair<int64_t, int64_t>{4242, int64_t(at)});
  CHECK(data_error(cfg) == "");
  cfg.vocab = 4000;
  CHECK(has(data_error(cfg), "holds token id 4242 at position " + std::to_string(at)));
  // uint32 ids read as uint16: every odd word is 0 in both chunks
  std::vector<uint32_t> wide(n / 2);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = uint32_t(1 + i % 3000);
  TempFile u32("wide.u16.bin", le_bytes(wide, 4));
  DataConfig wide_cfg = token_config(u32.path.string(), 32, 4, 1, false);
  wide_cfg.vocab = 5000;
  CHECK(has(data_error(wide_cfg), "looks like little-endian uint32 token ids"));
}

// Schedules in the uniform cost model (F = BI = BW = 1, B = 2, communication free): GPipe's and 1F1B's
// bubble is (p−1)/(m+p−1), ZB-H1's idle time is at most 40% of 1F1B's, interleaving and DualPipeV beat
// 1F1B. And verification before launch: crossed microbatches, a mismatched collective order, a wait-for
// cycle and an order cycle are rejected with messages naming the ranks, instructions and directives.
#include <catch2/catch.hpp>

#include <functional>

#include "compile/compile.hpp"
#include "config/load.hpp"
#include "passes/passes.hpp"
#include "test_util.hpp"
#include "util/error.hpp"

using namespace piper;

namespace {

// An MLP pipeline with one layer per stage, placed by `rank_of`, in the uniform cost model.
std::string pipeline_job(const std::string& kind, int stages, int m, const std::function<int(int)>& rank_of) {
  std::string t = cat("[job]\nsteps = 1\n[model]\nkind = \"mlp\"\nd_in = 8\nd_hidden = 8\nn_layers = ", stages,
                      "\nn_classes = 4\n[data]\nbatch = ", 2 * m, "\n[cost]\nuniform = true\n[[annotate]]\ntag = \"PP\"\nlayers = [");
  for (int s = 0; s < stages; ++s) t += cat(s ? ", " : "", "[", s, ", ", s, "]");
  t += cat("]\n[[directive]]\nop = \"split\"\ncount = ", m, "\n");
  for (int s = 0; s < stages; ++s)
    t += cat("[[directive]]\nop = \"place\"\nfilter = { PP = ", s, " }\ndevices = [", rank_of(s), "]\n");
  if (!kind.empty()) t += cat("[[directive]]\nop = \"schedule\"\nkind = \"", kind, "\"\n");
  return t;
}

struct Outcome {
  double step = 0, bubble = 0;  // units; fraction of rank 0
};

Outcome simulate(const std::string& text, int world) {
  JobSpec spec = load_job_text(text, "job.toml");
  expand_mesh(spec, world);
  CompileResult r;
  compile_job(spec, world, r);
  return {r.simulation.step_time, r.simulation.bubble[0]};
}

int identity(int s) { return s; }

// The message of the UserError `fn` throws, or "" when it throws none.
template <typename Fn>
std::string user_error_of(Fn fn) {
  try {
    fn();
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("GPipe and 1F1B bubbles are (p-1)/(m+p-1) in the uniform model", "[schedules]") {
  for (int p : {2, 4})
    for (int m : {1, 2, 4, 8}) {
      for (const char* kind : {"gpipe", "1f1b"}) {
        Outcome o = simulate(pipeline_job(kind, p, m, identity), p);
        INFO(kind << " p=" << p << " m=" << m);
        CHECK(o.bubble == Approx(double(p - 1) / double(m + p - 1)).margin(1e-12));
        CHECK(o.step == Approx(3.0 * (m + p - 1)));
      }
    }
}

TEST_CASE("ZB-H1 idles at most 40% as long as 1F1B", "[schedules]") {
  // m >= p: stage r holds r deferred weight passes, so it needs at least p microbatches to hold them
  for (int p : {2, 4})
    for (int m : {p, 2 * p, 4 * p, 8 * p}) {
      Outcome zb = simulate(pipeline_job("zb-h1", p, m, identity), p);
      Outcome ref = simulate(pipeline_job("1f1b", p, m, identity), p);
      const double idle_zb = zb.step * zb.bubble, idle_ref = ref.step * ref.bubble;
      INFO("p=" << p << " m=" << m << " idle " << idle_zb << " vs " << idle_ref);
      CHECK(idle_zb <= 0.4 * idle_ref + 1e-9);
      CHECK(idle_zb == Approx(double(p - 1)));  // (p-1)(F + BI - BW) with unit passes
      if (m >= 4 * p) CHECK(zb.bubble <= 0.4 * ref.bubble);
    }
}

TEST_CASE("interleaved 1F1B and DualPipeV bubbles are below 1F1B's", "[schedules]") {
  for (int p : {2, 4}) {
    for (int m : {2 * p, 4 * p}) {
      Outcome ref = simulate(pipeline_job("1f1b", p, m, identity), p);
      Outcome inter = simulate(pipeline_job("interleaved-1f1b", 2 * p, m, [p](int s) { return s % p; }), p);
      Outcome dual =
          simulate(pipeline_job("dualpipev", 2 * p, m, [p](int s) { return s < p ? s : 2 * p - 1 - s; }), p);
      INFO("p=" << p << " m=" << m << " 1f1b " << ref.bubble << " interleaved " << inter.bubble << " dualpipev "
                << dual.bubble);
      CHECK(inter.bubble < ref.bubble);
      CHECK(dual.bubble < ref.bubble);
    }
  }
}

TEST_CASE("schedule generators reject layouts they cannot run", "[schedules]") {
  auto error_of = [](const std::string& text, int world) { return user_error_of([&] { simulate(text, world); }); };
  CHECK(error_of(pipeline_job("dualpipev", 4, 2, [](int s) { return s < 2 ? s : 3 - s; }), 2)
            .find("needs at least 2 × 2 = 4 microbatches") != std::string::npos);
  CHECK(error_of(pipeline_job("dualpipev", 4, 4, [](int s) { return s % 2; }), 2).find("needs the V layout") !=
        std::string::npos);
  CHECK(error_of(pipeline_job("interleaved-1f1b", 4, 3, [](int s) { return s % 2; }), 2).find("multiple of the pipeline") !=
        std::string::npos);
  CHECK(error_of(pipeline_job("1f1b", 4, 4, [](int s) { return s % 2; }), 2).find("one stage per pipeline rank") !=
        std::string::npos);
}

TEST_CASE("crossed microbatches on neighbouring ranks are rejected before launch", "[verify]") {
  std::string text = pipeline_job("", 2, 2, identity);
  text += "[[directive]]\nop = \"order\"\nfilters = [[{PP = 0, MB = 0, PASS = \"F\"}], [{PP = 0, MB = 1, PASS = \"F\"}]]\n";
  text += "[[directive]]\nop = \"order\"\nfilters = [[{PP = 1, MB = 1, PASS = \"F\"}], [{PP = 1, MB = 0, PASS = \"F\"}]]\n";
  std::string e = user_error_of([&] { simulate(text, 2); });
  INFO(e);
  CHECK(e.find("rank 0 -> rank 1") != std::string::npos);
  CHECK(e.find("SEND act1.mb0") != std::string::npos);
  CHECK(e.find("RECV act1.mb1") != std::string::npos);
  CHECK(e.find("directive #3") != std::string::npos);
  CHECK(e.find("directive #4") != std::string::npos);
}

TEST_CASE("an order cycle across ranks names the nodes, ranks and directive", "[verify]") {
  std::string text = pipeline_job("", 2, 2, identity);
  text += "[[directive]]\nop = \"order\"\nfilters = [[{PP = 0, MB = 0, PASS = \"F\"}], [{PP = 0, MB = 0, PASS = \"B\"}], "
          "[{PP = 0, MB = 1, PASS = \"F\"}]]\n";
  text += "[[directive]]\nop = \"order\"\nfilters = [[{PP = 1, MB = 1, PASS = \"F\"}], [{PP = 1, MB = 0, PASS = \"B\"}]]\n";
  std::string e = user_error_of([&] { simulate(text, 2); });
  INFO(e);
  CHECK(e.find("cycle") != std::string::npos);
  CHECK(e.find("on rank 0") != std::string::npos);
  CHECK(e.find("on rank 1") != std::string::npos);
  CHECK(e.find("directive #4") != std::string::npos);
}

namespace {

// A PP2 GPT whose tied embedding is summed across the two sets by one all-reduce per step.
void compile_tied_pipeline(CompileResult& r) {
  std::string text =
      "[model]\nkind = \"gpt\"\nvocab = 256\nseq_len = 8\nd_model = 16\nn_layers = 2\nn_heads = 2\nd_ff = 32\n"
      "[data]\npath = \"" + piper::test::scratch_data_file() + "\"\nbatch = 4\n[mesh]\npp = 2\nmicrobatches = 2\n";
  JobSpec spec = load_job_text(text, "job.toml");
  expand_mesh(spec, 2);
  compile_job(spec, 2, r);
}

}  // namespace

TEST_CASE("a mismatched collective order is rejected", "[verify]") {
  CompileResult r;
  compile_tied_pipeline(r);
  // Give set 1 a second collective on the group it shares with set 0, before the tied all-reduce.
  Plan& p = r.bodies[1];
  auto tie = std::find_if(p.instrs.begin(), p.instrs.end(), [&](const Instr& in) {
    return in.op == Op::AllReduce && p.groups[size_t(in.group())].kind == GroupRef::Kind::AcrossSets;
  });
  REQUIRE(tie != p.instrs.end());
  Instr extra = *tie;
  extra.op = Op::AllGather;
  extra.waits.clear();
  p.instrs.insert(tie, extra);
  std::string e = user_error_of([&] { simulate_plans(r.bodies, r.cost, {}); });
  INFO(e);
  CHECK(e.find("issue collectives in different orders") != std::string::npos);
  CHECK(e.find("rank 0") != std::string::npos);
  CHECK(e.find("rank 1") != std::string::npos);
  CHECK(e.find("ALL_GATHER") != std::string::npos);
}

TEST_CASE("a wait-for cycle between plans is reported as a deadlock", "[verify]") {
  CompileResult r;
  compile_tied_pipeline(r);
  // Make set 0's first send wait for its own last instruction: it can never start.
  Plan& p = r.bodies[0];
  auto send = std::find_if(p.instrs.begin(), p.instrs.end(), [](const Instr& in) { return in.op == Op::Send; });
  REQUIRE(send != p.instrs.end());
  send->waits.push_back(int32_t(p.instrs.size() - 1));
  std::string e = user_error_of([&] { simulate_plans(r.bodies, r.cost, {}); });
  INFO(e);
  CHECK(e.find("deadlock") != std::string::npos);
  CHECK(e.find("never starts") != std::string::npos);
  CHECK(e.find("rank 0 instruction") != std::string::npos);
  CHECK(e.find("rank 1 instruction") != std::string::npos);
}

TEST_CASE("a crossed order on one stage of a 4,096-rank job is found", "[verify]") {
  // PP16 x DP256: sixteen device sets of 256 replicas, each set's body checked once for the whole job.
  std::string text =
      "[model]\nkind = \"gpt\"\nvocab = 256\nseq_len = 8\nd_model = 16\nn_layers = 16\nn_heads = 2\nd_ff = 32\n"
      "[data]\npath = \"" + piper::test::scratch_data_file() + "\"\nbatch = 1024\n"
      "[mesh]\npp = 16\ndp = 256\nmicrobatches = 4\n";
  JobSpec spec = load_job_text(text, "job.toml");
  expand_mesh(spec, 4096);
  CompileResult r;
  compile_job(spec, 4096, r);
  REQUIRE(r.bodies.size() == 16);
  // Stage 7 sends its first two activations to stage 8 the other way round.
  Plan& p = r.bodies[7];
  std::vector<Instr*> sends;
  for (Instr& in : p.instrs)
    if (in.op == Op::Send && in.message().peer_set == 8) sends.push_back(&in);
  REQUIRE(sends.size() >= 2);
  std::swap(std::get<MessageArgs>(sends[0]->args).tag, std::get<MessageArgs>(sends[1]->args).tag);
  std::string e = user_error_of([&] { simulate_plans(r.bodies, r.cost, {}); });
  INFO(e);
  CHECK(e.find("transfer in different orders") != std::string::npos);
  // the untouched job passes
  CompileResult clean;
  compile_job(spec, 4096, clean);
  CHECK_NOTHROW(simulate_plans(clean.bodies, clean.cost, {}));
}

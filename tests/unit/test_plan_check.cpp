// The plan check (check_plan, run by deserialize_plan): every body the compiler writes passes it, and each
// kind of corruption — an index, a wait, a use count, a size, the model's dimensions, a boolean byte — is
// rejected with a SystemError that names it, instead of reaching the executor.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <new>

#include "compile/compile.hpp"
#include "config/load.hpp"
#include "passes/passes.hpp"
#include "test_util.hpp"
#include "util/error.hpp"

using namespace piper;

namespace {

struct Job {
  const char* what;
  std::string text;
  int world;
};

std::vector<Job> jobs() {
  const std::string data = test::scratch_data_file();
  return {
      {"GPT-2, 2 stages of 2 replicas, ZeRO-3 (gathers, a tied embedding across sets)",
       "[job]\nsteps = 1\n[model]\nkind = \"gpt\"\nvocab = 256\nseq_len = 16\nd_model = 32\nn_layers = 2\n"
       "n_heads = 4\nd_ff = 64\n[data]\npath = \"" + data + "\"\nbatch = 8\n"
       "[mesh]\npp = 2\ndp = 2\nmicrobatches = 2\nzero = 3\n",
       4},
      {"Qwen3-MoE, experts sharded over 2 ranks (all-to-all, linked stashes, owned slices), ZeRO-1",
       "[job]\nsteps = 1\n[model]\nkind = \"qwen3\"\nvocab = 256\nseq_len = 16\nd_model = 32\nn_layers = 2\n"
       "n_heads = 4\nn_kv_heads = 2\nhead_dim = 8\nd_ff = 48\n[model.moe]\nexperts = 4\ntop_k = 2\nd_expert = 16\n"
       "[data]\npath = \"" + data + "\"\nbatch = 4\n"
       "[[annotate]]\ntag = \"EP\"\nsegments = [[\"model.layers.0.mlp.experts\", \"model.layers.0.mlp.experts\"],"
       " [\"model.layers.1.mlp.experts\", \"model.layers.1.mlp.experts\"]]\n"
       "[[directive]]\nop = \"replicate\"\nfilter = {}\nzero = 1\n"
       "[[directive]]\nop = \"shard\"\nfilter = { EP = \"*\" }\n",
       2},
      {"Qwen3, 2 stages of 2 replicas under ZB-H1, ZeRO-3, full recompute (reruns before split backward)",
       "[job]\nsteps = 1\n[model]\nkind = \"qwen3\"\nvocab = 256\nseq_len = 16\nd_model = 32\nn_layers = 2\n"
       "n_heads = 4\nn_kv_heads = 2\nhead_dim = 8\nd_ff = 48\n[data]\npath = \"" + data + "\"\nbatch = 8\n"
       "[mesh]\npp = 2\ndp = 2\nmicrobatches = 4\nzero = 3\nschedule = \"zb-h1\"\nrecompute = \"full\"\n",
       4},
      {"MLP, 2 replicas, ZeRO-2 (reduce-scatter)",
       "[job]\nsteps = 1\n[model]\nkind = \"mlp\"\nd_in = 8\nd_hidden = 16\nn_layers = 3\nn_classes = 4\n"
       "[data]\nbatch = 8\n[mesh]\ndp = 2\nzero = 2\nmicrobatches = 2\n",
       2},
  };
}

std::vector<Plan> bodies(const Job& job) {
  JobSpec spec = load_job_text(job.text, "job.toml");
  expand_mesh(spec, job.world);
  CompileResult r;
  compile_job(spec, job.world, r);
  return r.bodies;
}

// The message of the SystemError check_plan throws for `p`, or "" when it accepts it.
std::string check_error(const Plan& p) {
  try {
    check_plan(p);
  } catch (const SystemError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

// The first instruction of `op` in the plan.
Instr& first(Plan& p, Op op) {
  for (Instr& in : p.instrs)
    if (in.op == op) return in;
  FAIL("no " << op_name(op) << " instruction");
  return p.instrs[0];
}

}  // namespace

TEST_CASE("every plan body the compiler writes reads back through the plan check", "[plan]") {
  for (const Job& job : jobs()) {
    INFO(job.what);
    for (const Plan& body : bodies(job)) {
      const std::vector<uint8_t> bytes = serialize_plan(body);
      Plan back;
      REQUIRE_NOTHROW(back = deserialize_plan(bytes.data(), bytes.size()));
      CHECK(back.instrs.size() == body.instrs.size());
      CHECK(back.buffers.size() == body.buffers.size());
      for (int rank : back.sets[size_t(back.set)]) CHECK_NOTHROW(check_plan(bind_plan(back, rank)));
    }
  }
}

// Default-constructed over memory full of 0xAB, a struct the plan copies byte for byte must leave none of
// those bytes: each padding byte is a member, so that the same job gives the same plan bytes every run.
template <typename T>
bool leaves_no_stale_byte() {
  alignas(T) unsigned char raw[sizeof(T)];
  std::memset(raw, 0xAB, sizeof(raw));
  T* t = new (raw) T;  // default-initialization: implicit padding would keep 0xAB
  bool clean = true;
  for (unsigned char b : raw) clean &= b != 0xAB;
  t->~T();
  return clean;
}

TEST_CASE("the structs a plan copies byte for byte have no implicit padding, so plans are reproducible", "[plan]") {
  CHECK(leaves_no_stale_byte<ModelDims>());
  CHECK(leaves_no_stale_byte<PlanBucket>());
  CHECK(leaves_no_stale_byte<PlanParam>());
  for (const Job& job : jobs()) {
    INFO(job.what);
    const std::vector<Plan> first = bodies(job);
    std::vector<std::vector<unsigned char>> churn(64, std::vector<unsigned char>(4096, 0xAB));  // stale heap
    churn.clear();
    const std::vector<Plan> second = bodies(job);
    REQUIRE(first.size() == second.size());
    for (size_t s = 0; s < first.size(); ++s) CHECK(serialize_plan(first[s]) == serialize_plan(second[s]));
  }
}

TEST_CASE("the plan check names each kind of corruption", "[plan]") {
  const std::vector<Plan> gpt = bodies(jobs()[0]);
  const Plan& good = gpt[1];  // the last stage: head, tied embedding, sends back, gathers
  REQUIRE(check_error(good).empty());
  auto expect = [&](const std::string& what, const std::function<void(Plan&)>& corrupt, const std::string& message) {
    INFO(what);
    Plan p = good;
    corrupt(p);
    const std::string e = check_error(p);
    INFO(e);
    CHECK(has(e, "corrupt plan: "));
    CHECK(has(e, message));
  };
  expect("a buffer index past the table", [](Plan& p) { std::get<MessageArgs>(first(p, Op::Recv).args).buf = int32_t(p.buffers.size()); },
         "buffer " + std::to_string(good.buffers.size()) + " out of range");
  expect("no stash", [](Plan& p) { std::get<ComputeArgs>(first(p, Op::Forward).args).stash = -1; }, "stash -1 out of range");
  expect("a wait for a later instruction", [](Plan& p) { p.instrs[0].waits = {3}; },
         "waits for instruction 3, not an earlier one");
  expect("a use count that would free a buffer early", [](Plan& p) {
    for (auto& b : p.buffers)
      if (!b.persistent) { ++b.uses; break; }
  }, "counted");
  expect("a message longer than its buffer", [](Plan& p) {
    MessageArgs& in = std::get<MessageArgs>(first(p, Op::Send).args);
    in.count = int64_t(p.buffers[size_t(in.buf)].bytes / 4) + 1;
  }, "is too small for floats");
  expect("a gather into too small a buffer", [](Plan& p) { std::get<CollectiveArgs>(first(p, Op::AllGather).args).count *= 2; },
         "gathered buffer");
  expect("a send carrying a collective's payload", [](Plan& p) { first(p, Op::Send).args = CollectiveArgs{}; },
         "a payload of another kind than its op");
  expect("a stream past the table", [](Plan& p) { p.instrs.back().stream = uint8_t(p.streams.size()); },
         "stream " + std::to_string(good.streams.size()) + " out of range");
  expect("a device set past the table", [](Plan& p) { p.set = 7; }, "device set 7 out of range");
  expect("a rank in two sets", [](Plan& p) { p.sets[0][0] = p.sets[1][0]; }, "is in two device sets");
  expect("a group naming another set", [](Plan& p) {
    for (GroupRef& g : p.groups)
      if (g.kind == GroupRef::Kind::DeviceSet) { g.sets = {1 - p.set}; break; }
  }, "does not hold it");
  expect("a parameter outside its bucket", [](Plan& p) { p.plan_params.back().offset += 1 << 20; },
         "outside its bucket");
  expect("a segment parameter with no place here", [](Plan& p) { p.plan_params.pop_back(); }, "not on this device set");
  expect("a wider MLP than its parameters", [](Plan& p) { p.dims.d_ff *= 2; },
         "parameters differ from what the model's dimensions give");
  expect("a derived dimension that does not follow", [](Plan& p) { p.dims.d_model *= 2; },
         "dimensions differ from what model.kind = \"gpt\" derives from them");
  expect("dimensions no job file could have", [](Plan& p) { p.dims.n_heads = 3; },
         "dimensions a job file could not have");
  expect("data of another sequence length", [](Plan& p) { p.data.seq_len += 1; }, "data settings differ");
  expect("a log interval of 0", [](Plan& p) { p.log_every = 0; }, "log_every");
  expect("more samples than the replica has", [](Plan& p) { std::get<ComputeArgs>(first(p, Op::Forward).args).sample_offset = p.samples_per_replica; },
         "outside the replica's");
}

TEST_CASE("experts learn their row counts from the plan: a counts read where no exchange brings them", "[plan]") {
  Job local = jobs()[1];
  local.text = local.text.substr(0, local.text.find("[[annotate]]"));  // one process: the experts are local
  local.world = 1;
  const Plan good = bodies(local)[0];
  REQUIRE(check_error(good).empty());
  int reads = 0;
  for (const Instr& in : good.instrs) reads += in.op == Op::ReadCounts;
  CHECK(reads == 2);  // one per MoE layer and microbatch
  const std::vector<Plan> sharded = bodies(jobs()[1]);
  for (const Instr& in : sharded[0].instrs) CHECK(in.op != Op::ReadCounts);  // the exchange brings the counts
  Plan p = good;
  CountsArgs& read = std::get<CountsArgs>(first(p, Op::ReadCounts).args);
  read.buf = std::get<ComputeArgs>(first(p, Op::Forward).args).stash;  // the counts of another buffer
  const std::string e = check_error(p);
  INFO(e);
  CHECK(has(e, "whose counts no earlier exchange or counts read brings to the host"));
}

TEST_CASE("plan bytes with a boolean byte that is neither 0 nor 1 are rejected before it is read", "[plan]") {
  Plan p = bodies(jobs()[0])[0];
  // where the bytes of model.tie_embeddings sit: serialize with it false and true, find the byte that differs
  p.dims.tie_embeddings = false;
  const std::vector<uint8_t> a = serialize_plan(p);
  p.dims.tie_embeddings = true;
  const std::vector<uint8_t> b = serialize_plan(p);
  REQUIRE(a.size() == b.size());
  size_t at = a.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) at = i;
  REQUIRE(at < a.size());
  std::vector<uint8_t> bad = a;
  bad[at] = 2;
  CHECK_THROWS_WITH(deserialize_plan(bad.data(), bad.size()), Catch::Contains("a boolean holds neither 0 nor 1"));
  // and a truncated plan, at every tenth length
  for (size_t n = 0; n < a.size(); n += a.size() / 10 + 1) {
    INFO(n << " of " << a.size() << " bytes");
    CHECK_THROWS_AS(deserialize_plan(a.data(), n), SystemError);
  }
}

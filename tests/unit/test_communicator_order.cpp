// Communicator set-up and teardown order: on both ends of every point-to-point channel and on every member
// of every group, the communicators two ranks share come in the same order (else NCCL's blocking set-up
// and teardown deadlock); and the "same device" decision by device identity, not ordinal.
#include <mpi.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "backend/device_identity.hpp"
#include "compile/compile.hpp"
#include "config/load.hpp"
#include "passes/passes.hpp"
#include "runtime/communicator_order.hpp"
#include "test_util.hpp"

using namespace piper;

namespace {

// The plan of every rank of a job of `world` ranks.
std::vector<Plan> rank_plans(const std::string& text, int world) {
  JobSpec spec = load_job_text(text, "job.toml");
  expand_mesh(spec, world);
  CompileResult r;
  compile_job(spec, world, r);
  const std::vector<int> set_of = rank_sets(r.graph);
  std::vector<Plan> plans;
  for (int rank = 0; rank < world; ++rank) plans.push_back(bind_plan(r.bodies[size_t(set_of[size_t(rank)])], rank));
  return plans;
}

std::string pp4_dp2_job() {
  return "[job]\nsteps = 1\n[model]\nkind = \"gpt\"\nvocab = 256\nseq_len = 16\nd_model = 32\nn_layers = 4\n"
         "n_heads = 4\nd_ff = 64\n[data]\npath = \"" + test::scratch_data_file() + "\"\nbatch = 8\n"
         "[mesh]\npp = 4\ndp = 2\nmicrobatches = 4\nzero = 1\n";
}

// One communicator as both of its ends name it.
using Name = std::tuple<int, ChannelKey>;
Name name_of(const CommunicatorStep& s) { return {s.group, s.channel}; }

std::string str(const Name& n) {
  std::ostringstream o;
  if (std::get<0>(n) >= 0) {
    o << "group " << std::get<0>(n);
  } else {
    const ChannelKey& k = std::get<1>(n);
    o << "channel " << (k.low_sends ? k.low : k.high) << "->" << (k.low_sends ? k.high : k.low) << " (" << k.stream
      << ")";
  }
  return o.str();
}

// The first pair of ranks whose shared communicators come in different orders, or a communicator one of
// its members lacks; "" when every pair agrees.
std::string first_disagreement(const std::vector<std::vector<CommunicatorStep>>& orders) {
  const int world = int(orders.size());
  for (int a = 0; a < world; ++a) {
    for (const CommunicatorStep& s : orders[size_t(a)])
      for (int32_t member : s.ranks) {
        const auto& theirs = orders[size_t(member)];
        if (std::none_of(theirs.begin(), theirs.end(), [&](const CommunicatorStep& t) { return name_of(t) == name_of(s); }))
          return str(name_of(s)) + " of rank " + std::to_string(a) + " is missing on rank " + std::to_string(member);
      }
    for (int b = a + 1; b < world; ++b) {
      auto shared = [&](int self, int other) {
        std::vector<Name> out;
        for (const CommunicatorStep& s : orders[size_t(self)])
          if (std::count(s.ranks.begin(), s.ranks.end(), other)) out.push_back(name_of(s));
        return out;
      };
      const std::vector<Name> on_a = shared(a, b), on_b = shared(b, a);
      if (on_a != on_b) {
        std::string msg = "ranks " + std::to_string(a) + " and " + std::to_string(b) + " disagree:";
        for (size_t i = 0; i < std::min(on_a.size(), on_b.size()); ++i)
          if (on_a[i] != on_b[i]) return msg + " " + str(on_a[i]) + " vs " + str(on_b[i]) + " at " + std::to_string(i);
        return msg + " different counts";
      }
    }
  }
  return "";
}

}  // namespace

TEST_CASE("both ends of every channel and every group member of a PP4xDP2 plan agree on the setup and teardown order",
          "[communicators]") {
  const std::vector<Plan> plans = rank_plans(pp4_dp2_job(), 8);
  std::vector<std::vector<CommunicatorStep>> orders;
  size_t channels = 0, groups = 0;
  std::map<std::string, int> streams;
  for (const Plan& p : plans) {
    orders.push_back(communicator_order(p));
    for (const CommunicatorStep& s : orders.back()) {
      (s.group >= 0 ? groups : channels) += 1;
      if (s.group < 0) streams[s.channel.stream] += 1;
    }
  }
  // 3 stage boundaries x 2 replicas x 2 directions, counted on both ends; DP groups on every rank
  CHECK(channels == 3 * 2 * 2 * 2);
  CHECK(groups >= 8);
  CHECK(streams.size() >= 2);  // forward activations and backward gradients travel on streams of their own
  CHECK(first_disagreement(orders) == "");

  // The order every rank used to tear channels down in, by (peer, sending, stream) from its own side, is
  // not shared: the check above would catch it.
  std::vector<std::vector<CommunicatorStep>> own_side = orders;
  for (size_t r = 0; r < own_side.size(); ++r) {
    auto& steps = own_side[r];
    auto first_channel = std::find_if(steps.begin(), steps.end(), [](const CommunicatorStep& s) { return s.group < 0; });
    std::sort(first_channel, steps.end(), [&](const CommunicatorStep& x, const CommunicatorStep& y) {
      auto side = [&](const CommunicatorStep& s) {
        const int peer = s.channel.low == int(r) ? s.channel.high : s.channel.low;
        const bool sending = (s.channel.low_sends ? s.channel.low : s.channel.high) == int(r);
        return std::make_tuple(peer, sending, s.channel.stream);
      };
      return side(x) < side(y);
    });
  }
  CHECK(first_disagreement(own_side) != "");
}

TEST_CASE("a channel has the same key on its two ends", "[communicators]") {
  const ChannelKey at_sender = channel_key(5, {2, true, "p2p.bwd"});
  const ChannelKey at_receiver = channel_key(2, {5, false, "p2p.bwd"});
  CHECK(at_sender == at_receiver);
  CHECK(at_sender.low == 2);
  CHECK(at_sender.high == 5);
  CHECK_FALSE(at_sender.low_sends);
  // the other direction between the same ranks is another channel
  CHECK(channel_key(2, {5, true, "p2p.bwd"}) != at_sender);
}

TEST_CASE("ranks that each see their own GPU as device 0 do not share a device", "[communicators]") {
  // Two ranks with one visible GPU each (CUDA_VISIBLE_DEVICES per rank): both report ordinal 0.
  const std::string rank0 = device_identity("node17", "GPU-5b1a0e2c-0000-0000-0000-000000000001");
  const std::string rank1 = device_identity("node17", "GPU-9f3c7d41-0000-0000-0000-000000000002");
  CHECK_FALSE(identities_repeat({rank0, rank1}));
  // Two ranks on the same GPU, and the same GPU name on two hosts.
  CHECK(identities_repeat({rank0, rank1, rank0}));
  CHECK_FALSE(identities_repeat({device_identity("node17", "GPU-a"), device_identity("node18", "GPU-a")}));

  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) REQUIRE(MPI_Init(nullptr, nullptr) == MPI_SUCCESS);
  CHECK(gather_identities(MPI_COMM_SELF, rank1) == std::vector<std::string>{rank1});
  CHECK_FALSE(members_share_a_device(MPI_COMM_SELF, rank0));
}

// Setup and teardown order of a rank's communicators (see communicator_order.hpp): groups as the job
// lists them, then point-to-point channels by the key both ends share.
#include "runtime/communicator_order.hpp"

#include <algorithm>

namespace piper {

ChannelKey channel_key(int self, const PeerChannel& c) {
  ChannelKey k;
  k.low = std::min(self, c.peer);
  k.high = std::max(self, c.peer);
  k.stream = c.stream;
  const int sender = c.sending ? self : c.peer;
  k.low_sends = sender == k.low;
  return k;
}

std::vector<PeerChannel> plan_peer_channels(const Plan& plan) {
  std::vector<PeerChannel> out;
  for (const Instr& in : plan.instrs) {
    if (in.op != Op::Send && in.op != Op::Recv) continue;
    PeerChannel c;
    c.peer = plan.peer_rank(in.message().peer_set);
    c.sending = in.op == Op::Send;
    c.stream = plan.streams[size_t(in.stream)];
    if (std::find(out.begin(), out.end(), c) == out.end()) out.push_back(c);
  }
  std::sort(out.begin(), out.end(), [&](const PeerChannel& a, const PeerChannel& b) {
    return channel_key(plan.rank, a) < channel_key(plan.rank, b);
  });
  return out;
}

std::vector<CommunicatorStep> communicator_order(const Plan& plan) {
  std::vector<CommunicatorStep> out;
  for (size_t g = 0; g < plan.all_groups.size(); ++g) {
    const GroupRef& ref = plan.all_groups[g];
    if (std::find(plan.groups.begin(), plan.groups.end(), ref) == plan.groups.end()) continue;
    CommunicatorStep step;
    step.group = int(g);
    step.ranks = plan.group_ranks(ref);
    out.push_back(step);
  }
  for (const PeerChannel& c : plan_peer_channels(plan)) {
    CommunicatorStep step;
    step.channel = channel_key(plan.rank, c);
    step.ranks = {step.channel.low, step.channel.high};
    out.push_back(step);
  }
  return out;
}

}  // namespace piper

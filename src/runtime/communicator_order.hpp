// The order in which a rank sets up and tears down its communicators: the job's groups in the order of
// Plan::all_groups, then its point-to-point channels sorted by a key both ends of a channel compute alike.
#pragma once
#include <compare>
#include <string>
#include <vector>

#include "backend/backend.hpp"
#include "plan/plan.hpp"

namespace piper {

// What names one point-to-point channel on both of its ends: the pair of world ranks, the stream and the
// direction. Channels are set up and destroyed in increasing key order on every rank, so the smallest
// channel not yet done always has both ends ready for it: blocking setups and teardowns cannot deadlock.
struct ChannelKey {
  int low = -1, high = -1;  // world ranks, low < high
  std::string stream;
  bool low_sends = false;   // the transfers go from `low` to `high`
  auto operator<=>(const ChannelKey&) const = default;
  bool operator==(const ChannelKey&) const = default;
};
ChannelKey channel_key(int self_world_rank, const PeerChannel& c);

// Every channel the plan's sends and receives use, once each, in increasing ChannelKey order.
std::vector<PeerChannel> plan_peer_channels(const Plan& plan);

// One communicator of a rank in its setup (and teardown) order: a group (index into Plan::all_groups)
// or a point-to-point channel, with the world ranks that take part in setting it up.
struct CommunicatorStep {
  int group = -1;              // >= 0: a group
  ChannelKey channel;          // group < 0: a channel
  std::vector<int32_t> ranks;  // members
  bool operator==(const CommunicatorStep&) const = default;
};
// The setup order of `plan`'s rank: its groups as Plan::all_groups lists them, then its channels.
std::vector<CommunicatorStep> communicator_order(const Plan& plan);

}  // namespace piper

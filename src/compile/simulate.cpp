// Whole-job simulation: channel and collective matching, then event times by topological order over
// start/end events of every instruction (see simulate.hpp). Events left unordered are a deadlock.
#include "compile/simulate.hpp"

#include <algorithm>
#include <map>
#include <queue>
#include <tuple>

#include "util/error.hpp"

namespace piper {

namespace {

struct Ref {
  int set;
  int32_t instr;
};

std::string where(const std::vector<Plan>& b, int set) {
  const auto& ranks = b[size_t(set)].sets[size_t(set)];
  return ranks.size() == 1 ? cat("rank ", ranks[0]) : cat("rank ", ranks[0], " (and its ", ranks.size() - 1, " replicas)");
}

// What the members of a group must agree on for one collective: the floats of each one's part (reductions
// and gathers), or the row width (exchanges).
int64_t collective_shape(const Instr& in) {
  if (auto* c = std::get_if<CollectiveArgs>(&in.args)) return c->count;
  if (auto* a = std::get_if<AllToAllArgs>(&in.args)) return a->row_width;
  return 0;
}

std::string describe(const std::vector<Plan>& b, Ref r) {
  const Plan& p = b[size_t(r.set)];
  return cat(where(b, r.set), " instruction ", r.instr, " '", instr_label(p, p.instrs[size_t(r.instr)]), "'");
}

std::string origin(const OrderOrigins& o, int set) {
  if (size_t(set) < o.per_set.size() && !o.per_set[size_t(set)].empty()) return o.per_set[size_t(set)];
  return "the default order";
}

class Simulator {
 public:
  Simulator(const std::vector<Plan>& b, const CostModel& c, const OrderOrigins& o) : b_(b), cost_(c), origins_(o) {
    base_.resize(b.size());
    size_t total = 0;
    for (size_t s = 0; s < b.size(); ++s) {
      base_[s] = total;
      total += b[s].instrs.size();
    }
    n_ = total;
    time_.assign(2 * n_, 0.0);
    deps_.assign(2 * n_, {});
    duration_.assign(n_, 0.0);
  }

  Simulation run() {
    match_channels();
    match_collectives();
    add_stream_and_wait_edges();
    compute_durations();
    return schedule();
  }

 private:
  const std::vector<Plan>& b_;
  const CostModel& cost_;
  const OrderOrigins& origins_;
  std::vector<size_t> base_;
  size_t n_ = 0;
  std::vector<double> time_;                 // event times: 2i start, 2i+1 end
  std::vector<std::vector<size_t>> deps_;    // event → events it needs
  std::vector<double> duration_;

  size_t id(Ref r) const { return base_[size_t(r.set)] + size_t(r.instr); }
  size_t start(Ref r) const { return 2 * id(r); }
  size_t end(Ref r) const { return 2 * id(r) + 1; }

  // Point-to-point: the k-th SEND on channel (a → b, stream) meets the k-th RECV on b from a.
  using Channel = std::tuple<int, int, std::string>;
  void match_channels() {
    std::map<Channel, std::vector<Ref>> sends, recvs;
    for (size_t s = 0; s < b_.size(); ++s)
      for (size_t i = 0; i < b_[s].instrs.size(); ++i) {
        const Instr& in = b_[s].instrs[i];
        const std::string& stream = b_[s].streams[in.stream];
        if (in.op == Op::Send) sends[{int(s), in.message().peer_set, stream}].push_back({int(s), int32_t(i)});
        if (in.op == Op::Recv) recvs[{in.message().peer_set, int(s), stream}].push_back({int(s), int32_t(i)});
      }
    std::map<Channel, bool> channels;
    for (const auto& [k, v] : sends) channels[k] = true;
    for (const auto& [k, v] : recvs) channels[k] = true;
    for (const auto& [ch, unused] : channels) {
      const auto& ss = sends[ch];
      const auto& rr = recvs[ch];
      for (size_t k = 0; k < std::max(ss.size(), rr.size()); ++k) {
        if (k >= ss.size() || k >= rr.size()) {
          const Ref extra = k < ss.size() ? ss[k] : rr[k];
          throw UserError(cat("plans do not match: on the channel ", where(b_, std::get<0>(ch)), " -> ",
                              where(b_, std::get<1>(ch)), " (", std::get<2>(ch), ")",
                              ", ", describe(b_, extra), " has no counterpart (", ss.size(), " sends, ", rr.size(),
                              " receives)"));
        }
        const MessageArgs& si = b_[size_t(ss[k].set)].instrs[size_t(ss[k].instr)].message();
        const MessageArgs& ri = b_[size_t(rr[k].set)].instrs[size_t(rr[k].instr)].message();
        if (si.tag != ri.tag || si.count != ri.count)
          throw UserError(cat("plans would deadlock: on the channel ", where(b_, std::get<0>(ch)), " -> ",
                              where(b_, std::get<1>(ch)), " (", std::get<2>(ch), ") message ", k + 1, " is ",
                              describe(b_, ss[k]),
                              " on the sending side but ", describe(b_, rr[k]),
                              " on the receiving side; the two ranks transfer in different orders (orders from ",
                              origin(origins_, std::get<0>(ch)), " and ", origin(origins_, std::get<1>(ch)),
                              "): each channel must be received in the order it is sent"));
        // a transfer ends when both ends have posted it
        deps_[end(ss[k])].push_back(start(rr[k]));
        deps_[end(rr[k])].push_back(start(ss[k]));
      }
    }
  }

  // Collectives: every member of a group issues the same sequence. One replica stands for a set, so a
  // group inside one set needs nothing; groups spanning sets (and the world) are matched here.
  void match_collectives() {
    std::map<GroupRef, std::map<int, std::vector<Ref>>> seq;
    for (size_t s = 0; s < b_.size(); ++s)
      for (size_t i = 0; i < b_[s].instrs.size(); ++i) {
        const Instr& in = b_[s].instrs[i];
        const OpKind kind = op_info(in.op).kind;
        const bool collective = kind == OpKind::Collective || kind == OpKind::StepSync;
        if (!collective) continue;
        const GroupRef& g = b_[s].groups[size_t(in.group())];
        if (g.kind == GroupRef::Kind::DeviceSet || g.kind == GroupRef::Kind::SetBlock ||
            g.kind == GroupRef::Kind::SetStride)
          continue;
        seq[g][int(s)].push_back({int(s), int32_t(i)});
      }
    for (const auto& [g, members] : seq) {
      std::vector<int> sets;
      if (g.kind == GroupRef::Kind::World)
        for (size_t s = 0; s < b_.size(); ++s) sets.push_back(int(s));
      else
        sets.assign(g.sets.begin(), g.sets.end());
      size_t len = 0;
      for (int s : sets) len = std::max(len, members.count(s) ? members.at(s).size() : size_t(0));
      for (size_t k = 0; k < len; ++k) {
        Ref first{-1, -1};
        for (int s : sets) {
          auto it = members.find(s);
          if (it == members.end() || k >= it->second.size())
            throw UserError(cat("plans would deadlock: group ", g.str(), " collective ", k + 1, " is issued by ",
                                first.set >= 0 ? describe(b_, first) : std::string("some members"), " but never by ",
                                where(b_, s)));
          const Ref r = it->second[k];
          if (first.set < 0) {
            first = r;
            continue;
          }
          const Instr& a = b_[size_t(first.set)].instrs[size_t(first.instr)];
          const Instr& c = b_[size_t(r.set)].instrs[size_t(r.instr)];
          if (a.op != c.op || collective_shape(a) != collective_shape(c))
            throw UserError(cat("plans would deadlock: the members of group ", g.str(),
                                " issue collectives in different orders: collective ", k + 1, " is ",
                                describe(b_, first), " but ", describe(b_, r)));
        }
        for (int s : sets)
          for (int t : sets) deps_[end(members.at(s)[k])].push_back(start(members.at(t)[k]));
      }
    }
  }

  // In-order streams: synchronous work starts after the previous one ends; posted communication lets
  // the stream go on. Explicit waits need the waited-for instruction's end.
  void add_stream_and_wait_edges() {
    for (size_t s = 0; s < b_.size(); ++s) {
      const Plan& p = b_[s];
      std::vector<int32_t> last(p.streams.size(), -1);
      for (size_t i = 0; i < p.instrs.size(); ++i) {
        const Instr& in = p.instrs[i];
        Ref r{int(s), int32_t(i)};
        int32_t prev = last[in.stream];
        if (prev >= 0) {
          Ref pr{int(s), prev};
          deps_[start(r)].push_back(op_is_async(p.instrs[size_t(prev)].op) ? start(pr) : end(pr));
        }
        last[in.stream] = int32_t(i);
        for (int32_t j : in.waits) deps_[start(r)].push_back(end({int(s), j}));
        deps_[end(r)].push_back(start(r));
      }
    }
  }

  void compute_durations() {
    for (size_t s = 0; s < b_.size(); ++s) {
      const Plan& p = b_[s];
      // a region's pass (one IR node) spread over its segment instructions by their FLOPs
      std::map<int32_t, double> node_flops;
      for (const auto& in : p.instrs)
        if (op_is_compute(in.op)) node_flops[in.node] += instr_forward_flops(p, in);
      for (size_t i = 0; i < p.instrs.size(); ++i) {
        const Instr& in = p.instrs[i];
        int group_size = in.group() >= 0 ? int(p.group_ranks(p.groups[size_t(in.group())]).size()) : 1;
        double share = 1.0;
        if (op_is_compute(in.op) && node_flops[in.node] > 0)
          share = instr_forward_flops(p, in) / node_flops[in.node];
        duration_[id({int(s), int32_t(i)})] = cost_.seconds(p, in, group_size, share);
      }
    }
  }

  Simulation schedule() {
    const size_t events = 2 * n_;
    std::vector<std::vector<size_t>> users(events);
    std::vector<size_t> missing(events, 0);
    for (size_t e = 0; e < events; ++e) {
      missing[e] = deps_[e].size();
      for (size_t d : deps_[e]) users[d].push_back(e);
    }
    std::queue<size_t> ready;
    for (size_t e = 0; e < events; ++e)
      if (missing[e] == 0) ready.push(e);
    size_t done = 0;
    while (!ready.empty()) {
      size_t e = ready.front();
      ready.pop();
      ++done;
      double t = 0;
      for (size_t d : deps_[e]) t = std::max(t, time_[d]);
      if (e % 2 == 1) t += duration_[e / 2];
      time_[e] = t;
      for (size_t u : users[e])
        if (--missing[u] == 0) ready.push(u);
    }
    if (done != events) report_deadlock(missing);
    Simulation sim;
    sim.busy.assign(b_.size(), 0.0);
    sim.bubble.assign(b_.size(), 0.0);
    sim.spans.resize(b_.size());
    for (size_t s = 0; s < b_.size(); ++s)
      for (size_t i = 0; i < b_[s].instrs.size(); ++i) {
        Ref r{int(s), int32_t(i)};
        const Instr& in = b_[s].instrs[i];
        sim.spans[s].push_back({int32_t(i), time_[start(r)], time_[end(r)]});
        sim.step_time = std::max(sim.step_time, time_[end(r)]);
        if (op_is_compute(in.op) || op_info(in.op).kind == OpKind::Update) sim.busy[s] += duration_[id(r)];
      }
    for (size_t s = 0; s < b_.size(); ++s)
      sim.bubble[s] = sim.step_time > 0 ? std::max(0.0, 1.0 - sim.busy[s] / sim.step_time) : 0.0;
    return sim;
  }

  [[noreturn]] void report_deadlock(const std::vector<size_t>& missing) {
    // On each set, the first instruction that never starts, and what it waits for.
    std::string msg = "plans would deadlock (a wait-for cycle):";
    for (size_t s = 0; s < b_.size(); ++s)
      for (size_t i = 0; i < b_[s].instrs.size(); ++i) {
        Ref r{int(s), int32_t(i)};
        if (missing[start(r)] == 0) continue;
        std::string waits;
        for (size_t d : deps_[start(r)]) {
          size_t instr = d / 2;
          size_t set = size_t(std::upper_bound(base_.begin(), base_.end(), instr) - base_.begin()) - 1;
          Ref w{int(set), int32_t(instr - base_[set])};
          if (missing[d] > 0 || (d % 2 == 1 && missing[d - 1] > 0)) waits += cat("; it waits for ", describe(b_, w));
        }
        msg += cat("\n  ", describe(b_, r), " never starts", waits, " (order from ", origin(origins_, int(s)), ")");
        break;
      }
    throw UserError(msg);
  }
};

}  // namespace

Simulation simulate_plans(const std::vector<Plan>& bodies, const CostModel& cost, const OrderOrigins& origins) {
  return Simulator(bodies, cost, origins).run();
}

}  // namespace piper

// Per-step time accounting from instruction events (see timeline.hpp).
#include "runtime/timeline.hpp"

#include <algorithm>

namespace piper {

namespace {

using Interval = std::pair<double, double>;

std::vector<Interval> merged(std::vector<Interval> v) {
  std::sort(v.begin(), v.end());
  std::vector<Interval> out;
  for (const auto& iv : v) {
    if (iv.second <= iv.first) continue;
    if (!out.empty() && iv.first <= out.back().second) out.back().second = std::max(out.back().second, iv.second);
    else out.push_back(iv);
  }
  return out;
}

double length(const std::vector<Interval>& v) {
  double t = 0;
  for (const auto& iv : v) t += iv.second - iv.first;
  return t;
}

double overlap(const std::vector<Interval>& a, const std::vector<Interval>& b) {
  double t = 0;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    double lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (hi > lo) t += hi - lo;
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return t;
}

}  // namespace

StepTimes& StepTimes::operator+=(const StepTimes& o) {
  wall += o.wall;
  compute += o.compute;
  communication += o.communication;
  hidden += o.hidden;
  all_to_all += o.all_to_all;
  all_to_all_hidden += o.all_to_all_hidden;
  p2p_bytes += o.p2p_bytes;
  collective_bytes += o.collective_bytes;
  return *this;
}

StepTimes step_times(const Plan& plan, const std::vector<TraceEvent>& events, double step_start, double step_end,
                     const std::vector<int>& group_sizes) {
  std::vector<Interval> compute, comm, exchange;
  StepTimes t;
  for (const auto& e : events) {
    const Instr& in = plan.instrs[size_t(e.instr)];
    if (op_is_async(in.op)) {
      comm.push_back({e.start, e.end});
      const OpKind kind = op_info(in.op).kind;
      if (kind == OpKind::AllToAll) exchange.push_back({e.start, e.end});
      const double b = instr_send_bytes(in, in.group() >= 0 ? group_sizes[size_t(in.group())] : 2);
      (kind == OpKind::PointToPoint ? t.p2p_bytes : t.collective_bytes) += b;
    } else if (op_info(in.op).kind != OpKind::StepSync) {
      compute.push_back({e.start, e.end});
    }
  }
  auto c = merged(compute), m = merged(comm);
  t.wall = step_end - step_start;
  t.compute = length(c);
  t.communication = length(m);
  t.hidden = overlap(c, m);
  auto x = merged(exchange);
  t.all_to_all = length(x);
  t.all_to_all_hidden = overlap(c, x);
  return t;
}

}  // namespace piper

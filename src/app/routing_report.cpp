// The routing summary of a step (see routing_report.hpp).
#include "app/routing_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "model/segment_type.hpp"
#include "util/error.hpp"

namespace piper {

namespace {

std::string number(double v) {  // JSON has no NaN or infinity
  if (!std::isfinite(v)) return "null";
  char b[40];
  std::snprintf(b, sizeof(b), "%.9g", v);
  return b;
}

}  // namespace

std::vector<LayerRouting> routing_report(const std::vector<Segment>& segments, const ModelDims& dims,
                                         const std::vector<double>& routing) {
  std::vector<LayerRouting> out;
  size_t at = 0;
  for (const Segment& seg : segments) {
    if (!seg.type || !seg.type->routed_experts) continue;
    const int E = seg.type->routed_experts(dims);
    if (at + size_t(routing_stats_size(E)) > routing.size()) break;  // no statistics (no step run)
    const double* block = routing.data() + at;
    at += size_t(routing_stats_size(E));
    double total = 0, busiest = 0;
    for (int e = 0; e < E; ++e) {
      total += block[e];
      busiest = std::max(busiest, block[e]);
    }
    out.push_back({seg.name, total > 0 ? busiest / (total / E) : 0.0, block[E]});
  }
  return out;
}

std::string routing_step_text(const std::vector<LayerRouting>& layers) {
  if (layers.empty()) return "";
  const LayerRouting* worst = &layers[0];
  double dropped = 0;
  for (const auto& l : layers) {
    if (l.overload > worst->overload) worst = &l;
    dropped += l.dropped;
  }
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f", worst->overload);
  std::string s = cat(" | overload ", buf, " (", worst->segment, ")");
  if (dropped > 0) s += cat(", dropped ", static_cast<long long>(dropped));
  return s;
}

std::string routing_json(const std::vector<LayerRouting>& layers) {
  if (layers.empty()) return "";
  double worst = 0, dropped = 0;
  std::string list;
  for (const auto& l : layers) {
    worst = std::max(worst, l.overload);
    dropped += l.dropped;
    list += cat(list.empty() ? "" : ", ", "{\"segment\": \"", l.segment, "\", \"overload\": ", number(l.overload),
                ", \"dropped\": ", number(l.dropped), "}");
  }
  return cat(", \"moe_overload\": ", number(worst), ", \"moe_dropped\": ", number(dropped),
             ", \"moe_layers\": [", list, "]");
}

}  // namespace piper

// What the step line and the metrics file say of a mixture of experts' routing: per routing segment (one per
// MoE layer), the overload factor (the busiest expert's tokens over the mean) and the dropped assignments.
#pragma once
#include <string>
#include <vector>

#include "model/model.hpp"

namespace piper {

struct LayerRouting {
  std::string segment;   // the routing segment ("model.layers.3.mlp.router")
  double overload = 0;   // max over experts of the tokens routed to it / the mean over experts
  double dropped = 0;    // assignments over an expert's capacity
};

// From StepMetrics::routing (the blocks of the routing segments among `segments`, in order).
std::vector<LayerRouting> routing_report(const std::vector<Segment>& segments, const ModelDims& dims,
                                         const std::vector<double>& routing);

// " | overload 1.84 (model.layers.3.mlp.router)[, dropped 12]": the worst layer; empty without routing.
std::string routing_step_text(const std::vector<LayerRouting>& layers);

// ", \"moe_overload\": ..., \"moe_dropped\": ..., \"moe_layers\": [...]" for a metrics line; empty without routing.
std::string routing_json(const std::vector<LayerRouting>& layers);

}  // namespace piper

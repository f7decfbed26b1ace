// Builds the global training DAG of one step from the model and the annotations: regions, then
// F, B and UPDATE per region, one step-sync collective (global gradient norm and loss), and their edges.
#pragma once
#include "config/job.hpp"
#include "ir/graph.hpp"
#include "model/model.hpp"

namespace piper {

// Regions: contiguous segments with equal annotation stacks (embedding takes layer 0's tags, the head
// the last layer's).
std::vector<Region> make_regions(const Model& model, const std::vector<Annotation>& annotations);

// The segment index ranges [first, last] of each tag value of an annotation, resolved against the model (a
// pattern gives one range per matching segment); a name or pattern the model lacks is a UserError.
std::vector<std::pair<int, int>> segment_ranges(const Model& model, const Annotation& a);

Graph build_training_graph(const Model& model, const JobSpec& spec, int world);

// The step-sync node (every rank takes part); build creates exactly one.
int step_sync_node(const Graph& g);

}  // namespace piper

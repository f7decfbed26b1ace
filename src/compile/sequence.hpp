// Orders each device set's nodes consistently with one global topological order of the DAG.
#pragma once
#include <vector>

#include "ir/graph.hpp"

namespace piper {

bool node_on_set(const Node& n, int set);
// A ZeRO-style parameter gather tied to one compute use (issued by the lowering one use ahead).
bool is_prefetched_gather(const Node& n);
// For each device set, its nodes in issue order.
std::vector<std::vector<int>> set_sequences(const Graph& g);

}  // namespace piper

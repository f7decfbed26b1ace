// Human-readable forms of the training DAG: a text listing and Graphviz DOT (one cluster per device set).
#pragma once
#include <string>

#include "ir/graph.hpp"

namespace piper {

std::string graph_to_text(const Graph& g);
std::string graph_to_dot(const Graph& g);

}  // namespace piper

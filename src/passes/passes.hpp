// The directive passes: each rewrites the global training DAG (one file per pass). apply_directives
// runs them in DESIGN.md §3's fixed phase order: split → split-backward → place → SEND/RECV →
// buckets → replicate → tied-parameter sync → order → recompute.
#pragma once
#include <vector>

#include "config/job.hpp"
#include "ir/graph.hpp"

namespace piper {

void apply_split(Graph& g, const Directive& d);
void apply_split_backward(Graph& g, const std::vector<Directive>& orders);
void apply_place(Graph& g, const std::vector<Directive>& places);
void insert_send_recv(Graph& g);
void make_buckets(Graph& g);
void mark_replicate(Graph& g, const Directive& d);
// Ranks holding the same parameters of region r: its set, or the expert groups of a sharded region.
int copies(const Graph& g, const Region& r);
bool has_copies(const Graph& g, const Region& r);  // more than one such rank, or a region that is not sharded
void mark_shard(Graph& g, const Directive& d);
void insert_exchanges(Graph& g);
// Ranks holding the same part of bucket b: its set's ranks over the bucket's slices.
int bucket_copies(const Graph& g, const Bucket& b);
// tensor_parallel.cpp: marks the regions and sets of a tp directive, and the segments it splits
// (Graph::segment_shards); every set must then have one group size; a region of a set made of one group alone is
// reduced over it (its parameters' gradients are partial); an ALL_REDUCE after every partial activation and
// input gradient.
void mark_tensor_parallel(Graph& g, const Directive& d);
void check_tensor_parallel_sets(const Graph& g);
void check_tensor_parallel_samples(const Graph& g);  // once the samples per microbatch are known
void reduce_tensor_parallel_regions(Graph& g);
void insert_tensor_parallel_sums(Graph& g);
// Sequence parallelism: which boundaries are held in parts (Graph::boundary_in_parts), and the all-gathers before
// their readers (the reduce-scatters after their writers replace the all-reduces in insert_tensor_parallel_sums).
void mark_sequence_parts(Graph& g);
void insert_sequence_gathers(Graph& g);
void insert_replication(Graph& g);
void insert_tied_sync(Graph& g);
// Every order directive, in the given order, then one cycle check of the whole graph: a cycle names the
// first directive that closes one (or the graph, when it has one without any order).
void apply_orders(Graph& g, const std::vector<Directive>& orders);
// Marks the segments the recompute directives name (Graph::segment_recompute) and puts an R node before each
// backward node of their regions; after the orders, so that R runs where its backward was scheduled.
void apply_recompute(Graph& g, const std::vector<Directive>& recomputes);

// Does region `region` use a parameter of bucket `bucket` on the bucket's device set?
bool region_uses_bucket(const Graph& g, int region, int bucket);
bool writes_grads(const Node& n);

// Expands [mesh] into annotations and directives (only what the job does not already say).
// `world` is the number of ranks the job runs on; pp × dp × tp must equal it.
void expand_mesh(JobSpec& spec, int world);

// Runs every pass; schedule directives are expanded into order directives first. Returns the
// directives as applied (generated ones included) so that --dry-run can print them.
std::vector<Directive> apply_directives(Graph& g, const JobSpec& spec);

}  // namespace piper

// Lowering: for each device set, walks its node sequence and emits per-segment instructions with their
// buffers — activations per boundary and microbatch, stashes, parameter buckets (full or sharded),
// gradients, optimizer moments — then derives cross-stream waits and buffer uses (the compiler estimates memory
// after simulating every rank's plan).
#include <algorithm>
#include <utility>

#include "compile/finalize.hpp"
#include "compile/lowerer.hpp"
#include "compile/sequence.hpp"
#include "util/error.hpp"

namespace piper {

namespace lowering {

Plan Lowerer::run(const std::vector<int>& sequence) {
  p_.set = set_;
  p_.held_pieces = held_piece_rule();
  stream_id("compute");
  make_buckets();
  make_workspace();
  plan_segment_ops(sequence);
  plan_early_reductions(sequence);
  plan_receives(sequence);
  size_t next_op = 0;
  size_t compute_index = 0;
  for (int id : sequence) {
    const Node& n = g_.nodes[size_t(id)];
    if (is_compute(n.kind)) {
      // Receives are posted one compute node ahead of their consumer (and not before the compute before them
      // is done): early enough to overlap, late enough to keep each channel in the order the receiver consumes.
      issue_receives(compute_index);
      issue_receives(compute_index + 1);
      ++compute_index;
      while (next_op < ops_.size() && issued_with(ops_[next_op], id)) {
        issue_gathers(next_op);
        if (next_op + 1 < ops_.size()) issue_gathers(next_op + 1);  // prefetch one use ahead
        issue_regather(next_op);
        emit_compute(next_op);
        auto early = early_.find({ops_[next_op].node, ops_[next_op].segment});
        if (early != early_.end())
          for (int c : early->second) emit_node(g_.nodes[size_t(c)]);
        ++next_op;
      }
    } else if (!hoisted_.count(id) && n.kind != NodeKind::RECV) {
      emit_node(n);
    }
  }
  PIPER_CHECK(next_op == ops_.size(), "lowering left compute unissued");
  finalize_plan(p_);
  return std::move(p_);
}

// Whether `op` is issued while the sequence is at node `id`: its own ops, and the reruns it interleaves.
bool Lowerer::issued_with(const SegOp& op, int id) const {
  if (op.node == id) return true;
  auto rerun = rerun_of_.find(id);
  return rerun != rerun_of_.end() && rerun->second == op.node;
}

int Lowerer::stream_id(const std::string& name) {
  auto it = streams_.find(name);
  if (it != streams_.end()) return it->second;
  int id = int(p_.streams.size());
  p_.streams.push_back(name);
  streams_[name] = id;
  return id;
}

int Lowerer::group_id(const GroupRef& ref) {
  for (size_t i = 0; i < p_.groups.size(); ++i)
    if (p_.groups[i] == ref) return int(i);
  p_.groups.push_back(ref);
  return int(p_.groups.size()) - 1;
}

int Lowerer::new_buffer(uint64_t bytes, BufferKind kind, bool persistent, std::string name) {
  PlanBuffer b;
  b.bytes = bytes;
  b.kind = kind;
  b.persistent = persistent;
  b.name = std::move(name);
  p_.buffers.push_back(std::move(b));
  return int(p_.buffers.size()) - 1;
}

int Lowerer::keyed_buffer(char tag, int a, int b, uint64_t bytes, BufferKind kind, const std::string& name) {
  auto key = std::make_tuple(tag, a, b);
  auto it = keyed_.find(key);
  if (it != keyed_.end()) return it->second;
  int id = new_buffer(bytes, kind, false, name);
  keyed_[key] = id;
  return id;
}

}  // namespace lowering

std::vector<Plan> lower(const Graph& g, const JobSpec& spec) {
  auto sequences = set_sequences(g);
  const lowering::GraphIndex index(g);
  std::vector<Segment> segs = g.model->segments;
  for (size_t i = 0; i < segs.size(); ++i) segs[i].shards = g.segment_shards[i];
  std::vector<Plan> bodies;
  for (size_t s = 0; s < g.sets.size(); ++s) {
    lowering::Lowerer l(g, index, segs, spec, int(s));
    Plan p = l.run(sequences[s]);
    fill_job_fields(p, spec, g);
    bodies.push_back(std::move(p));
  }
  // Every plan carries the full group table, in one order, for communicator creation.
  std::vector<GroupRef> all;
  for (const auto& b : bodies)
    for (const auto& gr : b.groups)
      if (std::find(all.begin(), all.end(), gr) == all.end()) all.push_back(gr);
  std::sort(all.begin(), all.end());
  for (auto& b : bodies) b.all_groups = all;
  return bodies;
}

}  // namespace piper

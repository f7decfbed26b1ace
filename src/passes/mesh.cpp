// [mesh] shorthand: pp pipeline stages (even layer split unless [[annotate]] says otherwise), dp replicas
// per stage on ranks stage + pp·replica, a split into microbatches, replicate with the ZeRO level, expert
// groups of ep ranks inside each stage's dp (a region per expert segment, sharded), tensor-parallel groups of tp
// neighbouring ranks (a region per segment that can be split), activation recompute and a schedule. Only what
// the job does not already state is generated; generated directives say so.
#include "passes/passes.hpp"
#include "util/error.hpp"

namespace piper {

void expand_mesh(JobSpec& spec, int world) {
  const MeshSpec& mesh = spec.mesh;
  if (!mesh.present) return;
  const int64_t ranks = int64_t(mesh.pp) * mesh.dp * mesh.tp;
  if (ranks != world)
    throw UserError(cat(mesh.loc.str(), ": [mesh] pp = ", mesh.pp, " × dp = ", mesh.dp,
                        mesh.tp > 1 ? cat(" × tp = ", mesh.tp) : std::string(), " = ", ranks,
                        " ranks, but the job runs on ", world, " rank", world == 1 ? "" : "s", "; run with -np ", ranks,
                        " or change [mesh]"));

  auto has_op = [&](const std::string& op) {
    for (const auto& d : spec.directives)
      if (d.op == op) return true;
    return false;
  };
  if (mesh.ep > 1 && (mesh.dp * mesh.tp) % mesh.ep != 0)
    throw UserError(cat(mesh.loc.str(), ": [mesh] ep = ", mesh.ep, " ranks per expert group do not divide dp",
                        mesh.tp > 1 ? " × tp = " : " = ", mesh.dp * mesh.tp,
                        "; use a divisor (ep = dp spreads every layer's experts over all replicas)"));
  const int L = spec.model.n_layers;
  // DualPipeV runs two stages on each pipeline rank, in a V: stage s on rank s, stage 2·pp − 1 − s back on it
  // interleaved 1F1B with chunks: stage s on rank s mod pp
  const bool v_shape = mesh.schedule == "dualpipev";
  const int stages = v_shape ? 2 * mesh.pp : mesh.chunks * mesh.pp;
  auto rank_of_stage = [&](int s) { return v_shape ? (s < mesh.pp ? s : 2 * mesh.pp - 1 - s) : s % mesh.pp; };
  bool has_pp = false;
  for (const auto& a : spec.annotations) has_pp |= a.tag == "PP";
  if (mesh.pp > 1 && !has_pp) {
    if (stages > L)
      throw UserError(cat(mesh.loc.str(), ": mesh.pp = ", mesh.pp, " needs ", stages, " stages",
                        v_shape ? " (DualPipeV: 2 per rank)" : (mesh.chunks > 1 ? cat(" (", mesh.chunks, " per rank)") : ""),
                          " but the model has only ", L, " layers"));
    Annotation a;
    a.tag = "PP";
    a.index = int(spec.annotations.size());
    a.loc = mesh.loc;
    int first = 0;
    for (int s = 0; s < stages; ++s) {
      int n = L / stages + (s < L % stages ? 1 : 0);
      a.layers.push_back({first, first + n - 1});
      first += n;
    }
    spec.annotations.push_back(a);
    has_pp = true;
  }
  int next = int(spec.directives.size());
  auto make = [&](const std::string& op) {
    Directive d;
    d.op = op;
    d.index = next++;
    d.loc = mesh.loc;
    d.generated = true;
    return d;
  };
  std::vector<Directive> added;
  if (!has_op("split")) {
    int m = mesh.microbatches > 0 ? mesh.microbatches : (mesh.pp > 1 ? (v_shape ? 2 : 1) * mesh.pp : 1);
    if (m > 1) {
      Directive d = make("split");
      d.count = m;
      added.push_back(d);
    }
  }
  if (!has_op("place") && (mesh.pp > 1 || mesh.dp > 1 || mesh.tp > 1)) {
    // a tensor-parallel group is tp neighbouring ranks (one node's links); its stage's other groups follow pp·tp apart
    for (int s = 0; s < (mesh.pp > 1 ? stages : 1); ++s) {
      Directive d = make("place");
      if (mesh.pp > 1) d.filter.match["PP"] = TagMatch{TagMatch::Kind::Int, s, ""};
      for (int r = 0; r < mesh.dp * mesh.tp; ++r)
        d.devices.push_back(r % mesh.tp + mesh.tp * (rank_of_stage(s) + mesh.pp * (r / mesh.tp)));
      added.push_back(d);
    }
  }
  if (!has_op("tp") && mesh.tp > 1) {
    bool has_tp = false;
    for (const auto& a : spec.annotations) has_tp |= a.tag == "TP";
    if (!has_tp) {  // a region per segment that can be split
      Annotation a;
      a.tag = "TP";
      a.index = int(spec.annotations.size());
      a.loc = mesh.loc;
      a.tp_segments = true;
      spec.annotations.push_back(a);
    }
    Directive d = make("tp");  // every region: the others run alike on each rank of a group
    d.group = mesh.tp;
    d.sequence = mesh.sequence;
    d.stream = "tp";
    added.push_back(d);
  }
  if (!has_op("replicate") && mesh.dp > 1) {
    Directive d = make("replicate");
    d.zero = mesh.zero;
    d.bucket_mb = mesh.bucket_mb;
    d.grad_buckets_in_flight = mesh.grad_buckets_in_flight;
    added.push_back(d);
  }
  if (!has_op("shard") && mesh.ep > 1) {
    bool has_ep = false;
    for (const auto& a : spec.annotations) has_ep |= a.tag == "EP";
    if (!has_ep) {  // a region per expert segment
      Annotation a;
      a.tag = "EP";
      a.index = int(spec.annotations.size());
      a.loc = mesh.loc;
      a.expert_segments = true;
      spec.annotations.push_back(a);
    }
    Directive d = make("shard");
    d.filter.match["EP"] = TagMatch{TagMatch::Kind::Any, 0, ""};
    d.group = mesh.ep;
    d.stream = "ep";
    added.push_back(d);
  }
  if (!has_op("recompute") && (mesh.recompute == "full" || mesh.recompute == "selective")) {
    Directive d = make("recompute");
    d.policy = mesh.recompute;
    added.push_back(d);
  }
  if (!has_op("schedule") && !mesh.schedule.empty()) {
    Directive d = make("schedule");
    d.kind = mesh.schedule;
    added.push_back(d);
  }
  for (auto& d : added) spec.directives.push_back(std::move(d));
}

}  // namespace piper

// The --report-json document (see run_report.hpp).
#include "app/run_report.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "app/json_writer.hpp"
#include "util/error.hpp"
#include "util/mpi_gather.hpp"

namespace piper {

namespace {

void kinds_json(JsonWriter& w, const uint64_t (&bytes)[kBufferKinds]) {
  w.begin_object();
  for (int k = 0; k < kBufferKinds; ++k) w.key(buffer_kind_name(BufferKind(k))).value(bytes[k]);
  w.end_object();
}

// The totals of one table, busiest first: per step, and each one's share of the kernels' time.
void totals_json(JsonWriter& w, const std::map<std::string, KernelTotals>& m, double steps, double kernel_seconds,
                 bool matmul_shapes) {
  std::vector<std::pair<std::string, KernelTotals>> rows(m.begin(), m.end());
  std::stable_sort(rows.begin(), rows.end(),
                   [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  w.begin_array();
  for (const auto& [name, t] : rows) {
    w.begin_object();
    if (matmul_shapes) {  // "linear_forward  N=2048 C=256 OC=768": the kernel and the product's shape
      char kernel[64] = "";
      int n = 0, c = 0, oc = 0;
      if (std::sscanf(name.c_str(), "%63s N=%d C=%d OC=%d", kernel, &n, &c, &oc) == 4)
        w.key("kernel").value(kernel).key("rows").value(n).key("in_features").value(c).key("out_features").value(oc);
      else
        w.key("kernel").value(name);
    } else {
      w.key("name").value(name);
    }
    w.key("calls_per_step").value(double(t.calls) / steps).key("ms_per_step").value(t.seconds / steps * 1e3);
    w.key("share").value(kernel_seconds > 0 ? t.seconds / kernel_seconds : 0.0);
    if (matmul_shapes) w.key("gflops_per_s").value(t.seconds > 0 ? t.flops / t.seconds / 1e9 : 0.0);
    else w.key("downloads_per_step").value(double(t.downloads) / steps);  // device-to-host copies
    w.end_object();
  }
  w.end_array();
}

}  // namespace

std::string profile_json(const KernelProfile& p) {
  const double steps = double(std::max<int64_t>(1, p.steps));
  double kernel_seconds = 0;
  for (const auto& [name, t] : p.by_kernel) kernel_seconds += t.seconds;
  JsonWriter w;
  w.begin_object().key("steps").value(p.steps).key("wall_ms_per_step").value(p.wall_seconds / steps * 1e3);
  w.key("kernel_ms_per_step").value(kernel_seconds / steps * 1e3);
  w.key("kernels");
  totals_json(w, p.by_kernel, steps, kernel_seconds, false);
  w.key("regions");
  totals_json(w, p.by_region, steps, kernel_seconds, false);
  w.key("matmul_shapes");
  totals_json(w, p.by_matmul_shape, steps, kernel_seconds, true);
  w.end_object();
  return w.str();
}

std::vector<std::string> gather_json(const std::string& json, MPI_Comm world) {
  int size = 1;
  MPI_Comm_size(world, &size);
  Gathered<char> all = gather_to_root(std::vector<char>(json.begin(), json.end()), world);
  std::vector<std::string> out;
  if (all.counts.empty()) return out;  // not rank 0
  for (int r = 0; r < size; ++r) out.emplace_back(all.begin(r), all.end(r));
  return out;
}

void write_run_report(const std::string& path, const RunReport& r) {
  JsonWriter w;
  w.begin_object().key("job").value(r.job).key("world").value(r.world).key("backend").value(r.backend);
  w.key("precision").value(r.precision);
  if (!r.matmul_path.empty()) w.key("bf16_matmuls").value(r.matmul_path);
  w.key("first_step").value(r.first_step).key("last_step").value(r.last_step);
  w.key("timed_steps").value(r.times.steps).key("ranks").begin_array();
  for (int rank = 0; rank < r.world; ++rank) {
    w.begin_object().key("rank").value(rank);
    if (size_t(rank) < r.times.ranks.size()) {
      const RankTimes& t = r.times.ranks[size_t(rank)];
      w.key("time").begin_object();
      w.key("wall_ms").value(t.wall_ms).key("compute_ms").value(t.compute_ms);
      w.key("bubble").value(t.bubble).key("predicted_bubble").value(t.predicted_bubble);
      w.key("communication_ms").value(t.communication_ms).key("communication_hidden").value(t.communication_hidden);
      w.key("p2p_bytes").value(t.p2p_bytes).key("collective_bytes").value(t.collective_bytes);
      if (r.times.all_to_all) {
        w.key("all_to_all_ms").value(t.all_to_all_ms).key("all_to_all_hidden").value(t.all_to_all_hidden);
        w.key("all_to_all_exposed_ms").value(t.all_to_all_exposed_ms);
      }
      w.end_object();
    }
    if (size_t(rank) < r.memory.size()) {
      const RankMemory& m = r.memory[size_t(rank)];
      w.key("memory").begin_object();
      w.key("held_bytes");
      kinds_json(w, m.held);
      w.key("peak_bytes");
      kinds_json(w, m.peak);
      w.key("estimated_peak_bytes");
      kinds_json(w, m.estimated_peak);
      w.key("estimated_steady_bytes");
      kinds_json(w, m.estimated_steady);
      w.key("peak_total_bytes").value(m.peak_total).key("estimated_peak_total_bytes").value(m.estimated_peak_total);
      w.end_object();
    }
    if (size_t(rank) < r.profiles.size()) w.key("profile").raw(r.profiles[size_t(rank)]);
    w.end_object();
  }
  w.end_array();
  w.key("replicas").begin_object().key("identical").value(r.replicas.identical);
  w.key("copies_compared").value(r.replicas.copies_compared);
  if (!r.replicas.identical && !r.replicas.differing_parameter.empty()) {
    w.key("differing_parameter").value(r.replicas.differing_parameter).key("differing_ranks").begin_array();
    w.value(r.replicas.differing_ranks[0]).value(r.replicas.differing_ranks[1]).end_array();
  }
  w.end_object().end_object();
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << w.str() << "\n";
  f.close();  // a full disk shows at the last flush
  if (!f) throw SystemError(cat("--report-json: cannot write '", path, "': ", std::strerror(errno ? errno : EIO)));
}

}  // namespace piper

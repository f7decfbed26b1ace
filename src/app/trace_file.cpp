// Chrome-trace output and the time summary (see trace_file.hpp).
#include "app/trace_file.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "app/json_writer.hpp"
#include "util/error.hpp"
#include "util/mpi_check.hpp"
#include "util/mpi_gather.hpp"

namespace piper {

namespace {

// Same id on both ends of a message: step, sender, tag.
unsigned long long flow_id(int64_t step, int sender, int tag) {
  return (static_cast<unsigned long long>(step) << 40) ^ (static_cast<unsigned long long>(sender) << 24) ^
         static_cast<unsigned long long>(tag);
}

}  // namespace

void write_trace(const std::string& path, Executor& ex, const std::vector<TraceEvent>& events, MPI_Comm world) {
  const Plan& p = ex.plan();
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  std::string out;
  char buf[256];
  out += cat("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", rank, ",\"args\":{\"name\":\"rank ", rank, " (device set ",
             p.set, ")\"}},\n");
  out += cat("{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":", rank, ",\"args\":{\"sort_index\":", rank, "}},\n");
  for (size_t s = 0; s < p.streams.size(); ++s)
    out += cat("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":", rank, ",\"tid\":", s, ",\"args\":{\"name\":\"",
               json_escape(p.streams[s]), "\"}},\n");
  for (const auto& e : events) {
    const Instr& in = p.instrs[size_t(e.instr)];
    const double ts = e.start * 1e6, dur = std::max(0.0, e.end - e.start) * 1e6;
    std::snprintf(buf, sizeof(buf), "\"ts\":%.3f,\"dur\":%.3f,\"pid\":%d,\"tid\":%d", ts, dur, rank, int(in.stream));
    out += cat("{\"name\":\"", json_escape(instr_label(p, in)), "\",\"cat\":\"", op_info(in.op).trace_category, "\",\"ph\":\"X\",", buf,
               ",\"args\":{\"step\":", e.step + 1, ",\"instr\":", e.instr, ",\"node\":", in.node, ",\"mb\":", in.mb,
               "}},\n");
    if (in.op == Op::Send || in.op == Op::Recv) {
      const bool send = in.op == Op::Send;
      const int sender = send ? rank : p.peer_rank(in.message().peer_set);
      std::snprintf(buf, sizeof(buf), "\"ts\":%.3f,\"pid\":%d,\"tid\":%d", send ? ts : ts + dur, rank, int(in.stream));
      out += cat("{\"name\":\"message\",\"cat\":\"p2p\",\"ph\":\"", send ? "s" : "f", "\",", send ? "" : "\"bp\":\"e\",",
                 "\"id\":", flow_id(e.step, sender, in.message().tag), ",", buf, "},\n");
    }
  }
  Gathered<char> gathered = gather_to_root(std::vector<char>(out.begin(), out.end()), world);
  std::string all(gathered.data.begin(), gathered.data.end());
  if (rank != 0) return;
  if (all.size() >= 2) all.resize(all.size() - 2);  // the last ",\n"
  std::ofstream f(path);
  f << "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n" << all << "\n]}\n";
  f.close();  // a full disk shows at the last flush
  if (!f) throw SystemError(cat("--trace: cannot write '", path, "': ", std::strerror(errno ? errno : EIO)));
  std::printf("trace: %s (%zu bytes; open it in https://ui.perfetto.dev or chrome://tracing)\n", path.c_str(),
              all.size());
}

TimeReport report_times(const Plan& plan, const StepTimes& total, int64_t steps, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  constexpr int K = 9;
  double mine[K] = {total.wall,      total.compute,          total.communication,  total.hidden,
                    total.p2p_bytes, total.collective_bytes, plan.predicted_bubble, total.all_to_all,
                    total.all_to_all_hidden};
  bool exchanges = false;  // the job has all-to-all exchanges: report them apart
  for (const auto& in : plan.instrs) exchanges |= in.op == Op::AllToAll;
  int any = exchanges ? 1 : 0;
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, world));
  std::vector<double> all(rank == 0 ? size_t(K * size) : 0);
  MPI_CHECK(MPI_Gather(mine, K, MPI_DOUBLE, all.data(), K, MPI_DOUBLE, 0, world));
  TimeReport report;
  report.steps = steps;
  report.all_to_all = any != 0;
  if (rank != 0 || steps <= 0) return report;
  for (int r = 0; r < size; ++r) {
    const double* v = &all[size_t(K * r)];
    const double n = double(steps);
    RankTimes t;
    t.wall_ms = v[0] / n * 1e3;
    t.compute_ms = v[1] / n * 1e3;
    t.communication_ms = v[2] / n * 1e3;
    const double wall = v[0] / n, compute = v[1] / n;
    t.bubble = wall > 0 ? std::max(0.0, 1.0 - compute / wall) : 0;
    t.predicted_bubble = v[6];
    t.communication_hidden = v[2] > 0 ? v[3] / v[2] : 0;
    t.p2p_bytes = v[4] / n;
    t.collective_bytes = v[5] / n;
    t.all_to_all_ms = v[7] / n * 1e3;
    t.all_to_all_hidden = v[7] > 0 ? v[8] / v[7] : 0.0;
    t.all_to_all_exposed_ms = (v[7] - v[8]) / n * 1e3;
    report.ranks.push_back(t);
  }
  std::printf("time per step, mean of %lld steps after the first (ms): wall, compute, bubble (idle share) next to "
              "the cost model's, communication, hidden behind compute, MB sent\n",
              static_cast<long long>(steps));
  for (int r = 0; r < size; ++r) {
    const RankTimes& t = report.ranks[size_t(r)];
    std::printf("timeline rank=%d wall_ms=%.3f compute_ms=%.3f bubble=%.4f predicted_bubble=%.4f comm_ms=%.3f "
                "hidden=%.4f p2p_mb=%.4f collective_mb=%.4f",
                r, t.wall_ms, t.compute_ms, t.bubble, t.predicted_bubble, t.communication_ms, t.communication_hidden,
                t.p2p_bytes / 1e6, t.collective_bytes / 1e6);
    if (report.all_to_all)  // all-to-all time, the share of it hidden behind compute, and the exposed rest
      std::printf(" a2a_ms=%.3f a2a_hidden=%.4f a2a_exposed_ms=%.3f", t.all_to_all_ms, t.all_to_all_hidden,
                  t.all_to_all_exposed_ms);
    std::printf("\n");
  }
  std::fflush(stdout);
  return report;
}

}  // namespace piper

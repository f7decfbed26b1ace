// Training loop (see train.hpp).
#include "app/train.hpp"


#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "app/metrics_file.hpp"
#include "app/mfu_peak.hpp"
#include "app/report.hpp"
#include "app/routing_report.hpp"
#include "app/run_report.hpp"
#include "app/stop_signals.hpp"
#include "app/trace_file.hpp"
#include "backend/backend.hpp"
#include "backend/cpu/blas_core.hpp"
#include "backend/profiling_kernels.hpp"
#include "ckpt/checkpoint.hpp"
#include "model/segment_type.hpp"
#include "runtime/executor.hpp"
#include "util/error.hpp"
#include "util/usable_cores.hpp"
#include "util/exit_codes.hpp"
#include "util/mpi_check.hpp"
#include "util/mpi_wait.hpp"
#include "util/timer.hpp"

namespace piper {

namespace {

// "1.4 GiB", "312 MiB": this rank's peak of piper's buffers, for the step line
std::string memory_text(uint64_t bytes) {
  char s[32];
  if (bytes >= (uint64_t(1) << 30)) std::snprintf(s, sizeof(s), "%.1f GiB", double(bytes) / double(uint64_t(1) << 30));
  else std::snprintf(s, sizeof(s), "%.0f MiB", double(bytes) / double(1 << 20));
  return s;
}

// "0:01:23", "12:04:56" (hours, minutes, seconds)
std::string duration_text(double seconds) {
  const long long t = seconds > 0 && seconds < 1e9 ? static_cast<long long>(seconds + 0.5) : 0;
  char s[32];
  std::snprintf(s, sizeof(s), "%lld:%02lld:%02lld", t / 3600, t / 60 % 60, t % 60);
  return s;
}

// Compute threads per rank: the job's setting; else the CPUs Slurm gives each task; else this node's
// usable cores divided by its ranks.
int resolve_threads(int configured, MPI_Comm world, int* local_rank) {
  MPI_Comm node;
  MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node));
  int local = 1;
  MPI_Comm_size(node, &local);
  MPI_Comm_rank(node, local_rank);
  MPI_Comm_free(&node);
  if (configured > 0) return configured;
  if (const char* per_task = std::getenv("SLURM_CPUS_PER_TASK"); per_task && std::atoi(per_task) > 0)
    return std::atoi(per_task);
  return std::max(1, usable_cores() / std::max(1, local));
}

// A number for a JSON line: non-finite values become null (JSON has no NaN or infinity).
std::string json_number(double v) {
  if (!std::isfinite(v)) return "null";
  char b[40];
  std::snprintf(b, sizeof(b), "%.9g", v);
  return b;
}

std::string broadcast_string(std::string s, MPI_Comm world) {
  int n = int(s.size());
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_INT, 0, world));
  s.resize(size_t(n));
  MPI_CHECK(MPI_Bcast(s.data(), n, MPI_CHAR, 0, world));
  return s;
}

// Rank 0 verifies the checkpoint --resume names (auto: the newest that verifies, but not the `refused`
// ones) while the other ranks wait: all of it but a version-3 file's tensor blocks, which the ranks check
// as they load them. Every rank gets its path ("": start from step 0), or nullopt after rank 0 printed why
// it is refused; `seconds` is set to how long it took.
std::optional<std::string> verified_resume_path(const Plan& plan, const std::string& resume, MPI_Comm world,
                                                const std::vector<std::string>& refused, double& seconds) {
  const double t0 = now_seconds();
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  std::string path;
  int verified = 1;
  if (rank == 0) {
    try {
      ResumeChoice choice = choose_resume_checkpoint(resume, plan.checkpoint_dir, /*check_data=*/false, refused);
      for (const auto& w : choice.warnings) std::fprintf(stderr, "piper: warning: resume: %s\n", w.c_str());
      path = choice.path;
      if (path.empty() && plan.checkpoint_dir.empty())
        std::printf("resume: the job has no checkpoint.dir; starting from step 0\n");
      else if (path.empty())
        std::printf("resume: no checkpoint in '%s'; starting from step 0\n", plan.checkpoint_dir.c_str());
    } catch (const UserError& e) {
      std::fprintf(stderr, "piper: error: %s\n", e.what());
      verified = 0;
    }
  }
  broadcast_after_long_wait(&verified, 1, MPI_INT, 0, world);  // the others sleep while rank 0 reads
  seconds = now_seconds() - t0;
  if (!verified) return std::nullopt;
  return broadcast_string(path, world);
}

// A stop signal that came before training (during start-up, the resume's verification or its load), on any
// rank: every rank learns it here, rank 0 says so, and the run ends with exit code 4 having written nothing.
bool stopped_before_training(const char* during, MPI_Comm world) {
  int mine = stop_signal().load(), any = 0;
  MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, world));
  if (!any) return false;
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  if (rank == 0) {
    std::printf("stopped by a signal %s, before training started: nothing was written, the checkpoint folder is "
                "as it was (continue with --resume auto); exit code %d\n", during, int(kExitStopped));
    std::fflush(stdout);
  }
  return true;
}

// Arms the watchdog over one checkpoint save or load for as long as it lives.
class WatchedTransfer {
 public:
  WatchedTransfer(Executor& ex, const std::string& what, double bytes) : ex_(ex) { ex_.watch_transfer(what, bytes); }
  ~WatchedTransfer() { ex_.end_transfer(); }
  WatchedTransfer(const WatchedTransfer&) = delete;
  WatchedTransfer& operator=(const WatchedTransfer&) = delete;

 private:
  Executor& ex_;
};

// Bytes of one checkpoint of the plan's model: parameters and both AdamW moments, fp32.
double checkpoint_bytes(const Plan& plan) {
  double n = 0;
  for (const auto& p : plan.params) n += double(p.numel);
  return 3 * 4 * n;
}

}  // namespace

int train(const Plan& plan, const CliOptions& opts, MPI_Comm world) {
  int rank = 0;
  MPI_Comm_rank(world, &rank);
  if (stopped_before_training("during start-up", world)) return kExitStopped;
  // --resume: the file is verified before anything is allocated, so that rank 0 reads it alone.
  std::string resume_path;
  double verify_seconds = 0;
  if (!opts.resume.empty()) {
    std::optional<std::string> path = verified_resume_path(plan, opts.resume, world, {}, verify_seconds);
    if (!path) return kExitBadInput;
    resume_path = *path;
    if (stopped_before_training("while the checkpoint to resume from was verified", world)) return kExitStopped;
  }
  int local_rank = 0;
  const int threads = resolve_threads(plan.threads, world, &local_rank);
  std::unique_ptr<Backend> backend = make_backend(plan.backend, threads, local_rank);
  if (rank == 0 && plan.backend == "cpu") {
    const std::string blas = blas_core_warning();
    if (!blas.empty()) std::fprintf(stderr, "piper: warning: %s\n", blas.c_str());
  }
  std::unique_ptr<ProfilingKernels> profiler;
  if (opts.profile) profiler = std::make_unique<ProfilingKernels>(backend->kernels());
  Executor ex(plan, *backend, world, profiler.get());
  ex.set_synchronous(opts.profile || !opts.trace.empty());  // measured times are the device's
  // A resume overwrites every parameter and moment this rank holds: the init rule runs only without one.
  bool initialized = resume_path.empty();
  if (initialized) ex.init_parameters();
  ex.watch_stop_flag(&stop_signal());
  std::atomic<int> output_failed{0};  // rank 0: a metrics line could not be written; every rank ends after the step
  ex.watch_failure_flag(&output_failed);

  int64_t start = 0;
  std::vector<std::string> refused;  // --resume auto: files whose data a rank found damaged while loading
  while (!resume_path.empty()) {
    // Every rank reads (and checks) its own ranges; a bad file ends all ranks together with exit code 2,
    // or with --resume auto sends them to the next older file that verifies.
    const double read_start = now_seconds();
    int failed = 0, any_failed = 0;
    try {
      std::error_code ec;
      const auto file_bytes = std::filesystem::file_size(resume_path, ec);
      WatchedTransfer watched(ex, cat("the load of ", resume_path), ec ? checkpoint_bytes(plan) : double(file_bytes));
      start = load_checkpoint(ex.state(), resume_path);
    } catch (const CheckpointLoadAbandoned&) {  // another rank found the fault and printed it
      failed = 1;
    } catch (const UserError& e) {
      std::fprintf(stderr, "piper: rank %d: %s%s\n", rank, opts.resume == "auto" ? "warning: resume: skipped " : "error: ",
                   e.what());
      failed = 1;
    }
    MPI_CHECK(MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, world));
    if (any_failed) {
      if (opts.resume != "auto") return kExitBadInput;
      refused.push_back(resume_path);
      std::optional<std::string> next = verified_resume_path(plan, opts.resume, world, refused, verify_seconds);
      if (!next) return kExitBadInput;
      resume_path = *next;
      continue;
    }
    if (opts.steps > 0 && opts.steps <= start)  // every rank read the same step: all end here
      throw UserError(cat("--steps ", opts.steps, ": ", resume_path, " is at step ", start,
                          "; a resumed run must end past it (--steps > ", start, ")"));
    if (rank == 0) {
      const double done = now_seconds();
      std::error_code ec;
      const double gb = double(std::filesystem::file_size(resume_path, ec)) / 1e9;
      std::printf("resumed from %s at step %lld (%.3f GB: its structure and checksum verified by rank 0 in %.3f s, "
                  "every rank's ranges read and checked in %.3f s)\n", resume_path.c_str(), static_cast<long long>(start),
                  ec ? 0.0 : gb, verify_seconds, done - read_start);
    }
    break;
  }
  if (!initialized && resume_path.empty()) ex.init_parameters();  // every file refused, none left: step 0
  if (stopped_before_training(resume_path.empty() ? "during start-up" : "while the checkpoint was loaded", world))
    return kExitStopped;
  const int64_t end = opts.steps > 0 ? opts.steps : plan.steps;
  std::ofstream metrics;
  if (rank == 0 && !opts.metrics.empty()) {
    open_metrics(metrics, opts.metrics, start);  // a resumed run drops the lines past its checkpoint
  }
  if (rank == 0)
    std::printf("%s: %d rank%s, %s backend, %d thread%s per rank, steps %lld..%lld\n", plan.job_name.c_str(), plan.world,
                plan.world == 1 ? "" : "s", backend->name().c_str(), threads, threads == 1 ? "" : "s",
                static_cast<long long>(start), static_cast<long long>(end));
  // the peak of MFU: rank 0's, for every rank; the others sleep while it measures (on the CPU)
  MfuPeak peak;
  if (rank == 0) peak = mfu_peak(plan, *backend);
  broadcast_after_long_wait(&peak.flops, 1, MPI_DOUBLE, 0, world);
  const double peak_flops = peak.flops * plan.world;
  if (rank == 0) std::printf("MFU against %s\n", peak.what.c_str());
  if (rank == 0 && plan.precision == Precision::Bf16)
    std::printf("precision bf16: matmuls through %s; master weights, optimizer, norms, softmax and loss in fp32\n",
                backend->kernels().bf16_matmul_path().c_str());
  if (rank == 0 && std::any_of(plan.instrs.begin(), plan.instrs.end(), [](const Instr& in) {
        return op_info(in.op).kind == OpKind::Collective && (in.collective().flags & kFlagBf16Wire);
      }))
    std::printf("gradient reductions in bf16: half the bytes on the wire, each sum rounded to bf16\n");
  // A common time origin for every rank's timeline (and the trace).
  MPI_CHECK(MPI_Barrier(world));
  stop_signals_training_started();  // a stop request from here on is answered with a checkpoint after its step
  ex.set_time_origin(now_seconds());
  StepTimes times;
  int64_t timed_steps = 0;
  std::vector<TraceEvent> trace;
  const int64_t trace_first = start + 1, trace_last = start + 10;  // ten steps after a warm-up step
  const double tokens_per_step = double(plan.data.batch) * plan.dims.rows_per_sample;
  // model FLOPs of one step: forward + backward (2x forward) of every segment for the global batch
  double flops_per_step = 0;
  for (const auto& seg : plan.segments) flops_per_step += 3.0 * seg.fwd_flops_per_sample * plan.data.batch;
  // what the hardware does besides: the forwards that recompute reruns, summed over every rank's plan
  double rerun_flops = 0, rerun_flops_per_step = 0;
  for (const auto& in : plan.instrs)
    if (in.op == Op::Recompute) rerun_flops += instr_forward_flops(plan, in) * in.compute().samples;
  MPI_CHECK(MPI_Allreduce(&rerun_flops, &rerun_flops_per_step, 1, MPI_DOUBLE, MPI_SUM, world));
  const double hardware_flops_per_step = flops_per_step + rerun_flops_per_step;
  if (rank == 0) {
    std::printf("model: %lld parameters, %.3f GFLOP per step (%.0f FLOP per token)\n",
                [&] { long long n = 0; for (const auto& p : plan.params) n += p.numel; return n; }(),
                flops_per_step / 1e9, flops_per_step / tokens_per_step);
    if (rerun_flops_per_step > 0)
      std::printf("recompute: %.3f GFLOP per step more (%.1f%% of the model's), %.3f GFLOP per step on the hardware\n",
                  rerun_flops_per_step / 1e9, 100.0 * rerun_flops_per_step / flops_per_step,
                  hardware_flops_per_step / 1e9);
  }
  int64_t last_saved = -1;
  CheckpointSaver saver(plan.checkpoint_dir, plan.checkpoint_keep, plan.checkpoint_async, world);
  saver.set_damaged(refused);
  const double ckpt_bytes = checkpoint_bytes(plan);
  auto save = [&](int64_t steps_done) {
    WatchedTransfer watched(ex, cat("the save of checkpoint step ", steps_done), ckpt_bytes);
    return saver.save(ex.state(), steps_done);
  };
  auto finish_saves = [&] {  // waits for an asynchronous save still being written
    WatchedTransfer watched(ex, "the completion of the last checkpoint save", ckpt_bytes);
    return saver.finish();
  };
  auto poll_saves = [&] {
    WatchedTransfer watched(ex, "the completion of an asynchronous checkpoint save", ckpt_bytes);
    return saver.poll();
  };
  bool data_replaced = false;  // rank 0 warned that data.path names another file now
  bool balance = false;  // the model has segments with a balance loss: report it apart
  for (const auto& seg : plan.segments) balance |= seg.type->adds_balance_loss;
  int64_t skipped_in_row = 0, skipped_total = 0;
  double profiled_seconds = 0;
  const double loop_start = now_seconds();
  for (int64_t step = start; step < end; ++step) {
    double t0 = now_seconds();
    StepMetrics m = ex.run_step(step);
    double dt = now_seconds() - t0;
    if (!m.finite) ++skipped_in_row, ++skipped_total;
    else skipped_in_row = 0;
    if (step > start || end - start == 1) {
      times += ex.last_step_times();
      ++timed_steps;
      profiled_seconds += dt;
    }
    if (profiler && step == start && end - start > 1) profiler->reset();  // the first step warms up
    if (!opts.trace.empty() && ((step >= trace_first && step <= trace_last) || end - start == 1)) {
      auto ev = ex.take_events();
      trace.insert(trace.end(), ev.begin(), ev.end());
    }
    // [eval]: the validation file's mean cross-entropy with this step's weights, every eval_every steps and after
    // the last (every rank runs the batches; they change nothing a training step carries on)
    const bool evaluated = plan.eval_every > 0 && ((step + 1) % plan.eval_every == 0 || step + 1 == end);
    double val_loss = 0, eval_ms = 0;
    if (evaluated) {
      const double e0 = now_seconds();
      double sum = 0;
      for (int64_t b = 0; b < plan.eval_batches; ++b) {
        const StepMetrics e = ex.run_eval_step(b);
        sum += e.loss - e.balance_loss;
      }
      val_loss = sum / double(plan.eval_batches);
      eval_ms = (now_seconds() - e0) * 1e3;
      ex.take_events();  // not the training step's timeline
    }
    if (rank == 0) {
      const std::vector<LayerRouting> routing = routing_report(plan.segments, plan.dims, m.routing);
      if ((step + 1) % plan.log_every == 0 || step + 1 == end) {
        // time left: the steps to go at the mean step time so far (this loop's, checkpoints included)
        const double eta = (now_seconds() - loop_start) / double(step + 1 - start) * double(end - step - 1);
        std::printf("step %6lld/%lld | loss %.6f", static_cast<long long>(step + 1), static_cast<long long>(end),
                    m.loss);
        if (balance) std::printf(" (balance %.3e)", m.balance_loss);
        std::printf(" | lr %.3e | grad %8.4g | %10.0f tok/s | MFU %5.1f%% | %8.2f ms | %s | ETA %s%s\n", m.lr,
                    m.grad_norm, tokens_per_step / dt, 100.0 * flops_per_step / dt / peak_flops, dt * 1e3,
                    memory_text(ex.buffers().stats().peak_total).c_str(), duration_text(eta).c_str(),
                    routing_step_text(routing).c_str());
      }
      if (evaluated)
        std::printf("eval %6lld/%lld | val_loss %.6f | %lld batches of %d sequences from %s | %8.2f ms\n",
                    static_cast<long long>(step + 1), static_cast<long long>(end), val_loss,
                    static_cast<long long>(plan.eval_batches), plan.eval_data.batch, plan.eval_data.path.c_str(),
                    eval_ms);
      std::fflush(stdout);
      if (!m.finite)
        std::printf("step %6lld: loss %g, gradient norm %g: not finite, no rank applied the update%s\n",
                    static_cast<long long>(step + 1), m.loss, m.grad_norm,
                    plan.skip_nonfinite ? cat(" (", skipped_in_row, " in a row, job.max_skipped = ",
                                              plan.max_skipped, ")").c_str()
                                        : "");
      std::fflush(stdout);
      if (metrics.is_open()) {
        char line[512];
        std::string extra;
        if (balance)
          extra = cat(", \"xent\": ", json_number(m.loss - m.balance_loss), ", \"balance_loss\": ",
                      json_number(m.balance_loss));
        if (!m.finite) extra += ", \"skipped\": true";
        if (plan.precision != Precision::Fp32) extra += cat(", \"precision\": \"", precision_name(plan.precision), "\"");
        if (evaluated) extra += cat(", \"val_loss\": ", json_number(val_loss));
        std::string hardware;  // with recompute: the FLOP/s the hardware ran, reruns included, next to the model's
        if (rerun_flops_per_step > 0)
          hardware = cat(", \"hardware_flops_per_s\": ", json_number(hardware_flops_per_step / dt));
        std::snprintf(line, sizeof(line),
                      "{\"step\": %lld, \"loss\": %s%s, \"lr\": %.9g, \"grad_norm\": %s, \"tokens_per_s\": %.6g, "
                      "\"ms\": %.6g, \"flops_per_s\": %.6g, \"mfu\": %.6g, \"peak_bytes\": %llu",
                      static_cast<long long>(step + 1), json_number(m.loss).c_str(), extra.c_str(), m.lr,
                      json_number(m.grad_norm).c_str(), tokens_per_step / dt, dt * 1e3, flops_per_step / dt,
                      flops_per_step / dt / peak_flops,
                      static_cast<unsigned long long>(ex.buffers().stats().peak_total));
        if (metrics_is_csv(opts.metrics)) {
          MetricsCsvRow row{step + 1, m.loss, m.lr, m.grad_norm, tokens_per_step / dt, dt * 1e3, flops_per_step / dt,
                            flops_per_step / dt / peak_flops, ex.buffers().stats().peak_total};
          row.balance = balance;
          row.xent = m.loss - m.balance_loss;
          row.balance_loss = m.balance_loss;
          row.skipped = !m.finite;
          row.evaluated = evaluated;
          row.val_loss = val_loss;
          metrics << metrics_csv_row(row) << '\n' << std::flush;
        } else {
          metrics << line << hardware << routing_json(routing) << "}\n" << std::flush;
        }
        if (!metrics) {
          std::fprintf(stderr, "piper: error: --metrics %s: cannot write the line of step %lld: %s; the run ends "
                       "after the next step%s\n", opts.metrics.c_str(), static_cast<long long>(step + 1),
                       std::strerror(errno ? errno : EIO), plan.checkpoint_dir.empty() ? "" : ", with a checkpoint");
          std::fflush(stderr);
          metrics.close();
          output_failed = 1;
        }
      }
      if (!data_replaced && plan.data.kind == DataConfig::Kind::Tokens) {
        const std::string now = replaced_file_text(ex.data_identity(), plan.data.path);
        if (!now.empty()) {
          const FileIdentity& id = ex.data_identity();
          std::fprintf(stderr, "piper: warning: data.path '%s' was replaced during the run: it names %s now. This "
                       "run goes on with the file it opened (%lld bytes, %s), and its checkpoints record that file: "
                       "a resume needs that content at data.path\n", plan.data.path.c_str(), now.c_str(),
                       static_cast<long long>(id.bytes), id.hash.c_str());
          std::fflush(stderr);
          data_replaced = true;
        }
      }
    }
    // Every rank saw the same sums, so every rank takes the same way out here.
    if (!m.finite && (!plan.skip_nonfinite || skipped_in_row >= plan.max_skipped)) {
      if (rank == 0)
        std::fprintf(stderr,
                     "piper: error: step %lld: the loss (%g) or the gradient norm (%g) is not finite%s; no update was "
                     "applied and no checkpoint written (job.on_nonfinite = \"%s\"); exit code %d\n",
                     static_cast<long long>(step + 1), m.loss, m.grad_norm,
                     plan.skip_nonfinite ? cat(" for ", skipped_in_row, " steps in a row").c_str() : "",
                     plan.skip_nonfinite ? "skip" : "stop", int(kExitNonFinite));
      if (int code = finish_saves()) return code;  // an earlier checkpoint still being written completes
      return kExitNonFinite;
    }
    if (m.failure_reported) {  // an output of rank 0 failed (printed there): save what the job has, then end
      if (!plan.checkpoint_dir.empty() && last_saved != step + 1) {
        if (int code = save(step + 1)) return code;
      }
      if (int code = finish_saves()) return code;
      if (rank == 0) {
        std::fprintf(stderr, "piper: error: the run ended after step %lld because an output file could not be "
                     "written (above)%s; exit code %d\n", static_cast<long long>(step + 1),
                     plan.checkpoint_dir.empty()
                         ? ""
                         : cat("; checkpoint: ", checkpoint_path(plan.checkpoint_dir, step + 1),
                               " (continue with --resume auto)").c_str(),
                     int(kExitFailure));
        std::fflush(stderr);
      }
      return kExitFailure;
    }
    if (m.stop_requested) {
      if (!plan.checkpoint_dir.empty() && last_saved != step + 1) {
        if (int code = save(step + 1)) return code;
      }
      if (int code = finish_saves()) return code;
      if (rank == 0) {
        if (plan.checkpoint_dir.empty())
          std::printf("stopped by a signal after step %lld; no checkpoint.dir: nothing saved\n",
                      static_cast<long long>(step + 1));
        else
          std::printf("stopped by a signal after step %lld; checkpoint: %s (continue with --resume auto)\n",
                      static_cast<long long>(step + 1), checkpoint_path(plan.checkpoint_dir, step + 1).c_str());
        std::fflush(stdout);
      }
      return kExitStopped;
    }
    if (!plan.checkpoint_dir.empty() && plan.checkpoint_every > 0 && (step + 1) % plan.checkpoint_every == 0) {
      if (int code = save(step + 1)) return code;
      last_saved = step + 1;
    } else if (int code = poll_saves()) {  // an asynchronous checkpoint whose writes are done gets its name
      return code;
    }
  }
  if (!plan.checkpoint_dir.empty() && end > start && last_saved != end) {
    if (int code = save(end)) return code;
  }
  if (int code = finish_saves()) return code;  // the end of the run waits for the last write
  {  // a metrics line of the last step that could not be written: every rank ends with rank 0's code
    int mine = output_failed.load(), any = 0;
    MPI_CHECK(MPI_Allreduce(&mine, &any, 1, MPI_INT, MPI_MAX, world));
    if (any) return kExitFailure;
  }
  if (rank == 0 && end > start) {
    const double loop = now_seconds() - loop_start;
    std::printf("trained steps %lld..%lld in %.3f s: %.2f ms a step with its logging and checkpoints\n",
                static_cast<long long>(start + 1), static_cast<long long>(end), loop, loop * 1e3 / double(end - start));
    const double per_step = loop / double(end - start);
    std::printf("throughput: %.3f model GFLOP/s", flops_per_step / per_step / 1e9);
    if (rerun_flops_per_step > 0)
      std::printf(", %.3f hardware GFLOP/s (recompute included)", hardware_flops_per_step / per_step / 1e9);
    std::printf("\n");
  }
  if (rank == 0 && skipped_total > 0)
    std::printf("%lld step%s had a non-finite loss or gradient norm and applied no update\n",
                static_cast<long long>(skipped_total), skipped_total == 1 ? "" : "s");
  if (!plan.checkpoint_dir.empty() && rank == 0 && end > start)
    std::printf("checkpoint: %s\n", checkpoint_path(plan.checkpoint_dir, end).c_str());
  if (!opts.trace.empty()) write_trace(opts.trace, ex, trace, world);
  const bool report_json = !opts.report_json.empty();
  RunReport report;  // rank 0, for --report-json
  report.times = report_times(plan, times, timed_steps, world);
  if (profiler) {
    const KernelProfile profile = profiler->take(profiled_seconds, timed_steps);
    std::string text = format_profile(profile, rank);
    if (backend->name() != "cpu")
      text += "  (kernels run asynchronously on this backend: the times are the host's launch times)\n";
    print_in_rank_order(text, world);
    if (report_json) report.profiles = gather_json(profile_json(profile), world);
  }
  report.memory = report_memory(ex, world);
  report.replicas = check_replicas(ex, world);
  if (report_json && rank == 0) {
    report.job = plan.job_name;
    report.backend = backend->name();
    report.precision = precision_name(plan.precision);
    if (plan.precision == Precision::Bf16) report.matmul_path = backend->kernels().bf16_matmul_path();
    report.world = plan.world;
    report.first_step = start + 1;
    report.last_step = end;
    write_run_report(opts.report_json, report);
  }
  return report.replicas.identical ? 0 : 1;
}

}  // namespace piper

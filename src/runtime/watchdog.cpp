// Watchdog: the thread that watches this rank's progress during steps, answers the other ranks' notices,
// prints the flight recorders and ends the job with exit code 5 (see watchdog.hpp).
#include "runtime/watchdog.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "util/error.hpp"
#include "util/exit_codes.hpp"
#include "util/mpi_check.hpp"
#include "util/timer.hpp"

namespace piper {

namespace {

constexpr int kNoticeTag = 1;         // on the watchdog's own communicator: "my watchdog fired; print yours"
constexpr double kPollSeconds = 0.1;  // how often the thread looks at progress and notices
constexpr double kGraceSeconds = 2;   // between the notices and MPI_Abort: time for the other ranks to print

// "#12 RECV act.mb1 <- rank 1", collectives with their group's ranks.
std::string describe(const Plan& p, int32_t i) {
  if (i < 0 || size_t(i) >= p.instrs.size()) return cat("#", i);
  const Instr& in = p.instrs[size_t(i)];
  std::string s = cat("#", i, " ", instr_label(p, in));
  const int32_t group = in.group();
  if (group >= 0 && size_t(group) < p.groups.size()) {
    s += " (ranks";
    for (int32_t r : p.group_ranks(p.groups[size_t(group)])) s += cat(" ", r);
    s += ")";
  }
  return s;
}

std::string seconds(double t) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3f", t);
  return b;
}

}  // namespace

std::string flight_report(const Plan& plan, const std::vector<const FlightRecorder*>& streams, double origin,
                          double now) {
  std::string out;
  std::vector<std::vector<FlightRecorder::Record>> records(streams.size());
  for (size_t s = 0; s < streams.size(); ++s) records[s] = streams[s]->snapshot();
  // What each stream is doing now.
  for (size_t s = 0; s < streams.size(); ++s) {
    const std::string name = cat("stream ", s, " (", s < plan.streams.size() ? plan.streams[s] : "?", ")");
    const int32_t on = streams[s]->waiting_on();
    bool busy = false;
    for (const auto& r : records[s]) {
      if (r.end >= 0) continue;
      out += cat(name, ": unfinished ", describe(plan, r.instr), " of step ", r.step, ", started ",
                 seconds(now - r.start), " s ago\n");
      busy = true;
    }
    if (on >= 0) {
      std::string where = on < int32_t(plan.instrs.size()) ? cat(" [stream ", plan.streams[plan.instrs[size_t(on)].stream], "]") : "";
      out += cat(name, ": waits for ", describe(plan, on), where, " before it starts ",
                 describe(plan, streams[s]->waiting_instr()), "\n");
      busy = true;
    }
    if (!busy) out += cat(name, ": idle (nothing running, nothing waited for)\n");
  }
  // The flight recorders.
  for (size_t s = 0; s < streams.size(); ++s) {
    out += cat("stream ", s, " (", s < plan.streams.size() ? plan.streams[s] : "?", "): last ", records[s].size(),
               " instructions, times in seconds since this step began here (now ", seconds(now - origin), "):\n");
    for (const auto& r : records[s]) {
      char line[64];
      std::snprintf(line, sizeof(line), "  step %6lld  start %9s  end %10s  ", static_cast<long long>(r.step),
                    seconds(r.start - origin).c_str(), r.end >= 0 ? seconds(r.end - origin).c_str() : "unfinished");
      out += line + describe(plan, r.instr) + "\n";
    }
  }
  return out;
}

Watchdog::Watchdog(const Plan& plan, std::vector<const FlightRecorder*> streams, MPI_Comm world, double timeout_s)
    : plan_(plan), streams_(std::move(streams)), world_(world), timeout_s_(timeout_s) {
  MPI_Comm_rank(world_, &rank_);
  MPI_Comm_size(world_, &size_);
  MPI_CHECK(MPI_Comm_dup(world_, &notices_));
  armed_at_ = now_seconds();
  thread_ = std::thread([this] {
    try {
      main();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "piper: rank %d: watchdog: error: %s\n", rank_, e.what());
      std::fflush(stderr);
      MPI_Abort(world_, kExitFailure);
    }
  });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  MPI_Comm_free(&notices_);
}

void Watchdog::arm(int64_t step) {
  step_.store(step, std::memory_order_relaxed);
  armed_at_.store(now_seconds(), std::memory_order_relaxed);
  transfer_.store(false, std::memory_order_relaxed);
  armed_.store(true, std::memory_order_release);
}

void Watchdog::arm_transfer(const std::string& what, double bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    transfer_what_ = what;
  }
  transfer_limit_s_.store(timeout_s_ + std::max(0.0, bytes) / kSlowestTransferBytesPerSecond, std::memory_order_relaxed);
  armed_at_.store(now_seconds(), std::memory_order_relaxed);
  transfer_.store(true, std::memory_order_relaxed);
  armed_.store(true, std::memory_order_release);
}

void Watchdog::disarm() { armed_.store(false, std::memory_order_release); }

void Watchdog::main() {
  const auto poll = std::chrono::duration<double>(std::clamp(timeout_s_ / 4, 0.01, kPollSeconds));
  double polled = now_seconds(), resumed = 0;
  while (true) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (cv_.wait_for(lock, poll, [&] { return stop_; })) return;
    }
    // This whole process was not running for a while (SIGSTOP, a suspended machine): it waited for nobody,
    // so its idle time counts from now.
    const double now = now_seconds();
    if (now - polled > std::max(1.0, timeout_s_ / 2)) resumed = now;
    polled = now;
    answer_notices();
    if (!armed_.load(std::memory_order_acquire)) continue;
    if (transfer_.load(std::memory_order_relaxed)) {  // a save or load: its whole time counts, not progress
      const double elapsed = now_seconds() - std::max(resumed, armed_at_.load(std::memory_order_relaxed));
      if (elapsed >= transfer_limit_s_.load(std::memory_order_relaxed) && armed_.load(std::memory_order_acquire))
        fire_transfer(elapsed);
      continue;
    }
    double last = std::max(resumed, armed_at_.load(std::memory_order_relaxed));
    for (const FlightRecorder* r : streams_) last = std::max(last, r->last_end());
    const double idle = now_seconds() - last;
    // a step that ended while we looked is not a hang
    if (idle >= timeout_s_ && armed_.load(std::memory_order_acquire)) fire(idle);
  }
}

void Watchdog::answer_notices() {
  while (true) {
    int flag = 0;
    MPI_Status st;
    MPI_CHECK(MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, notices_, &flag, &st));
    if (!flag) return;
    int from = -1;
    MPI_CHECK(MPI_Recv(&from, 1, MPI_INT, st.MPI_SOURCE, kNoticeTag, notices_, MPI_STATUS_IGNORE));
    if (!printed_) {
      std::string during = armed_.load() ? "" : " (between steps)";
      if (armed_.load() && transfer_.load()) {
        std::lock_guard<std::mutex> lock(mu_);
        during = cat(" (during ", transfer_what_, ")");
      }
      print(cat("watchdog: the watchdog of rank ", from, " fired; the job ends. What this rank was doing, step ",
                step_.load(std::memory_order_relaxed), during, ":"));
    }
  }
}

void Watchdog::fire(double idle_s) {
  char idle[32], timeout[32];
  std::snprintf(idle, sizeof(idle), "%.1f", idle_s);
  std::snprintf(timeout, sizeof(timeout), "%g", timeout_s_);
  const std::string headline =
      cat("watchdog: no instruction finished on this rank for ", idle, " s during step ", step_.load(),
          " (job.watchdog_s = ", timeout, "; raise it for slower steps, or set it to 0 to turn the watchdog off). "
          "A rank stopped or a peer never answered; ending the job with exit code ", int(kExitHung), ".");
  if (!printed_) print(headline);
  else std::fprintf(stderr, "piper: rank %d: %s\n", rank_, headline.c_str());
  std::fflush(stderr);
  end_job();
}

void Watchdog::fire_transfer(double elapsed_s) {
  std::string what;
  {
    std::lock_guard<std::mutex> lock(mu_);
    what = transfer_what_;
  }
  char elapsed[32], limit[32], timeout[32];
  std::snprintf(elapsed, sizeof(elapsed), "%.1f", elapsed_s);
  std::snprintf(limit, sizeof(limit), "%.1f", transfer_limit_s_.load());
  std::snprintf(timeout, sizeof(timeout), "%g", timeout_s_);
  const std::string headline =
      cat("watchdog: ", what, " has not ended on this rank after ", elapsed, " s (its limit: ", limit,
          " s, job.watchdog_s = ", timeout, " plus its bytes at ", kSlowestTransferBytesPerSecond / 1e6,
          " MB/s). A rank stopped, a peer never answered or the file system hangs; ending the job with exit code ",
          int(kExitHung), ".");
  if (!printed_) print(headline);
  else std::fprintf(stderr, "piper: rank %d: %s\n", rank_, headline.c_str());
  std::fflush(stderr);
  end_job();
}

void Watchdog::end_job() {
  // Ask every other rank to print its recorders too (a stopped rank cannot); the notices are never waited for.
  std::vector<MPI_Request> sent(size_t(size_), MPI_REQUEST_NULL);
  for (int r = 0; r < size_; ++r)
    if (r != rank_) MPI_Isend(&rank_, 1, MPI_INT, r, kNoticeTag, notices_, &sent[size_t(r)]);
  const double until = now_seconds() + kGraceSeconds;
  while (now_seconds() < until) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  MPI_Abort(world_, kExitHung);
  std::abort();  // MPI_Abort does not return
}

void Watchdog::print(const std::string& headline) {
  printed_ = true;
  const double now = now_seconds();
  std::string text = headline + "\n" + flight_report(plan_, streams_, armed_at_.load(), now);
  // one write, every line prefixed with the rank, so that ranks' reports interleave only by whole lines
  const std::string prefix = cat("piper: rank ", rank_, ": ");
  std::string out;
  size_t at = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    if (nl == std::string::npos) nl = text.size();
    out += prefix;
    out.append(text, at, nl - at);
    out += '\n';
    at = nl + 1;
  }
  std::fwrite(out.data(), 1, out.size(), stderr);
  std::fflush(stderr);
}

}  // namespace piper

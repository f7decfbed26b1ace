// The watchdog: a thread per rank that ends the job (exit code 5) when no instruction finished on this rank for
// job.watchdog_s seconds during a step, or a save or load outlasts its limit, after printing every stream's
// flight recorder here and on the other ranks.
#pragma once
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "plan/plan.hpp"
#include "runtime/flight_recorder.hpp"

namespace piper {

class Watchdog {
 public:
  // Starts this rank's watchdog over the recorders of its streams (by plan stream). Collective over `world`:
  // every rank makes one (it duplicates `world` for the notices the ranks send each other).
  Watchdog(const Plan& plan, std::vector<const FlightRecorder*> streams, MPI_Comm world, double timeout_s);
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  // A step starts (progress is counted from now) and ends; between steps the watchdog only answers notices.
  void arm(int64_t step);
  void disarm();
  // A transfer (a checkpoint save or load, `what` names it) of `bytes` starts: it must end within
  // timeout_s + bytes / kSlowestTransferBytesPerSecond; disarm() when it ended.
  void arm_transfer(const std::string& what, double bytes);
  static constexpr double kSlowestTransferBytesPerSecond = 20e6;

 private:
  void main();
  void answer_notices();
  [[noreturn]] void fire(double idle_s);
  [[noreturn]] void fire_transfer(double elapsed_s);
  [[noreturn]] void end_job();
  void print(const std::string& headline);

  const Plan& plan_;
  std::vector<const FlightRecorder*> streams_;
  MPI_Comm world_;
  MPI_Comm notices_ = MPI_COMM_NULL;
  const double timeout_s_;
  int rank_ = 0, size_ = 1;
  std::atomic<bool> armed_{false};
  std::atomic<bool> transfer_{false};  // armed over a transfer, not a step
  std::atomic<double> transfer_limit_s_{0};
  std::string transfer_what_;           // under mu_
  std::atomic<double> armed_at_{0};
  std::atomic<int64_t> step_{0};
  bool printed_ = false;  // this rank's recorders went to stderr already
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// Every stream's current instruction and its flight recorder, one line each, as the watchdog prints them.
// Times are seconds since `origin` (the start of the step).
std::string flight_report(const Plan& plan, const std::vector<const FlightRecorder*>& streams, double origin,
                          double now);

}  // namespace piper

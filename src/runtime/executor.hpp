// The executor runs one plan, step after step, on any backend. Each plan stream is an in-order queue
// served by its own thread; instructions wait for the instructions they depend on; communication is
// posted and completed later. It knows instructions and buffers, never strategies.
#pragma once
#include <mpi.h>

#include <atomic>
#include <condition_variable>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "backend/backend.hpp"
#include "data/data.hpp"
#include "model/segment_type.hpp"
#include "plan/owned_slices.hpp"
#include "plan/plan.hpp"
#include "plan/state_view.hpp"
#include "runtime/buffer_store.hpp"
#include "runtime/flight_recorder.hpp"
#include "runtime/timeline.hpp"
#include "runtime/watchdog.hpp"

namespace piper {

struct SegmentIO;

struct StepMetrics {
  double loss = 0;       // training loss of the global batch: cross-entropy + balance loss
  double balance_loss = 0;  // the segments' balance losses (mixture of experts), summed over all ranks
  double grad_norm = 0;  // global gradient norm before clipping
  double lr = 0;
  bool finite = true;          // loss and gradient norm were finite; when not, no rank applied the update
  bool stop_requested = false; // some rank's stop flag was set when it entered the step sync
  bool failure_reported = false;  // some rank's failure flag was set when it entered the step sync
  // Every routing segment's statistics block (SegmentType::routed_experts: loads, then dropped), in segment
  // order, summed over all ranks: the whole global batch's routing.
  std::vector<double> routing;
};


class Executor {
 public:
  // `kernels`: the kernels to run segments with (a profiling wrapper); null = the backend's own.
  Executor(const Plan& plan, Backend& backend, MPI_Comm world, Kernels* kernels = nullptr);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Fills parameters from the strategy-independent init rule and zeroes optimizer state.
  void init_parameters();
  StepMetrics run_step(int64_t step);
  // Batch `batch` of the plan's evaluation data (the validation file, in order) through the whole step with the
  // current weights, which it leaves as they are: no update, no optimizer or routing-statistics change. Its loss
  // is the batch's; the training data and every state a training step carries on are untouched.
  StepMetrics run_eval_step(int64_t batch);
  // A flag any thread (or a signal handler) may set; the step sync sums it over all ranks, so every rank
  // sees the same `stop_requested` at the same step.
  void watch_stop_flag(const std::atomic<int>* flag) { stop_flag_ = flag; }
  // The same for a failure outside the executor (an output file that cannot be written): `failure_reported`.
  void watch_failure_flag(const std::atomic<int>* flag) { failure_flag_ = flag; }
  // Arms the watchdog (when the job has one) over a transfer outside the steps, `what` of `bytes` (a
  // checkpoint save or load), until end_transfer(). Its limit grows with the bytes (watchdog.hpp).
  void watch_transfer(const std::string& what, double bytes) {
    if (watchdog_) watchdog_->arm_transfer(what, bytes);
  }
  void end_transfer() {
    if (watchdog_) watchdog_->disarm();
  }

  const Plan& plan() const { return plan_; }
  // The token file this run reads, as it was when the run opened it (empty hash for synthetic data).
  const FileIdentity& data_identity() const { return data_identity_; }
  BufferStore& buffers() { return store_; }
  Backend& backend() { return backend_; }
  MPI_Comm world() const { return world_; }
  // Where parameter `pp` (a plan param) lives: pointer to its element `index` of the bucket layout.
  float* bucket_ptr(int32_t buf, int64_t offset) { return store_.f(buf) + offset; }
  // The state as checkpoints see it (the backend's kernels, not a profiling wrapper: saves are not timed).
  StateView state() {
    return {plan_, backend_.kernels(), [this](int32_t buf) { return store_.f(buf); }, data_identity_, world_};
  }

  // Timing: every instruction's start and end are recorded (cheap); after a step, its events can be
  // taken (for a trace file) and its times are summarized. The origin is set by set_time_origin.
  // Where device work runs after the host issued it (CUDA), a compute instruction ends, for the host, when
  // it is issued; set_synchronous(true) waits for each one's device work, so that the times are the
  // device's (for traces and profiles), at the cost of overlapping streams.
  void set_synchronous(bool on) { synchronous_ = on; }
  void set_time_origin(double t0) { t0_ = t0; }
  std::vector<TraceEvent> take_events();
  const StepTimes& last_step_times() const { return last_times_; }
  std::vector<int> group_sizes() const;

 private:
  struct Pending {
    int32_t instr;
    std::unique_ptr<CommHandle> handle;
  };
  struct Stream {
    int id = 0;
    std::vector<int32_t> instrs;
    std::unique_ptr<StreamContext> ctx;
    std::vector<Pending> pending;
    std::thread thread;
    std::vector<TraceEvent> events;
    std::unique_ptr<FlightRecorder> flight;  // its last instructions, for the watchdog
  };

  void stream_main(Stream& s);
  void run_stream_step(Stream& s);
  void wait_for(Stream& s, int32_t j);
  void poll(Stream& s);
  void execute(Stream& s, int32_t i);
  void complete(Stream& s, int32_t i);
  void run_compute(Op op, const ComputeArgs& in);
  void backward_weight(const ComputeArgs& in, const Segment& seg, const SegmentIO& io);
  // One compute pass of a segment over io.samples samples, the stash at io.stash; `wstash_at`: bytes into the
  // instruction's BI→BW stash where this pass's part starts.
  void run_pass(Op op, const ComputeArgs& in, const Segment& seg, SegmentIO io, size_t wstash_at);
  // The same for a stash held in bf16: piece by piece (HeldStash), each stored from or loaded into the fp32 view.
  void run_held_pieces(Op op, const ComputeArgs& in, const Segment& seg, const SegmentIO& io, const HeldStash& held);
  void load_data(const ComputeArgs& in, void* stash);
  // A stash held in bf16: the fp32 `view` stored into `held` by its layout's runs, or read back from it.
  void store_stash_bf16(const StashLayout& layout, const float* view, void* held);
  void load_stash_bf16(const StashLayout& layout, const void* held, float* view);
  void run_update(const UpdateArgs& in);
  void run_step_sync(const StepSyncArgs& in);
  void finish_collective(Op op, const CollectiveArgs& in);
  void make_communicators();
  Communicator& group(int32_t g);
  // A parameter moved by its segment's statistics (ParamSpec::statistics_segment), not by the optimizer: the
  // elements of `piece`, at p.
  void move_by_statistics(const ParamSpec& spec, const ParamPiece& piece, float* p);
  // count × this rank's index in bucket `bucket`'s group when `flag` is among `flags`, else 0
  int64_t shard_offset(uint8_t flags, uint8_t flag, int64_t count, int32_t bucket) const;

  const Plan& plan_;
  Backend& backend_;
  Kernels& k_;
  MPI_Comm world_;
  BufferStore store_;
  std::unique_ptr<DataLoader> data_;
  std::unique_ptr<DataLoader> eval_data_;  // the validation file (plan_.eval_every > 0); data_ while evaluating
  bool evaluating_ = false;                // run_eval_step: updates do nothing
  FileIdentity data_identity_;  // the token file as this rank opened it at start
  std::vector<std::unique_ptr<Communicator>> groups_;  // by index into plan.groups
  std::vector<size_t> group_order_;                    // indices into groups_, in the order they were made
  std::unique_ptr<Communicator> p2p_;
  std::vector<std::vector<int32_t>> touched_;  // buffers each instruction uses
  std::vector<int32_t> param_slot_;            // model param → plan param
  std::vector<Stream> streams_;
  std::unique_ptr<std::atomic<int64_t>[]> done_;
  // device: the step's sums, read by the step sync — loss, gradient sum of squares, balance losses, a sink for
  // what recomputed forwards add, then every routing segment's statistics block (kRoutingAt + routing_offset_)
  double* scalars_ = nullptr;
  size_t scalar_count_ = 0;
  static constexpr size_t kLossAt = 0, kNormAt = 1, kBalanceAt = 2, kSinkAt = 3, kRoutingAt = 4;
  std::vector<double> device_sums_;  // host copy of scalars_ at the step sync
  // per buffer: the part counts of ragged rows as an exchange or a counts read brought them to the host (empty for
  // other buffers); sized at construction, written by the instruction, read by the segments after it
  std::vector<std::vector<int32_t>> host_counts_;
  std::vector<uint8_t> host_staging_;

  // step state
  int64_t step_ = 0;
  int64_t epoch_ = 0;
  double clip_scale_ = 1;
  bool skip_update_ = false;  // the step's loss or gradient norm is not finite: updates do nothing
  const std::atomic<int>* stop_flag_ = nullptr;
  const std::atomic<int>* failure_flag_ = nullptr;
  size_t routing_size_ = 0;                 // doubles of all routing statistics blocks
  std::vector<int64_t> routing_offset_;     // per segment: its statistics block (-1: not a routing segment)
  // (segment, samples, with its input) → how its stash is held in bf16 (ComputeArgs::stash_bf16): pieces and runs
  std::map<std::tuple<int32_t, int32_t, bool>, HeldStash> held_stashes_;
  std::vector<double> sync_local_, sync_global_;  // the step sync's sums, allocated once
  std::vector<float> statistics_delta_;             // host: a parameter's step from statistics
  float* statistics_delta_dev_ = nullptr;           // device: the part of it being added
  size_t statistics_delta_bytes_ = 0;
  double lr_ = 0;
  StepMetrics metrics_;

  // coordination
  std::mutex mu_;
  std::condition_variable cv_start_, cv_done_;
  int64_t generation_ = 0;
  int finished_ = 0;
  bool shutdown_ = false;
  std::atomic<bool> abort_{false};
  std::exception_ptr error_;
  double t0_ = 0;
  bool synchronous_ = false;
  StepTimes last_times_;
  std::vector<int32_t> event_index_;  // instruction → its event in its stream's list this step
  std::vector<uint64_t> flight_index_;  // instruction → its record in its stream's flight recorder
  std::unique_ptr<Watchdog> watchdog_;  // when plan.watchdog_s > 0; armed while a step runs
};

}  // namespace piper

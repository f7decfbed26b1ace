// NCCL communicator of the CUDA backend: collectives on one NCCL communicator per group, point-to-point
// transfers on two-rank NCCL channels per (peer, direction), each on its own stream after the work already
// queued on the caller's stream. CommHandle::test() queries an event recorded after the operation.
#ifdef PIPER_HAVE_CUDA
#include "backend/cuda/nccl_communicator.hpp"
#include "backend/mpi_ranks.hpp"
#include "backend/rows_layout.hpp"

#include <nccl.h>

#include <atomic>
#include <deque>
#include <map>
#include <tuple>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "backend/cuda/cuda_common.hpp"
#include "util/mpi_check.hpp"

#define NCCL_CHECK(call)                                                                                \
  do {                                                                                                  \
    ncclResult_t res_ = (call);                                                                         \
    if (res_ != ncclSuccess)                                                                            \
      throw ::piper::SystemError(::piper::cat(__FILE__, ":", __LINE__, ": ", #call, ": ",               \
                                              ncclGetErrorString(res_), " (", ncclGetLastError(nullptr), \
                                              ")"));                                                    \
  } while (0)

namespace piper {

namespace {

// MPI tag of the unique id a sender hands to its receiver: the same on both ends for one stream name.
int channel_tag(const std::string& stream) {
  uint32_t h = 2166136261u;
  for (unsigned char c : stream) h = (h ^ c) * 16777619u;
  return int(h % 30000u);
}

cudaEvent_t new_event() {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return e;
}

// One posted operation. `ready` marks the caller's stream at posting; `done` follows it on the NCCL stream.
struct Op {
  bool send = false;  // point-to-point only: send or receive
  float* buf = nullptr;
  size_t count = 0;
  cudaEvent_t ready = nullptr;
  cudaEvent_t done = nullptr;
  std::atomic<bool> enqueued{false};  // set under the communicator's lock, read by handles
  ~Op() {
    if (ready) (void)cudaEventDestroy(ready);
    if (done) (void)cudaEventDestroy(done);
  }
};

// An NCCL communicator with the stream its operations run on.
// NCCL runs the operations of one communicator in posting order, so a single communicator for all transfers
// would make a send wait for an unrelated receive posted before it (a deadlock when two ranks send to each
// other first). Each (peer, direction) therefore gets its own two-rank channel, created in the background
// on first use once both sides know its id; transfers posted before that wait in `waiting`, in order.
struct Link {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int nranks = 0, rank = 0;
  bool ready = false;  // comm usable
  std::shared_ptr<Op> last;  // latest enqueued operation
  // channel setup
  ncclUniqueId id{};
  bool id_known = false;
  MPI_Request id_send = MPI_REQUEST_NULL, id_recv = MPI_REQUEST_NULL;
  std::thread init;
  std::atomic<bool> init_done{false};
  ncclResult_t init_result = ncclSuccess;
  std::deque<std::shared_ptr<Op>> waiting;
};

// Throws if NCCL reported an asynchronous failure (a peer died, a network error) on `comm`.
void check_async(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
  if (state != ncclSuccess && state != ncclInProgress)
    throw SystemError(cat("NCCL asynchronous error: ", ncclGetErrorString(state), " (", ncclGetLastError(comm), ")"));
}

// One-float transfer over a new two-rank channel: NCCL connects the pair during its first transfer.
ncclResult_t connect_channel(Link& ch) {
  void* one = nullptr;
  if (cudaMallocAsync(&one, sizeof(float), ch.stream) != cudaSuccess) return ncclUnhandledCudaError;
  (void)cudaMemsetAsync(one, 0, sizeof(float), ch.stream);
  ncclResult_t res = ch.rank == 0 ? ncclSend(one, 1, ncclFloat, 1, ch.comm, ch.stream)
                                  : ncclRecv(one, 1, ncclFloat, 0, ch.comm, ch.stream);
  (void)cudaFreeAsync(one, ch.stream);
  if (cudaStreamSynchronize(ch.stream) != cudaSuccess && res == ncclSuccess) res = ncclUnhandledCudaError;
  return res;
}

// Releases a link: destroyed when idle, aborted when an operation never finished (a failed job).
void close_link(Link& l) {
  if (l.ready && l.comm) {
    bool idle = !l.last || cudaEventQuery(l.last->done) == cudaSuccess;
    (void)(idle ? ncclCommDestroy(l.comm) : ncclCommAbort(l.comm));
    l.comm = nullptr;
  }
  if (l.stream) (void)cudaStreamDestroy(l.stream);
  l.stream = nullptr;
}

class NcclCommunicator;

class NcclHandle final : public CommHandle {
 public:
  NcclHandle(std::shared_ptr<Op> op, std::shared_ptr<Link> link, NcclCommunicator* owner)
      : op_(std::move(op)), link_(std::move(link)), owner_(owner) {}
  bool test() override;

 private:
  std::shared_ptr<Op> op_;
  std::shared_ptr<Link> link_;
  NcclCommunicator* owner_;
};

class DoneHandle final : public CommHandle {
 public:
  bool test() override { return true; }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, MPI_Comm world, int device) : comm_(comm), device_(device) {
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    to_local_ = world_to_comm_ranks(comm_, world);  // for point-to-point peers

    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, int(sizeof(id)), MPI_BYTE, 0, comm_));
    group_ = std::make_shared<Link>();
    group_->nranks = size_;
    group_->rank = rank_;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&group_->stream, cudaStreamNonBlocking));
    NCCL_CHECK(ncclCommInitRank(&group_->comm, size_, id, rank_));
    group_->ready = true;
  }

  ~NcclCommunicator() override {
    for (auto& entry : channels_) {
      Link& ch = *entry.second;
      if (ch.init.joinable()) {
        if (ch.init_done.load(std::memory_order_acquire)) {
          ch.init.join();
          ch.ready = ch.init_result == ncclSuccess;
        } else {
          // The peer never joined (a failed job): the thread keeps the link, which is left to it.
          ch.init.detach();
          continue;
        }
      }
      if (ch.id_recv != MPI_REQUEST_NULL) {
        MPI_Cancel(&ch.id_recv);
        MPI_Request_free(&ch.id_recv);
      }
      if (ch.id_send != MPI_REQUEST_NULL) MPI_Request_free(&ch.id_send);
      close_link(ch);
    }
    close_link(*group_);
    MPI_Comm_free(&comm_);
  }

  int size() const override { return size_; }
  int rank() const override { return rank_; }

  std::unique_ptr<CommHandle> all_reduce(float* buf, size_t count, StreamContext* s) override {
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, group_->comm, group_->stream));  // buf(count)
    return end_collective(op);
  }

  std::unique_ptr<CommHandle> reduce_scatter(const float* src, float* dst, size_t count, StreamContext* s) override {
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    // src(size·count) → dst(count)
    NCCL_CHECK(ncclReduceScatter(src, dst, count, ncclFloat, ncclSum, group_->comm, group_->stream));
    return end_collective(op);
  }

  std::unique_ptr<CommHandle> all_gather(const float* src, float* dst, size_t count, StreamContext* s) override {
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    const float* send = src ? src : dst + size_t(rank_) * count;  // in place: NCCL's own convention
    NCCL_CHECK(ncclAllGather(send, dst, count, ncclFloat, group_->comm, group_->stream));  // dst(size·count)
    return end_collective(op);
  }

  // Counts first (grouped send/recv of parts/size int32 per peer), read back to the host to size the rows,
  // then the rows as grouped send/recv. The calling stream thread waits for the counts.
  std::unique_ptr<CommHandle> all_to_all_rows(const void* src, void* dst, int parts, int width,
                                              StreamContext* s) override {
    PIPER_CHECK(parts % size_ == 0, "all_to_all_rows: ", parts, " parts over ", size_, " ranks");
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    const int q = parts / size_;
    const auto* src_counts = static_cast<const int32_t*>(src);
    auto* dst_counts = static_cast<int32_t*>(dst);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      NCCL_CHECK(ncclSend(src_counts + size_t(r) * q, size_t(q), ncclInt32, r, group_->comm, group_->stream));
      NCCL_CHECK(ncclRecv(dst_counts + size_t(r) * q, size_t(q), ncclInt32, r, group_->comm, group_->stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    std::vector<int32_t> sent(static_cast<size_t>(parts)), got(static_cast<size_t>(parts));
    CUDA_CHECK(cudaMemcpyAsync(sent.data(), src_counts, sizeof(int32_t) * size_t(parts), cudaMemcpyDeviceToHost,
                               group_->stream));
    CUDA_CHECK(cudaMemcpyAsync(got.data(), dst_counts, sizeof(int32_t) * size_t(parts), cudaMemcpyDeviceToHost,
                               group_->stream));
    CUDA_CHECK(cudaStreamSynchronize(group_->stream));
    const float* src_rows = reinterpret_cast<const float*>(src_counts + parts);
    float* dst_rows = reinterpret_cast<float*>(dst_counts + parts);
    const RowsLayout l = rows_layout(sent.data(), got.data(), parts, size_, width);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      const size_t s = size_t(r);
      if (l.send_counts[s])
        NCCL_CHECK(ncclSend(src_rows + l.send_displs[s], size_t(l.send_counts[s]), ncclFloat, r, group_->comm,
                            group_->stream));
      if (l.recv_counts[s])
        NCCL_CHECK(ncclRecv(dst_rows + l.recv_displs[s], size_t(l.recv_counts[s]), ncclFloat, r, group_->comm,
                            group_->stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    return end_collective(op);
  }

  // NCCL matches the transfers of one (peer, direction) in posting order; the tag is not needed.
  std::unique_ptr<CommHandle> send(const float* buf, size_t count, int peer_world_rank, int,
                                   StreamContext* s) override {
    return post_transfer(true, const_cast<float*>(buf), count, peer_world_rank, s);
  }
  std::unique_ptr<CommHandle> recv(float* buf, size_t count, int peer_world_rank, int, StreamContext* s) override {
    return post_transfer(false, buf, count, peer_world_rank, s);
  }

  // Starts channels whose id arrived and enqueues the transfers of channels that became ready.
  void progress() {
    std::lock_guard<std::mutex> lock(mu_);
    progress_locked();
  }

 private:
  // The caller's stream (as given, else the thread's bound one); nullptr when there is none.
  static cudaStream_t caller_stream(StreamContext* s) {
    if (s) {
      auto* cs = dynamic_cast<CudaStream*>(s);
      PIPER_CHECK(cs, "communicator: the stream was not made by the CUDA backend");
      return cs->stream();
    }
    CudaStream* bound = bound_cuda_stream();
    return bound ? bound->stream() : nullptr;
  }

  static std::shared_ptr<Op> new_op(StreamContext* s) {
    auto op = std::make_shared<Op>();
    op->done = new_event();
    if (cudaStream_t st = caller_stream(s)) {
      op->ready = new_event();
      CUDA_CHECK(cudaEventRecord(op->ready, st));
    }
    return op;
  }

  std::shared_ptr<Op> begin_collective(StreamContext* s) {
    auto op = new_op(s);
    if (op->ready) CUDA_CHECK(cudaStreamWaitEvent(group_->stream, op->ready, 0));
    return op;
  }

  std::unique_ptr<CommHandle> end_collective(const std::shared_ptr<Op>& op) {
    CUDA_CHECK(cudaEventRecord(op->done, group_->stream));
    op->enqueued.store(true, std::memory_order_release);
    group_->last = op;
    return std::make_unique<NcclHandle>(op, group_, this);
  }

  std::unique_ptr<CommHandle> post_transfer(bool sending, float* buf, size_t count, int peer_world_rank,
                                            StreamContext* s) {
    PIPER_CHECK(peer_world_rank >= 0 && size_t(peer_world_rank) < to_local_.size(), "peer world rank ",
                peer_world_rank, " out of range");
    const int peer = to_local_[size_t(peer_world_rank)];
    PIPER_CHECK(peer != MPI_UNDEFINED, "world rank ", peer_world_rank, " is not in this communicator");
    PIPER_CHECK(peer != rank_, "point-to-point transfer of rank ", rank_, " with itself");
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    // One channel per executor stream as well: the compiler proves first-in first-out order per
    // (sender, receiver, stream), and transfers of two streams must not queue behind each other.
    const auto* cs = dynamic_cast<const CudaStream*>(s);
    std::shared_ptr<Link> ch = channel(peer, sending, cs ? cs->name() : std::string());
    auto op = new_op(s);
    op->send = sending;
    op->buf = buf;
    op->count = count;
    ch->waiting.push_back(op);
    progress_locked();
    return std::make_unique<NcclHandle>(op, ch, this);
  }

  // The channel for transfers to (sending) or from `peer` on one stream; the sender makes the id and hands
  // it over MPI, tagged by the stream's name so that the two ends of each channel find each other.
  std::shared_ptr<Link> channel(int peer, bool sending, const std::string& stream) {
    std::shared_ptr<Link>& ch = channels_[{peer, sending, stream}];
    if (ch) return ch;
    ch = std::make_shared<Link>();
    ch->nranks = 2;
    ch->rank = sending ? 0 : 1;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking));
    if (sending) {
      NCCL_CHECK(ncclGetUniqueId(&ch->id));
      MPI_CHECK(MPI_Isend(&ch->id, int(sizeof(ch->id)), MPI_BYTE, peer, channel_tag(stream), comm_, &ch->id_send));
      ch->id_known = true;
      start_init(ch);
    } else {
      MPI_CHECK(MPI_Irecv(&ch->id, int(sizeof(ch->id)), MPI_BYTE, peer, channel_tag(stream), comm_, &ch->id_recv));
    }
    return ch;
  }

  // ncclCommInitRank and NCCL's connection setup (done by the first transfer) block until the peer takes
  // part, so both happen on a thread of their own, with a one-float transfer; the executor keeps going.
  void start_init(const std::shared_ptr<Link>& ch) {
    const int device = device_;
    ch->init = std::thread([ch, device] {
      ncclResult_t res = ncclUnhandledCudaError;
      if (cudaSetDevice(device) == cudaSuccess) res = ncclCommInitRank(&ch->comm, ch->nranks, ch->id, ch->rank);
      if (res == ncclSuccess) res = connect_channel(*ch);
      ch->init_result = res;
      ch->init_done.store(true, std::memory_order_release);
    });
  }

  void progress_locked() {
    for (auto& entry : channels_) {
      Link& ch = *entry.second;
      if (ch.id_send != MPI_REQUEST_NULL) {
        int sent = 0;
        MPI_CHECK(MPI_Test(&ch.id_send, &sent, MPI_STATUS_IGNORE));
      }
      if (!ch.id_known) {
        int arrived = 0;
        MPI_CHECK(MPI_Test(&ch.id_recv, &arrived, MPI_STATUS_IGNORE));
        if (!arrived) continue;
        ch.id_known = true;
        start_init(entry.second);
      }
      if (!ch.ready) {
        if (!ch.init_done.load(std::memory_order_acquire)) continue;
        if (ch.init.joinable()) ch.init.join();
        if (ch.init_result != ncclSuccess)
          throw SystemError(cat("setting up the NCCL channel ", ch.rank == 0 ? "to" : "from", " rank ",
                                std::get<0>(entry.first), " (", std::get<2>(entry.first), ") failed: ",
                                ncclGetErrorString(ch.init_result)));
        ch.ready = true;
      }
      while (!ch.waiting.empty()) {
        Op& op = *ch.waiting.front();
        if (op.ready) CUDA_CHECK(cudaStreamWaitEvent(ch.stream, op.ready, 0));
        const int peer = 1 - ch.rank;  // rank in the two-rank channel
        if (op.send)
          NCCL_CHECK(ncclSend(op.buf, op.count, ncclFloat, peer, ch.comm, ch.stream));
        else
          NCCL_CHECK(ncclRecv(op.buf, op.count, ncclFloat, peer, ch.comm, ch.stream));
        CUDA_CHECK(cudaEventRecord(op.done, ch.stream));
        op.enqueued.store(true, std::memory_order_release);
        ch.last = ch.waiting.front();
        ch.waiting.pop_front();
      }
    }
  }

  MPI_Comm comm_;
  int device_ = 0;
  int size_ = 1, rank_ = 0;
  std::vector<int> to_local_;
  std::shared_ptr<Link> group_;                                   // collectives
  std::map<std::tuple<int, bool, std::string>, std::shared_ptr<Link>> channels_;  // (peer, sending, stream)
  std::mutex mu_;
};

bool NcclHandle::test() {
  if (!op_->enqueued.load(std::memory_order_acquire)) {
    owner_->progress();
    if (!op_->enqueued.load(std::memory_order_acquire)) return false;
  }
  cudaError_t err = cudaEventQuery(op_->done);
  if (err == cudaSuccess) return true;
  if (err != cudaErrorNotReady) CUDA_CHECK(err);
  check_async(link_->comm);
  return false;
}

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, MPI_Comm world, int device) {
  return std::make_unique<NcclCommunicator>(comm, world, device);
}

}  // namespace piper

#endif  // PIPER_HAVE_CUDA

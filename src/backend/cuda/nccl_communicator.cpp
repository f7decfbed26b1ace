// NCCL communicator of the CUDA backend: collectives on one NCCL communicator per group, point-to-point
// transfers on two-rank NCCL channels per (peer, direction, stream), all set up by connect() before the
// first step in an order every rank shares, each on its own stream after the work already queued on the
// caller's stream. CommHandle::test() queries an event (from a pool, created once) recorded after the operation.
#ifdef PIPER_HAVE_CUDA
#include "backend/cuda/nccl_communicator.hpp"
#include "backend/mpi_ranks.hpp"
#include "backend/ragged_rows.hpp"

#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <tuple>
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

// Events of one communicator's operations, created on first need and reused: no cudaEventCreate per
// operation once the pool holds as many as are in flight.
class EventPool {
 public:
  explicit EventPool(int device) : device_(device) {}
  ~EventPool() {
    for (cudaEvent_t e : free_) (void)cudaEventDestroy(e);
  }
  cudaEvent_t take() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        cudaEvent_t e = free_.back();
        free_.pop_back();
        return e;
      }
    }
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaSetDevice(device_));
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    return e;
  }
  void give(cudaEvent_t e) noexcept {
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(e);
  }

 private:
  int device_;
  std::mutex mu_;
  std::vector<cudaEvent_t> free_;
};

// One posted operation. `ready` marks the caller's stream at posting; `done` follows it on the NCCL stream.
struct Op {
  std::shared_ptr<EventPool> pool;
  cudaEvent_t ready = nullptr;
  cudaEvent_t done = nullptr;
  ~Op() {
    if (ready) pool->give(ready);
    if (done) pool->give(done);
  }
};

// An NCCL communicator with the stream its operations run on.
struct Link {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  int nranks = 0, rank = 0;
  std::shared_ptr<Op> last;  // latest enqueued operation
  std::string name;          // for messages: "to rank 3 (p2p.fwd)"
};

// Throws if NCCL reported an asynchronous failure (a peer died, a network error) on `comm`.
void check_async(ncclComm_t comm) {
  ncclResult_t state = ncclSuccess;
  NCCL_CHECK(ncclCommGetAsyncError(comm, &state));
  if (state != ncclSuccess && state != ncclInProgress)
    throw SystemError(cat("NCCL asynchronous error: ", ncclGetErrorString(state), " (", ncclGetLastError(comm), ")"));
}

// One-float transfer over a new two-rank channel: NCCL connects the pair during its first transfer, which
// therefore happens here, before the first step, rather than inside it.
void connect_channel(Link& ch) {
  void* one = nullptr;
  CUDA_CHECK(cudaMallocAsync(&one, sizeof(float), ch.stream));
  CUDA_CHECK(cudaMemsetAsync(one, 0, sizeof(float), ch.stream));
  NCCL_CHECK(ch.rank == 0 ? ncclSend(one, 1, ncclFloat, 1, ch.comm, ch.stream)
                          : ncclRecv(one, 1, ncclFloat, 0, ch.comm, ch.stream));
  CUDA_CHECK(cudaFreeAsync(one, ch.stream));
  CUDA_CHECK(cudaStreamSynchronize(ch.stream));
}

// Releases a link, never throwing: destroyed when idle, aborted when an operation never finished (a failed
// job). ncclCommDestroy waits for the other members: callers release links in an order all ranks share.
void close_link(Link& l) noexcept {
  if (l.comm) {
    bool idle = !l.last || cudaEventQuery(l.last->done) == cudaSuccess;
    (void)(idle ? ncclCommDestroy(l.comm) : ncclCommAbort(l.comm));
    l.comm = nullptr;
  }
  if (l.stream) (void)cudaStreamDestroy(l.stream);
  l.stream = nullptr;
}

class NcclHandle final : public CommHandle {
 public:
  NcclHandle(std::shared_ptr<Op> op, std::shared_ptr<Link> link) : op_(std::move(op)), link_(std::move(link)) {}
  bool test() override {
    cudaError_t err = cudaEventQuery(op_->done);
    if (err == cudaSuccess) return true;
    if (err != cudaErrorNotReady) CUDA_CHECK(err);
    check_async(link_->comm);
    return false;
  }

 private:
  std::shared_ptr<Op> op_;
  std::shared_ptr<Link> link_;
};

class DoneHandle final : public CommHandle {
 public:
  bool test() override { return true; }
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, MPI_Comm world, int device, bool collectives)
      : comm_(comm), device_(device), pool_(std::make_shared<EventPool>(device)) {
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    to_local_ = world_to_comm_ranks(comm_, world);  // for point-to-point peers
    CUDA_CHECK(cudaSetDevice(device_));
    if (!collectives) return;
    ncclUniqueId id{};
    if (rank_ == 0) NCCL_CHECK(ncclGetUniqueId(&id));
    MPI_CHECK(MPI_Bcast(&id, int(sizeof(id)), MPI_BYTE, 0, comm_));
    group_ = std::make_shared<Link>();
    group_->nranks = size_;
    group_->rank = rank_;
    group_->name = cat("group of ", size_, " ranks");
    CUDA_CHECK(cudaStreamCreateWithFlags(&group_->stream, cudaStreamNonBlocking));
    NCCL_CHECK(ncclCommInitRank(&group_->comm, size_, id, rank_));
  }

  ~NcclCommunicator() override {
    // channels in the order connect() made them (an order every rank shares), then the group's
    for (auto& ch : order_) close_link(*ch);
    if (group_) close_link(*group_);
    MPI_Comm_free(&comm_);
  }

  int size() const override { return size_; }
  int rank() const override { return rank_; }

  std::unique_ptr<CommHandle> all_reduce(float* buf, size_t count, StreamContext* s) override {
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclFloat, ncclSum, group().comm, group().stream));  // buf(count)
    return end_collective(op);
  }

  std::unique_ptr<CommHandle> reduce_scatter(const float* src, float* dst, size_t count, StreamContext* s) override {
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    // src(size·count) → dst(count)
    NCCL_CHECK(ncclReduceScatter(src, dst, count, ncclFloat, ncclSum, group().comm, group().stream));
    return end_collective(op);
  }

  std::unique_ptr<CommHandle> all_reduce_bf16(uint16_t* buf, size_t count, StreamContext* s) override {
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    NCCL_CHECK(ncclAllReduce(buf, buf, count, ncclBfloat16, ncclSum, group().comm, group().stream));  // buf(count)
    return end_collective(op);
  }

  std::unique_ptr<CommHandle> reduce_scatter_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                                  StreamContext* s) override {
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    // src(size·count) → dst(count)
    NCCL_CHECK(ncclReduceScatter(src, dst, count, ncclBfloat16, ncclSum, group().comm, group().stream));
    return end_collective(op);
  }

  std::unique_ptr<CommHandle> all_gather(const float* src, float* dst, size_t count, StreamContext* s) override {
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    const float* send = src ? src : dst + size_t(rank_) * count;  // in place: NCCL's own convention
    NCCL_CHECK(ncclAllGather(send, dst, count, ncclFloat, group().comm, group().stream));  // dst(size·count)
    return end_collective(op);
  }

  std::unique_ptr<CommHandle> all_gather_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                              StreamContext* s) override {
    if (count == 0) return std::make_unique<DoneHandle>();
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    const uint16_t* send = src ? src : dst + size_t(rank_) * count;
    NCCL_CHECK(ncclAllGather(send, dst, count, ncclBfloat16, group().comm, group().stream));  // dst(size·count)
    return end_collective(op);
  }

  // Counts first (grouped send/recv of parts/size int32 per peer), read back to the host to size the rows,
  // then the rows as grouped send/recv. The calling stream thread waits for the counts.
  std::unique_ptr<CommHandle> all_to_all_rows(const void* src, void* dst, int parts, int width, StreamContext* s,
                                              int32_t* received) override {
    PIPER_CHECK(parts % size_ == 0, "all_to_all_rows: ", parts, " parts over ", size_, " ranks");
    std::lock_guard<std::mutex> lock(mu_);
    auto op = begin_collective(s);
    const int q = parts / size_;
    const auto* src_counts = static_cast<const int32_t*>(src);
    auto* dst_counts = static_cast<int32_t*>(dst);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      NCCL_CHECK(ncclSend(src_counts + size_t(r) * q, size_t(q), ncclInt32, r, group().comm, group().stream));
      NCCL_CHECK(ncclRecv(dst_counts + size_t(r) * q, size_t(q), ncclInt32, r, group().comm, group().stream));
    }
    NCCL_CHECK(ncclGroupEnd());
    std::vector<int32_t> sent(static_cast<size_t>(parts)), got(static_cast<size_t>(parts));
    CUDA_CHECK(cudaMemcpyAsync(sent.data(), src_counts, sizeof(int32_t) * size_t(parts), cudaMemcpyDeviceToHost,
                               group_->stream));
    CUDA_CHECK(cudaMemcpyAsync(got.data(), dst_counts, sizeof(int32_t) * size_t(parts), cudaMemcpyDeviceToHost,
                               group_->stream));
    CUDA_CHECK(cudaStreamSynchronize(group_->stream));
    if (received) std::copy(got.begin(), got.end(), received);
    const float* src_rows = RaggedRows(src, parts).rows;
    float* dst_rows = RaggedRows(dst, parts).rows;
    const RowsLayout l = rows_layout(sent.data(), got.data(), parts, size_, width);
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < size_; ++r) {
      const size_t s = size_t(r);
      if (l.send_counts[s])
        NCCL_CHECK(ncclSend(src_rows + l.send_displs[s], size_t(l.send_counts[s]), ncclUint32, r, group_->comm,
                            group_->stream));
      if (l.recv_counts[s])
        NCCL_CHECK(ncclRecv(dst_rows + l.recv_displs[s], size_t(l.recv_counts[s]), ncclUint32, r, group_->comm,
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

  // One two-rank NCCL channel per (peer, direction, stream), in the order given: the sender makes the id
  // and hands it over MPI, both ends create the channel (which blocks until both take part) and connect it
  // with a one-float transfer. A channel of one stream never queues behind another stream's transfers.
  void connect(const std::vector<PeerChannel>& channels) override {
    for (const PeerChannel& c : channels) {
      const int peer = local_peer(c.peer);
      auto key = std::make_tuple(peer, c.sending, c.stream);
      PIPER_CHECK(!channels_.count(key), "the NCCL channel ", c.sending ? "to" : "from", " rank ", c.peer, " (",
                  c.stream, ") is listed twice");
      auto ch = std::make_shared<Link>();
      ch->nranks = 2;
      ch->rank = c.sending ? 0 : 1;
      ch->name = cat(c.sending ? "to" : "from", " rank ", c.peer, " (", c.stream, ")");
      ncclUniqueId id{};
      if (c.sending) {
        NCCL_CHECK(ncclGetUniqueId(&id));
        MPI_CHECK(MPI_Send(&id, int(sizeof(id)), MPI_BYTE, peer, channel_tag(c.stream), comm_));
      } else {
        MPI_CHECK(MPI_Recv(&id, int(sizeof(id)), MPI_BYTE, peer, channel_tag(c.stream), comm_, MPI_STATUS_IGNORE));
      }
      CUDA_CHECK(cudaSetDevice(device_));
      CUDA_CHECK(cudaStreamCreateWithFlags(&ch->stream, cudaStreamNonBlocking));
      order_.push_back(ch);  // closed by the destructor even if what follows fails
      ncclResult_t res = ncclCommInitRank(&ch->comm, 2, id, ch->rank);
      if (res != ncclSuccess)
        throw SystemError(cat("setting up the NCCL channel ", ch->name, " failed: ", ncclGetErrorString(res), " (",
                              ncclGetLastError(nullptr), ")"));
      connect_channel(*ch);
      channels_[key] = ch;
    }
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

  std::shared_ptr<Op> new_op(StreamContext* s) {
    auto op = std::make_shared<Op>();
    op->pool = pool_;
    op->done = pool_->take();
    if (cudaStream_t st = caller_stream(s)) {
      op->ready = pool_->take();
      CUDA_CHECK(cudaEventRecord(op->ready, st));
    }
    return op;
  }

  Link& group() {
    PIPER_CHECK(group_, "collective on a communicator made for point-to-point transfers only");
    return *group_;
  }

  std::shared_ptr<Op> begin_collective(StreamContext* s) {
    Link& g = group();
    auto op = new_op(s);
    if (op->ready) CUDA_CHECK(cudaStreamWaitEvent(g.stream, op->ready, 0));
    return op;
  }

  std::unique_ptr<CommHandle> end_collective(const std::shared_ptr<Op>& op) {
    CUDA_CHECK(cudaEventRecord(op->done, group_->stream));
    group_->last = op;
    return std::make_unique<NcclHandle>(op, group_);
  }

  int local_peer(int peer_world_rank) const {
    PIPER_CHECK(peer_world_rank >= 0 && size_t(peer_world_rank) < to_local_.size(), "peer world rank ",
                peer_world_rank, " out of range");
    const int peer = to_local_[size_t(peer_world_rank)];
    PIPER_CHECK(peer != MPI_UNDEFINED, "world rank ", peer_world_rank, " is not in this communicator");
    PIPER_CHECK(peer != rank_, "point-to-point transfer of rank ", rank_, " with itself");
    return peer;
  }

  std::unique_ptr<CommHandle> post_transfer(bool sending, float* buf, size_t count, int peer_world_rank,
                                            StreamContext* s) {
    const int peer = local_peer(peer_world_rank);
    if (count == 0) return std::make_unique<DoneHandle>();
    const auto* cs = dynamic_cast<const CudaStream*>(s);
    const std::string stream = cs ? cs->name() : std::string();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = channels_.find(std::make_tuple(peer, sending, stream));
    PIPER_CHECK(it != channels_.end(), "no NCCL channel ", sending ? "to" : "from", " world rank ", peer_world_rank,
                " on stream '", stream, "': every channel is set up before the first step (connect)");
    Link& ch = *it->second;
    auto op = new_op(s);
    if (op->ready) CUDA_CHECK(cudaStreamWaitEvent(ch.stream, op->ready, 0));
    if (sending)
      NCCL_CHECK(ncclSend(buf, count, ncclFloat, 1 - ch.rank, ch.comm, ch.stream));
    else
      NCCL_CHECK(ncclRecv(buf, count, ncclFloat, 1 - ch.rank, ch.comm, ch.stream));
    CUDA_CHECK(cudaEventRecord(op->done, ch.stream));
    ch.last = op;
    return std::make_unique<NcclHandle>(op, it->second);
  }

  MPI_Comm comm_;
  int device_ = 0;
  int size_ = 1, rank_ = 0;
  std::vector<int> to_local_;
  std::shared_ptr<EventPool> pool_;
  std::shared_ptr<Link> group_;                                                      // collectives
  std::map<std::tuple<int, bool, std::string>, std::shared_ptr<Link>> channels_;  // (peer, sending, stream)
  std::vector<std::shared_ptr<Link>> order_;                                         // channels as connected
  std::mutex mu_;
};

}  // namespace

std::unique_ptr<Communicator> make_nccl_communicator(MPI_Comm comm, MPI_Comm world, int device, bool collectives) {
  return std::make_unique<NcclCommunicator>(comm, world, device, collectives);
}

}  // namespace piper

#endif  // PIPER_HAVE_CUDA

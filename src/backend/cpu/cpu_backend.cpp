// The CPU backend: 64-byte aligned host memory, synchronous streams (each executor thread runs its own
// work), OpenBLAS kernels, and MPI communicators with non-blocking collectives and point-to-point.
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "backend/mpi_bf16_sum.hpp"
#include "backend/mpi_ranks.hpp"
#include "backend/ragged_rows.hpp"
#include "util/error.hpp"
#include "util/mpi_check.hpp"


namespace piper {

namespace {

class MpiHandle final : public CommHandle {
 public:
  explicit MpiHandle(MPI_Request r) : req_(r) {}
  ~MpiHandle() override {
    if (req_ != MPI_REQUEST_NULL) MPI_Request_free(&req_);
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int flag = 0;
    MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
    return flag != 0;
  }

 private:
  MPI_Request req_;
};

// all_to_all_rows on MPI: the counts with MPI_Ialltoall, then (once they are in) the rows with MPI_Ialltoallv.
// Counts and rows travel on two communicators, each seeing its collectives in one order on every rank: the
// counts in the order the exchanges are posted, the rows in the same order because an exchange starts its
// rows only after every earlier exchange of the communicator has (`rows_started` counts them, `ticket` is
// its place).
class RowsExchange final : public CommHandle {
 public:
  RowsExchange(MPI_Comm comm, MPI_Comm rows_comm, int size, const void* src, void* dst, int parts, int width,
               int32_t* received, std::shared_ptr<int64_t> rows_started, int64_t ticket)
      : comm_(comm), rows_comm_(rows_comm), size_(size), q_(parts / size), width_(width), src_(static_cast<const int32_t*>(src)),
        dst_(static_cast<int32_t*>(dst)), received_(received), rows_started_(std::move(rows_started)), ticket_(ticket) {
    PIPER_CHECK(parts % size == 0, "all_to_all_rows: ", parts, " parts over ", size, " ranks");
    MPI_CHECK(MPI_Ialltoall(src_, q_, MPI_INT32_T, dst_, q_, MPI_INT32_T, comm_, &req_));
  }
  ~RowsExchange() override {
    if (req_ != MPI_REQUEST_NULL) MPI_Request_free(&req_);
  }
  bool test() override {
    if (req_ != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
      if (!flag) return false;
    }
    if (rows_posted_) return true;
    if (*rows_started_ != ticket_) return false;  // an earlier exchange has not started its rows yet
    post_rows();
    ++*rows_started_;
    return test();
  }

 private:
  void post_rows() {
    rows_posted_ = true;
    const int parts = q_ * size_;
    if (received_) std::memcpy(received_, dst_, sizeof(int32_t) * size_t(parts));
    const float* src_rows = RaggedRows(src_, parts).rows;
    float* dst_rows = RaggedRows(dst_, parts).rows;
    const RowsLayout l = rows_layout(src_, dst_, parts, size_, width_);
    PIPER_CHECK(mpi_counts(l.send_counts, send_counts_) && mpi_counts(l.send_displs, send_displs_) &&
                    mpi_counts(l.recv_counts, recv_counts_) && mpi_counts(l.recv_displs, recv_displs_),
                "all_to_all_rows: more than 2^31 words for one rank");
    MPI_CHECK(MPI_Ialltoallv(src_rows, send_counts_.data(), send_displs_.data(), MPI_UINT32_T, dst_rows,
                             recv_counts_.data(), recv_displs_.data(), MPI_UINT32_T, rows_comm_, &req_));
  }
  MPI_Comm comm_, rows_comm_;
  int size_, q_, width_;
  const int32_t* src_;
  int32_t* dst_;
  int32_t* received_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  bool rows_posted_ = false;
  std::shared_ptr<int64_t> rows_started_;
  int64_t ticket_;
  std::vector<int> send_counts_, recv_counts_, send_displs_, recv_displs_;
};

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, MPI_Comm world) : comm_(comm) {
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_rank(comm_, &rank_);
    to_local_ = world_to_comm_ranks(comm_, world);  // for point-to-point peers
    MPI_CHECK(MPI_Comm_dup(comm_, &rows_comm_));  // all_to_all_rows: the rows' own order
  }
  ~MpiCommunicator() override {
    MPI_Comm_free(&rows_comm_);
    MPI_Comm_free(&comm_);
  }
  int size() const override { return size_; }
  int rank() const override { return rank_; }

  std::unique_ptr<CommHandle> all_reduce(float* buf, size_t count, StreamContext*) override {
    MPI_Request r;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, int(count), MPI_FLOAT, MPI_SUM, comm_, &r));
    return std::make_unique<MpiHandle>(r);
  }
  std::unique_ptr<CommHandle> reduce_scatter(const float* src, float* dst, size_t count, StreamContext*) override {
    MPI_Request r;
    MPI_CHECK(MPI_Ireduce_scatter_block(src, dst, int(count), MPI_FLOAT, MPI_SUM, comm_, &r));
    return std::make_unique<MpiHandle>(r);
  }
  std::unique_ptr<CommHandle> all_reduce_bf16(uint16_t* buf, size_t count, StreamContext*) override {
    MPI_Request r;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, buf, int(count), MPI_UINT16_T, bf16_sum_op(), comm_, &r));
    return std::make_unique<MpiHandle>(r);
  }
  std::unique_ptr<CommHandle> reduce_scatter_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                                  StreamContext*) override {
    MPI_Request r;
    MPI_CHECK(MPI_Ireduce_scatter_block(src, dst, int(count), MPI_UINT16_T, bf16_sum_op(), comm_, &r));
    return std::make_unique<MpiHandle>(r);
  }
  std::unique_ptr<CommHandle> all_gather(const float* src, float* dst, size_t count, StreamContext*) override {
    MPI_Request r;
    MPI_CHECK(MPI_Iallgather(src ? static_cast<const void*>(src) : MPI_IN_PLACE, int(count), MPI_FLOAT, dst, int(count),
                             MPI_FLOAT, comm_, &r));
    return std::make_unique<MpiHandle>(r);
  }
  std::unique_ptr<CommHandle> all_gather_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                              StreamContext*) override {
    MPI_Request r;
    MPI_CHECK(MPI_Iallgather(src ? static_cast<const void*>(src) : MPI_IN_PLACE, int(count), MPI_UINT16_T, dst,
                             int(count), MPI_UINT16_T, comm_, &r));
    return std::make_unique<MpiHandle>(r);
  }
  std::unique_ptr<CommHandle> all_to_all_rows(const void* src, void* dst, int parts, int width, StreamContext*,
                                              int32_t* received) override {
    return std::make_unique<RowsExchange>(comm_, rows_comm_, size_, src, dst, parts, width, received, rows_started_,
                                          exchanges_++);
  }
  std::unique_ptr<CommHandle> send(const float* buf, size_t count, int peer, int tag, StreamContext*) override {
    MPI_Request r;
    MPI_CHECK(MPI_Isend(buf, int(count), MPI_FLOAT, local(peer), tag, comm_, &r));
    return std::make_unique<MpiHandle>(r);
  }
  std::unique_ptr<CommHandle> recv(float* buf, size_t count, int peer, int tag, StreamContext*) override {
    MPI_Request r;
    MPI_CHECK(MPI_Irecv(buf, int(count), MPI_FLOAT, local(peer), tag, comm_, &r));
    return std::make_unique<MpiHandle>(r);
  }

 private:
  int local(int world_rank) const {
    int l = to_local_[size_t(world_rank)];
    PIPER_CHECK(l != MPI_UNDEFINED, "world rank ", world_rank, " is not in this communicator");
    return l;
  }
  MPI_Comm comm_, rows_comm_ = MPI_COMM_NULL;
  int size_ = 1, rank_ = 0;
  std::vector<int> to_local_;
  std::shared_ptr<int64_t> rows_started_ = std::make_shared<int64_t>(0);  // all_to_all_rows, see RowsExchange
  int64_t exchanges_ = 0;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) : kernels_(threads) {}
  std::string name() const override { return "cpu"; }
  Kernels& kernels() override { return kernels_; }
  void* allocate(size_t bytes) override {
    size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded ? rounded : 64);
    if (!p) throw SystemError(cat("out of host memory allocating ", bytes, " bytes"));
    return p;
  }
  void release(void* p, size_t) override { std::free(p); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  std::unique_ptr<StreamContext> make_stream(const std::string&) override { return std::make_unique<StreamContext>(); }
  void bind(StreamContext*) override {}
  void record(StreamContext*, int) override {}
  void wait(StreamContext*, int) override {}
  void prepare_events(int) override {}
  void synchronize(StreamContext*) override {}
  std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, MPI_Comm world) override {
    return std::make_unique<MpiCommunicator>(comm, world);
  }

 private:
  CpuKernels kernels_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace piper

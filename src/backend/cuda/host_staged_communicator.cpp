// A communicator for ranks that share a GPU, where NCCL refuses to build one (it needs a device per rank):
// every operation copies device data to the host, runs MPI there and copies the result back.
// Slower than NCCL by the copies; it exists so that such jobs (tests, small runs) still work.
#ifdef PIPER_HAVE_CUDA
#include "backend/cuda/host_staged_communicator.hpp"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "backend/cuda/cuda_common.hpp"
#include "backend/device_identity.hpp"
#include "backend/mpi_bf16_sum.hpp"
#include "backend/mpi_ranks.hpp"
#include "backend/ragged_rows.hpp"
#include "util/error.hpp"
#include "util/mpi_check.hpp"

namespace piper {

namespace {

cudaStream_t caller_stream(StreamContext* s) {
  if (auto* cs = dynamic_cast<CudaStream*>(s)) return cs->stream();
  CudaStream* bound = bound_cuda_stream();
  return bound ? bound->stream() : nullptr;
}

void to_host(void* host, const void* device, size_t bytes, cudaStream_t st) {
  if (!bytes) return;
  CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
}

void to_device(void* device, const void* host, size_t bytes, cudaStream_t st) {
  if (!bytes) return;
  CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, st));
  CUDA_CHECK(cudaStreamSynchronize(st));
}

// An MPI request on host data; when it completes, `result` (host) is copied to `device`.
class StagedHandle final : public CommHandle {
 public:
  StagedHandle(MPI_Request r, std::vector<char> host, size_t result_at, size_t result_bytes, void* device,
               cudaStream_t st)
      : req_(r), host_(std::move(host)), at_(result_at), bytes_(result_bytes), device_(device), st_(st) {}
  ~StagedHandle() override {
    if (req_ != MPI_REQUEST_NULL) MPI_Request_free(&req_);
  }
  bool test() override {
    if (req_ != MPI_REQUEST_NULL) {
      int flag = 0;
      MPI_CHECK(MPI_Test(&req_, &flag, MPI_STATUS_IGNORE));
      if (!flag) return false;
      if (device_) to_device(device_, host_.data() + at_, bytes_, st_);
    }
    return true;
  }

 private:
  MPI_Request req_;
  std::vector<char> host_;
  size_t at_, bytes_;
  void* device_;
  cudaStream_t st_;
};

class DoneHandle final : public CommHandle {
 public:
  bool test() override { return true; }
};

class HostStagedCommunicator final : public Communicator {
 public:
  HostStagedCommunicator(MPI_Comm comm, MPI_Comm world) : comm_(comm) {
    MPI_CHECK(MPI_Comm_size(comm_, &size_));
    MPI_CHECK(MPI_Comm_rank(comm_, &rank_));
    to_local_ = world_to_comm_ranks(comm_, world);
  }
  ~HostStagedCommunicator() override { MPI_Comm_free(&comm_); }
  int size() const override { return size_; }
  int rank() const override { return rank_; }

  std::unique_ptr<CommHandle> all_reduce(float* buf, size_t count, StreamContext* s) override {
    return staged_all_reduce(buf, count * sizeof(float), int(count), MPI_FLOAT, MPI_SUM, s);
  }
  std::unique_ptr<CommHandle> all_reduce_bf16(uint16_t* buf, size_t count, StreamContext* s) override {
    return staged_all_reduce(buf, count * sizeof(uint16_t), int(count), MPI_UINT16_T, bf16_sum_op(), s);
  }

  // src(size·count) → dst(count)
  std::unique_ptr<CommHandle> reduce_scatter(const float* src, float* dst, size_t count, StreamContext* s) override {
    return staged_reduce_scatter(src, dst, count * sizeof(float), int(count), MPI_FLOAT, MPI_SUM, s);
  }
  std::unique_ptr<CommHandle> reduce_scatter_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                                  StreamContext* s) override {
    return staged_reduce_scatter(src, dst, count * sizeof(uint16_t), int(count), MPI_UINT16_T, bf16_sum_op(), s);
  }

  // src(count) (or in place at dst + rank·count) → dst(size·count)
  std::unique_ptr<CommHandle> all_gather(const float* src, float* dst, size_t count, StreamContext* s) override {
    return staged_all_gather(src ? src : dst + size_t(rank_) * count, dst, count * sizeof(float), int(count), MPI_FLOAT,
                             s);
  }
  std::unique_ptr<CommHandle> all_gather_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                              StreamContext* s) override {
    return staged_all_gather(src ? src : dst + size_t(rank_) * count, dst, count * sizeof(uint16_t), int(count),
                             MPI_UINT16_T, s);
  }

  // Counts first, then the rows, both blocking on this stream's thread (its communicator is its own).
  std::unique_ptr<CommHandle> all_to_all_rows(const void* src, void* dst, int parts, int width, StreamContext* s,
                                              int32_t* received) override {
    PIPER_CHECK(parts % size_ == 0, "all_to_all_rows: ", parts, " parts over ", size_, " ranks");
    cudaStream_t st = caller_stream(s);
    const int q = parts / size_;
    std::vector<int32_t> sent(static_cast<size_t>(parts)), got(static_cast<size_t>(parts));
    to_host(sent.data(), src, sent.size() * sizeof(int32_t), st);
    MPI_CHECK(MPI_Alltoall(sent.data(), q, MPI_INT32_T, got.data(), q, MPI_INT32_T, comm_));
    if (received) std::copy(got.begin(), got.end(), received);
    const RowsLayout l = rows_layout(sent.data(), got.data(), parts, size_, width);
    std::vector<int> send_counts, send_displs, recv_counts, recv_displs;
    PIPER_CHECK(mpi_counts(l.send_counts, send_counts) && mpi_counts(l.send_displs, send_displs) &&
                    mpi_counts(l.recv_counts, recv_counts) && mpi_counts(l.recv_displs, recv_displs),
                "all_to_all_rows: more than 2^31 words for one rank");
    const size_t send_total = size_t(l.send_total()), recv_total = size_t(l.recv_total());  // 4-byte words
    std::vector<uint32_t> rows_in(send_total), rows_out(recv_total);
    to_host(rows_in.data(), RaggedRows(src, parts).rows, send_total * sizeof(uint32_t), st);
    MPI_CHECK(MPI_Alltoallv(rows_in.data(), send_counts.data(), send_displs.data(), MPI_UINT32_T, rows_out.data(),
                            recv_counts.data(), recv_displs.data(), MPI_UINT32_T, comm_));
    to_device(dst, got.data(), got.size() * sizeof(int32_t), st);
    to_device(RaggedRows(dst, parts).rows, rows_out.data(), recv_total * sizeof(uint32_t), st);
    return std::make_unique<DoneHandle>();
  }

  std::unique_ptr<CommHandle> send(const float* buf, size_t count, int peer, int tag, StreamContext* s) override {
    cudaStream_t st = caller_stream(s);
    std::vector<char> host(count * sizeof(float));
    to_host(host.data(), buf, host.size(), st);
    MPI_Request r;
    MPI_CHECK(MPI_Isend(host.data(), int(count), MPI_FLOAT, local(peer), tag, comm_, &r));
    return std::make_unique<StagedHandle>(r, std::move(host), 0, 0, nullptr, st);
  }

  std::unique_ptr<CommHandle> recv(float* buf, size_t count, int peer, int tag, StreamContext* s) override {
    cudaStream_t st = caller_stream(s);
    std::vector<char> host(count * sizeof(float));
    MPI_Request r;
    MPI_CHECK(MPI_Irecv(host.data(), int(count), MPI_FLOAT, local(peer), tag, comm_, &r));
    return std::make_unique<StagedHandle>(r, std::move(host), 0, count * sizeof(float), buf, st);
  }

 private:
  // buf(bytes: count elements of `type`) summed in place by `op` through host memory
  std::unique_ptr<CommHandle> staged_all_reduce(void* buf, size_t bytes, int count, MPI_Datatype type, MPI_Op op,
                                                StreamContext* s) {
    cudaStream_t st = caller_stream(s);
    std::vector<char> host(bytes);
    to_host(host.data(), buf, host.size(), st);
    MPI_Request r;
    MPI_CHECK(MPI_Iallreduce(MPI_IN_PLACE, host.data(), count, type, op, comm_, &r));
    return std::make_unique<StagedHandle>(r, std::move(host), 0, bytes, buf, st);
  }
  // src(size·bytes) → dst(bytes: count elements of `type`), summed by `op` through host memory
  std::unique_ptr<CommHandle> staged_reduce_scatter(const void* src, void* dst, size_t bytes, int count,
                                                    MPI_Datatype type, MPI_Op op, StreamContext* s) {
    cudaStream_t st = caller_stream(s);
    const size_t in = size_t(size_) * bytes;
    std::vector<char> host(in + bytes);
    to_host(host.data(), src, in, st);
    MPI_Request r;
    MPI_CHECK(MPI_Ireduce_scatter_block(host.data(), host.data() + in, count, type, op, comm_, &r));
    return std::make_unique<StagedHandle>(r, std::move(host), in, bytes, dst, st);
  }

  // this rank's `one` bytes at `mine` (count elements of `type`) → dst(size·one), through host memory
  std::unique_ptr<CommHandle> staged_all_gather(const void* mine, void* dst, size_t one, int count, MPI_Datatype type,
                                                StreamContext* s) {
    cudaStream_t st = caller_stream(s);
    const size_t all = size_t(size_) * one;
    std::vector<char> host(all);
    to_host(host.data() + size_t(rank_) * one, mine, one, st);
    MPI_Request r;
    MPI_CHECK(MPI_Iallgather(MPI_IN_PLACE, count, type, host.data(), count, type, comm_, &r));
    return std::make_unique<StagedHandle>(r, std::move(host), 0, all, dst, st);
  }

  int local(int world_rank) const {
    int l = to_local_[size_t(world_rank)];
    PIPER_CHECK(l != MPI_UNDEFINED, "world rank ", world_rank, " is not in this communicator");
    return l;
  }
  MPI_Comm comm_;
  int size_ = 1, rank_ = 0;
  std::vector<int> to_local_;
};

}  // namespace

std::string gpu_uuid(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess) {
    // as nvidia-smi -L prints it: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
    std::string out = "GPU-";
    char hex[3];
    for (int i = 0; i < 16; ++i) {
      if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
      std::snprintf(hex, sizeof(hex), "%02x", unsigned(static_cast<unsigned char>(prop.uuid.bytes[i])));
      out += hex;
    }
    return out;
  }
  (void)cudaGetLastError();
  char bus[32] = {0};
  if (cudaDeviceGetPCIBusId(bus, int(sizeof(bus)), device) == cudaSuccess) return std::string("pci-") + bus;
  (void)cudaGetLastError();
  return "ordinal-" + std::to_string(device);
}

bool members_share_a_gpu(MPI_Comm comm, int device) {
  char name[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_CHECK(MPI_Get_processor_name(name, &len));
  return members_share_a_device(comm, device_identity(std::string(name, size_t(len)), gpu_uuid(device)));
}

std::unique_ptr<Communicator> make_host_staged_communicator(MPI_Comm comm, MPI_Comm world) {
  return std::make_unique<HostStagedCommunicator>(comm, world);
}

}  // namespace piper
#endif  // PIPER_HAVE_CUDA

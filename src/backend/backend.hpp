// The backend interface: device memory, compute kernels, streams and communicators. The executor drives
// any backend through this; CPU (OpenBLAS + MPI) and CUDA (cuBLAS + NCCL) implement it.
#pragma once
#include <mpi.h>

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "backend/kernels.hpp"

namespace piper {

// An operation that was posted and completes later. test() makes progress and says whether it is done.
class CommHandle {
 public:
  virtual ~CommHandle() = default;
  virtual bool test() = 0;
};

// Where a stream's work is issued. On CPU the calling thread; on CUDA a cudaStream_t.
class StreamContext {
 public:
  virtual ~StreamContext() = default;
};

// A point-to-point channel of one rank: its transfers to (sending) or from `peer` (a world rank) on one
// executor stream. Transfers of one channel complete in posting order.
struct PeerChannel {
  int peer = -1;
  bool sending = false;
  std::string stream;
  bool operator==(const PeerChannel& o) const {  // C++17: the .cu files include this header
    return peer == o.peer && sending == o.sending && stream == o.stream;
  }
};

// Collectives and point-to-point transfers of one group (fp32, sum). Every call is non-blocking. Ragged rows
// (backend/ragged_rows.hpp) are exchanged counts first.
class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual int rank() const = 0;
  // buf(count) = Σ over the group, in place.
  virtual std::unique_ptr<CommHandle> all_reduce(float* buf, size_t count, StreamContext* s) = 0;
  // dst(count) = Σ over the group of src[rank·count, (rank+1)·count); src holds size()·count.
  virtual std::unique_ptr<CommHandle> reduce_scatter(const float* src, float* dst, size_t count, StreamContext* s) = 0;
  // The same two reductions on bf16 values (util/precision.hpp): half the bytes on the wire; each addition in
  // fp32, its sum rounded to bf16.
  virtual std::unique_ptr<CommHandle> all_reduce_bf16(uint16_t* buf, size_t count, StreamContext* s) = 0;
  virtual std::unique_ptr<CommHandle> reduce_scatter_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                                          StreamContext* s) = 0;
  // dst(size()·count) = concatenation of every rank's src(count). src == nullptr: in place, each rank's
  // contribution already at dst + rank·count.
  virtual std::unique_ptr<CommHandle> all_gather(const float* src, float* dst, size_t count, StreamContext* s) = 0;
  // The same on bf16 values.
  virtual std::unique_ptr<CommHandle> all_gather_bf16(const uint16_t* src, uint16_t* dst, size_t count,
                                                      StreamContext* s) = 0;
  // Counted rows, exchanged: src and dst start with `parts` int32 counts, then the rows (width 4-byte words each)
  // of part 0, part 1, ... Part p of src goes to group rank p / (parts / size()). dst receives, from each
  // group rank in order, its parts / size() counts meant for this rank, then the rows in the same order.
  // Counts travel first; dst must hold the largest possible result. `received` (host memory, parts int32, may
  // be null) gets dst's counts once the handle completes: the host learns them from the exchange itself.
  virtual std::unique_ptr<CommHandle> all_to_all_rows(const void* src, void* dst, int parts, int width,
                                                      StreamContext* s, int32_t* received) = 0;
  // Point-to-point with a peer given as a world rank.
  virtual std::unique_ptr<CommHandle> send(const float* buf, size_t count, int peer_world_rank, int tag,
                                           StreamContext* s) = 0;
  virtual std::unique_ptr<CommHandle> recv(float* buf, size_t count, int peer_world_rank, int tag,
                                           StreamContext* s) = 0;
  // Sets up, before any transfer, every point-to-point channel this rank will use, in the order given
  // (blocking; each channel with its peer). Every rank's order must agree with its peers' orders
  // (runtime/communicator_order.hpp): where setting up a channel blocks until the peer takes part (NCCL),
  // channels created in disagreeing orders deadlock. They are torn down in the same order.
  virtual void connect(const std::vector<PeerChannel>& channels) {}
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual Kernels& kernels() = 0;
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p, size_t bytes) = 0;
  // Zeroes device memory: ordered after the calling thread's bound stream's earlier work where one is
  // bound (and possibly still running on return), complete on return otherwise.
  virtual void zero(void* p, size_t bytes) = 0;
  // A stream for one executor thread; bind() makes it current on the calling thread.
  virtual std::unique_ptr<StreamContext> make_stream(const std::string& name) = 0;
  virtual void bind(StreamContext* s) = 0;
  // Device-side ordering between streams (no-ops where work is synchronous): record(s, e) marks the work
  // issued to `s` so far as event e (0 <= e < prepare_events' count, created once); wait(s, e) makes work
  // issued to `s` from now on start after that mark. The host does not block in either.
  virtual void record(StreamContext* s, int event) = 0;
  virtual void wait(StreamContext* s, int event) = 0;
  virtual void prepare_events(int count) = 0;
  // Blocks the host until the work issued to `s` (nullptr: the calling thread's stream) is complete.
  virtual void synchronize(StreamContext* s) = 0;
  // Communicator over the members of `comm` (created collectively by them). Point-to-point peers
  // are world ranks; `world` translates.
  virtual std::unique_ptr<Communicator> make_communicator(MPI_Comm comm, MPI_Comm world) = 0;
  // A communicator used only for point-to-point transfers (its collectives need not work).
  virtual std::unique_ptr<Communicator> make_point_to_point(MPI_Comm comm, MPI_Comm world) {
    return make_communicator(comm, world);
  }
};

// Creates the backend named in the plan ("cpu" or "cuda") with `threads` compute threads per rank.
std::unique_ptr<Backend> make_backend(const std::string& name, int threads, int local_rank);

// The CUDA backend's constructor, which it registers itself (at load) where it is built.
using CudaBackendFactory = std::unique_ptr<Backend> (*)(int local_rank);
void register_cuda_backend(CudaBackendFactory make);

}  // namespace piper

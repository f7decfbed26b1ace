// A broadcast that ranks may wait on for long (while rank 0 reads and verifies a file): the waiting ranks
// test it once a millisecond and sleep in between, instead of spinning on a core the root needs.
#pragma once
#include <mpi.h>

#include <chrono>
#include <thread>

#include "util/mpi_check.hpp"

namespace piper {

inline void broadcast_after_long_wait(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  MPI_Request req;
  MPI_CHECK(MPI_Ibcast(buf, count, type, root, comm, &req));
  for (int done = 0;;) {
    MPI_CHECK(MPI_Test(&req, &done, MPI_STATUS_IGNORE));
    if (done) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

}  // namespace piper

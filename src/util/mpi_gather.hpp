// Gathering variable-length data on rank 0: every rank contributes a vector, rank 0 receives each rank's
// part (empty on the other ranks). Used by reports, traces and checkpoints.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "util/mpi_check.hpp"

namespace piper {

template <typename T>
struct Gathered {
  std::vector<T> data;       // every rank's part, rank order (rank 0 only)
  std::vector<int> offsets;  // where rank r's part starts (rank 0 only)
  std::vector<int> counts;   // how many elements rank r sent (rank 0 only)
  // Rank r's part as [begin, end).
  const T* begin(int r) const { return data.data() + offsets[size_t(r)]; }
  const T* end(int r) const { return begin(r) + counts[size_t(r)]; }
};

template <typename T>
MPI_Datatype mpi_type();
template <>
inline MPI_Datatype mpi_type<char>() { return MPI_CHAR; }
template <>
inline MPI_Datatype mpi_type<double>() { return MPI_DOUBLE; }
template <>
inline MPI_Datatype mpi_type<int64_t>() { return MPI_INT64_T; }
template <>
inline MPI_Datatype mpi_type<uint64_t>() { return MPI_UINT64_T; }

// Collective over `comm`.
template <typename T>
Gathered<T> gather_to_root(const std::vector<T>& mine, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  Gathered<T> g;
  int n = int(mine.size());
  if (rank == 0) {
    g.counts.resize(size_t(size));
    g.offsets.resize(size_t(size));
  }
  MPI_CHECK(MPI_Gather(&n, 1, MPI_INT, g.counts.data(), 1, MPI_INT, 0, comm));
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < size; ++r) {
      g.offsets[size_t(r)] = total;
      total += g.counts[size_t(r)];
    }
    g.data.resize(size_t(total));
  }
  MPI_CHECK(MPI_Gatherv(mine.data(), n, mpi_type<T>(), g.data.data(), g.counts.data(), g.offsets.data(), mpi_type<T>(),
                        0, comm));
  return g;
}

}  // namespace piper

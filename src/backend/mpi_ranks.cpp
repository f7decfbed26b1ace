// World rank → communicator rank (see mpi_ranks.hpp).
#include "backend/mpi_ranks.hpp"

#include "util/mpi_check.hpp"

namespace piper {

std::vector<int> world_to_comm_ranks(MPI_Comm comm, MPI_Comm world) {
  MPI_Group g, wg;
  MPI_CHECK(MPI_Comm_group(comm, &g));
  MPI_CHECK(MPI_Comm_group(world, &wg));
  int wsize = 0;
  MPI_CHECK(MPI_Comm_size(world, &wsize));
  std::vector<int> wr(static_cast<size_t>(wsize)), local(static_cast<size_t>(wsize), MPI_UNDEFINED);
  for (int i = 0; i < wsize; ++i) wr[size_t(i)] = i;
  MPI_CHECK(MPI_Group_translate_ranks(wg, wsize, wr.data(), g, local.data()));
  MPI_Group_free(&g);
  MPI_Group_free(&wg);
  return local;
}

}  // namespace piper

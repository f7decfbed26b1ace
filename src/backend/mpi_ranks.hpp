// World rank → rank in a communicator, the translation every backend's communicator needs for
// point-to-point peers (which plans name by world rank).
#pragma once
#include <mpi.h>

#include <vector>

namespace piper {

// For every world rank, its rank in `comm`, or MPI_UNDEFINED when it is not a member.
std::vector<int> world_to_comm_ranks(MPI_Comm comm, MPI_Comm world);

}  // namespace piper

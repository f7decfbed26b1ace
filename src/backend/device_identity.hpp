// Whether members of a communicator share one device, decided by what identifies the device itself (a
// host name with a GPU's UUID), not by its ordinal: with one visible GPU per rank every rank sees "device 0".
#pragma once
#include <mpi.h>

#include <string>
#include <vector>

namespace piper {

// "host#uuid": what names one device of the job.
std::string device_identity(const std::string& host, const std::string& device_uuid);
// Whether any identity appears twice.
bool identities_repeat(const std::vector<std::string>& identities);
// Every member's identity, gathered over `comm` (collective).
std::vector<std::string> gather_identities(MPI_Comm comm, const std::string& identity);
// Whether two members of `comm` reported the same identity (collective).
bool members_share_a_device(MPI_Comm comm, const std::string& identity);

}  // namespace piper

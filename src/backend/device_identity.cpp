// Device identities gathered over a communicator (see device_identity.hpp): variable-length strings,
// lengths first, then the characters.
#include "backend/device_identity.hpp"

#include <algorithm>

#include "util/mpi_check.hpp"

namespace piper {

std::string device_identity(const std::string& host, const std::string& device_uuid) {
  return host + "#" + device_uuid;
}

bool identities_repeat(const std::vector<std::string>& identities) {
  std::vector<std::string> sorted = identities;
  std::sort(sorted.begin(), sorted.end());
  return std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end();
}

std::vector<std::string> gather_identities(MPI_Comm comm, const std::string& identity) {
  int size = 1;
  MPI_CHECK(MPI_Comm_size(comm, &size));
  const int mine = int(identity.size());
  std::vector<int> lengths(size_t(size), 0), displs(size_t(size), 0);
  MPI_CHECK(MPI_Allgather(&mine, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm));
  int total = 0;
  for (int r = 0; r < size; ++r) {
    displs[size_t(r)] = total;
    total += lengths[size_t(r)];
  }
  std::string all(size_t(std::max(total, 1)), '\0');
  MPI_CHECK(MPI_Allgatherv(identity.data(), mine, MPI_CHAR, all.data(), lengths.data(), displs.data(), MPI_CHAR,
                           comm));
  std::vector<std::string> out;
  for (int r = 0; r < size; ++r) out.push_back(all.substr(size_t(displs[size_t(r)]), size_t(lengths[size_t(r)])));
  return out;
}

bool members_share_a_device(MPI_Comm comm, const std::string& identity) {
  return identities_repeat(gather_identities(comm, identity));
}

}  // namespace piper

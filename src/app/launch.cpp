// Rank 0 compiles, every rank receives its plan (see launch.hpp).
#include "app/launch.hpp"

#include <cstdio>
#include <iostream>

#include "compile/compile.hpp"
#include "config/load.hpp"
#include "data/data.hpp"
#include "passes/passes.hpp"
#include "util/error.hpp"
#include "util/mpi_check.hpp"

namespace piper {

void print_error(const std::string& what) {
  std::fprintf(stderr, "piper: error: %s\n", what.c_str());
  std::fflush(stderr);
}

JobSpec load_and_check(const CliOptions& opts, int world) {
  JobSpec spec = load_job(opts.config, opts.overrides);
  expand_mesh(spec, world);
  if (spec.model.kind == "gpt") {
    DataConfig d;
    d.kind = DataConfig::Kind::Tokens;
    d.path = spec.data.path;
    d.vocab = spec.model.vocab;
    d.seq_len = spec.model.seq_len;
    d.batch = spec.data.batch;
    validate_data(d);
  }
  return spec;
}

Plan launch(const CliOptions& opts, MPI_Comm world) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  int status = 0;
  std::vector<std::vector<uint8_t>> bodies;  // rank 0: one serialized body per device set
  std::vector<int> set_of(static_cast<size_t>(size), -1);
  std::vector<int> leader;                   // first rank of each set
  if (rank == 0) {
    try {
      JobSpec spec = load_and_check(opts, size);
      CompileResult result;
      compile_job(spec, size, result);
      set_of = rank_sets(result.graph);
      for (const auto& b : result.bodies) {
        bodies.push_back(serialize_plan(b));
        leader.push_back(b.sets[size_t(b.set)][0]);
      }
    } catch (const UserError& e) {
      print_error(e.what());
      status = 2;
    } catch (const std::exception& e) {
      print_error(e.what());
      status = 1;
    }
  }
  MPI_CHECK(MPI_Bcast(&status, 1, MPI_INT, 0, world));
  if (status != 0) throw ExitRequest{status};
  // Every rank learns its device set; rank 0 sends each set's body once, to the set's first rank, which
  // broadcasts it inside the set. Replicas share the body and differ only in the binding.
  MPI_CHECK(MPI_Bcast(set_of.data(), size, MPI_INT, 0, world));
  MPI_Comm set_comm;
  MPI_CHECK(MPI_Comm_split(world, set_of[size_t(rank)], rank, &set_comm));
  int set_rank = 0;
  MPI_Comm_rank(set_comm, &set_rank);
  std::vector<uint8_t> bytes;
  constexpr int kTag = 7001;
  if (rank == 0) {
    for (size_t s = 0; s < bodies.size(); ++s) {
      if (leader[s] == 0) continue;
      uint64_t n = bodies[s].size();
      MPI_CHECK(MPI_Send(&n, 1, MPI_UINT64_T, leader[s], kTag, world));
      MPI_CHECK(MPI_Send(bodies[s].data(), int(n), MPI_BYTE, leader[s], kTag, world));
    }
    bytes = std::move(bodies[size_t(set_of[0])]);
  } else if (set_rank == 0) {
    uint64_t n = 0;
    MPI_CHECK(MPI_Recv(&n, 1, MPI_UINT64_T, 0, kTag, world, MPI_STATUS_IGNORE));
    bytes.resize(n);
    MPI_CHECK(MPI_Recv(bytes.data(), int(n), MPI_BYTE, 0, kTag, world, MPI_STATUS_IGNORE));
  }
  uint64_t n = bytes.size();
  MPI_CHECK(MPI_Bcast(&n, 1, MPI_UINT64_T, 0, set_comm));
  bytes.resize(n);
  MPI_CHECK(MPI_Bcast(bytes.data(), int(n), MPI_BYTE, 0, set_comm));
  MPI_Comm_free(&set_comm);
  Plan body = deserialize_plan(bytes.data(), bytes.size());
  return bind_plan(body, rank);
}

}  // namespace piper

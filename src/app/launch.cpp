// Rank 0 compiles, every rank receives its plan (see launch.hpp).
#include "app/launch.hpp"

#include <cstdio>
#include <cstring>
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
  std::vector<uint8_t> sendbuf;
  std::vector<int> counts(static_cast<size_t>(size), 0), displs(static_cast<size_t>(size), 0);
  if (rank == 0) {
    try {
      JobSpec spec = load_and_check(opts, size);
      CompileResult result;
      compile_job(spec, size, result);
      auto sets_of = rank_sets(result.graph);
      std::vector<std::vector<uint8_t>> bodies;
      for (const auto& b : result.bodies) bodies.push_back(serialize_plan(b));
      for (int r = 0; r < size; ++r) {
        const Plan& body = result.bodies[size_t(sets_of[size_t(r)])];
        std::vector<uint8_t> bytes = bodies[size_t(sets_of[size_t(r)])];
        // the binding (rank, replica) is the last 8 bytes of the serialized form
        Plan bound = bind_plan(body, r);
        int32_t tail[2] = {bound.rank, bound.replica};
        std::memcpy(bytes.data() + bytes.size() - sizeof(tail), tail, sizeof(tail));
        displs[size_t(r)] = int(sendbuf.size());
        counts[size_t(r)] = int(bytes.size());
        sendbuf.insert(sendbuf.end(), bytes.begin(), bytes.end());
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
  int mine = 0;
  MPI_CHECK(MPI_Scatter(counts.data(), 1, MPI_INT, &mine, 1, MPI_INT, 0, world));
  std::vector<uint8_t> bytes(static_cast<size_t>(mine));
  MPI_CHECK(MPI_Scatterv(sendbuf.data(), counts.data(), displs.data(), MPI_BYTE, bytes.data(), mine, MPI_BYTE, 0, world));
  return deserialize_plan(bytes.data(), bytes.size());
}

}  // namespace piper

// Rank 0 compiles, every rank receives its plan (see launch.hpp).
#include "app/launch.hpp"

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <iostream>

#include "ckpt/folder.hpp"
#include "compile/compile.hpp"
#include "config/load.hpp"
#include "data/data.hpp"
#include "model/family.hpp"
#include "passes/passes.hpp"
#include "util/error.hpp"
#include "util/mpi_check.hpp"

namespace piper {

void print_error(const std::string& what) {
  std::fprintf(stderr, "piper: error: %s\n", what.c_str());
  std::fflush(stderr);
}

namespace {

// Can `path` (a directory, or a file's folder) be created or written? Checked without writing anything:
// the nearest existing ancestor must be a writable directory.
std::string unwritable_reason(const std::filesystem::path& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path p = fs::absolute(dir, ec);
  while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
  if (p.empty()) return "no existing parent folder";
  if (!fs::is_directory(p, ec)) return cat("'", p.string(), "' is not a folder");
  if (access(p.c_str(), W_OK) != 0) return cat("'", p.string(), "' is not writable");
  return "";
}

}  // namespace

JobSpec load_and_check(const CliOptions& opts, int world) {
  JobSpec spec = load_job(opts.config, opts.overrides);
  if (opts.steps > spec.job.steps)
    throw UserError(cat("--steps ", opts.steps, " is past job.steps = ", spec.job.steps, " (", spec.path,
                        "): the learning-rate schedule is defined up to job.steps; raise job.steps (e.g. --set job.steps=",
                        opts.steps, ") to train further"));
  expand_mesh(spec, world);
  if (find_family(spec.model.kind)->reads_tokens) {
    DataConfig d;
    d.kind = DataConfig::Kind::Tokens;
    d.path = spec.data.path;
    d.token_bytes = spec.data.token_bytes;
    d.vocab = spec.model.vocab;
    d.seq_len = spec.model.seq_len;
    d.batch = spec.data.batch;
    validate_data(d);
    if (!spec.eval.path.empty()) {  // the validation file: the same checks, named as eval.path
      d.path = spec.eval.path;
      d.token_bytes = 0;
      try {
        validate_data(d);
      } catch (const UserError& e) {
        throw UserError(cat("[eval] ", e.what()));
      }
    }
  }
  if (!spec.checkpoint.dir.empty()) {
    std::string why = unwritable_reason(spec.checkpoint.dir);
    if (!why.empty())
      throw UserError(cat(spec.path, ": checkpoint.dir = \"", spec.checkpoint.dir, "\" cannot be written: ", why));
  }
  if (!opts.metrics.empty()) {
    std::string why = unwritable_reason(std::filesystem::path(opts.metrics).parent_path().empty()
                                            ? std::filesystem::path(".")
                                            : std::filesystem::path(opts.metrics).parent_path());
    if (!why.empty()) throw UserError(cat("--metrics ", opts.metrics, ": cannot be written: ", why));
  }
  if (!opts.trace.empty()) {
    std::filesystem::path parent = std::filesystem::path(opts.trace).parent_path();
    std::string why = unwritable_reason(parent.empty() ? std::filesystem::path(".") : parent);
    if (!why.empty()) throw UserError(cat("--trace ", opts.trace, ": cannot be written: ", why));
  }
  if (!opts.report_json.empty()) {
    std::filesystem::path parent = std::filesystem::path(opts.report_json).parent_path();
    std::string why = unwritable_reason(parent.empty() ? std::filesystem::path(".") : parent);
    if (!why.empty()) throw UserError(cat("--report-json ", opts.report_json, ": cannot be written: ", why));
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
      // The job is valid: make its checkpoint folder now, so an unusable one stops it before training.
      if (!spec.checkpoint.dir.empty()) {
        std::error_code ec;
        std::filesystem::create_directories(spec.checkpoint.dir, ec);
        if (ec || !std::filesystem::is_directory(spec.checkpoint.dir))
          throw UserError(cat(spec.path, ": checkpoint.dir = \"", spec.checkpoint.dir, "\" cannot be created: ",
                              ec ? ec.message() : std::string("not a folder")));
        // One job per folder, for the whole run; only its holder clears what an interrupted save left.
        lock_checkpoint_folder(spec.checkpoint.dir, spec.job.name);
        for (const std::string& f : remove_stale_temp_files(spec.checkpoint.dir))
          std::printf("checkpoint: removed %s, left by an interrupted save\n", f.c_str());
      }
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

// piper: one SPMD executable. Parses the command line, lets rank 0 compile the job into per-rank plans,
// scatters them, and runs the training loop on every rank. Bad input exits 2 on every rank; any other
// failure on any rank ends the whole job.
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "app/cli.hpp"
#include "app/dry_run.hpp"
#include "app/launch.hpp"
#include "app/sample.hpp"
#include "app/stop_signals.hpp"
#include "app/train.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"

namespace {

// Was this process started by mpirun, srun or another MPI launcher (which then expects MPI_Init)?
bool started_by_launcher() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "SLURM_PROCID",
                          "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE"})
    if (std::getenv(var)) return true;
  return false;
}

// The exit code of `work` run on a process without MPI: its own, 2 for bad input, 1 for any other failure.
template <class Work>
int without_mpi(Work work) {
  using namespace piper;
  try {
    return work();
  } catch (const UserError& e) {
    print_error(e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "piper: error: %s\n", e.what());
    return 1;
  }
}

// A dry run, --help, --version or a bad command line on a process no launcher started: no MPI at all. Its
// start-up takes longer than compiling a 4,096-rank job, and a login node may not allow it.
int run_without_mpi(const piper::CliOptions& opts, const std::string& cli_error) {
  using namespace piper;
  return without_mpi([&] {
    if (!cli_error.empty()) throw UserError(cli_error);
    if (opts.help || opts.version) {
      std::printf("%s\n", opts.help ? opts.help_text.c_str() : piper_version());
      return 0;
    }
    return dry_run(opts, 1);
  });
}

// `piper sample ...`: one process on its own, no MPI (app/sample.hpp).
int run_sample(int argc, char** argv) {
  return without_mpi([&] { return piper::sample_command(std::vector<std::string>(argv + 2, argv + argc)); });
}

}  // namespace

int main(int argc, char** argv) {
  using namespace piper;
  if (argc >= 2 && std::string(argv[1]) == "sample") return run_sample(argc, argv);
  bool trains = false;
  {
    CliOptions opts;
    std::string cli_error;
    try {
      opts = parse_cli(argc, argv);
    } catch (const UserError& e) {
      cli_error = e.what();
    }
    trains = cli_error.empty() && !opts.help && !opts.version && !opts.dry_run;
    if (!trains && !started_by_launcher()) return run_without_mpi(opts, cli_error);
    // From the start of a training run: a stop during start-up or a resume ends it with exit code 4.
    if (trains) install_stop_signals(-1);
  }
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (trains) install_stop_signals(rank);  // again, over anything the MPI library installed
  int code = 0;
  try {
    if (provided < MPI_THREAD_MULTIPLE) throw SystemError("the MPI library does not provide MPI_THREAD_MULTIPLE");
    CliOptions opts = parse_cli(argc, argv);
    if (opts.help || opts.version) {
      if (rank == 0) std::printf("%s\n", opts.help ? opts.help_text.c_str() : piper_version());
    } else if (opts.dry_run) {
      if (rank == 0) code = dry_run(opts, size);
    } else {
      Plan plan = launch(opts, MPI_COMM_WORLD);
      code = train(plan, opts, MPI_COMM_WORLD);
    }
  } catch (const ExitRequest& e) {
    code = e.code;
  } catch (const RankUserError& e) {
    // Bad input only this rank saw (a data file that changed under the run): end every rank with code 2.
    std::fprintf(stderr, "piper: rank %d: error: %s\n", rank, e.what());
    std::fflush(stderr);
    if (size > 1) MPI_Abort(MPI_COMM_WORLD, kExitBadInput);
    code = kExitBadInput;
  } catch (const UserError& e) {
    // Errors every rank sees alike (command line, dry run on rank 0): print once.
    if (rank == 0) print_error(e.what());
    code = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "piper: rank %d: error: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  if (trains) restore_default_stop_signals();  // a failed job's ranks must go when the launcher ends them
  MPI_Finalize();
  return code;
}

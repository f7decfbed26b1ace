// piper: one SPMD executable. Parses the command line, lets rank 0 compile the job into per-rank plans,
// scatters them, and runs the training loop on every rank. Bad input exits 2 on every rank; any other
// failure on any rank ends the whole job.
#include <mpi.h>

#include <cstdio>

#include "app/cli.hpp"
#include "app/dry_run.hpp"
#include "app/launch.hpp"
#include "app/train.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"

int main(int argc, char** argv) {
  using namespace piper;
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
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
  MPI_Finalize();
  return code;
}

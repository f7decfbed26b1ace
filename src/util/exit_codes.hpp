// Piper's exit codes, one table for every rank and every path out of the program (README "Exit codes").
// Scripts (sbatch templates, schedulers) act on them: 4 means "checkpoint written, resume with --resume auto".
#pragma once

namespace piper {

enum ExitCode : int {
  kExitOk = 0,          // the run finished
  kExitFailure = 1,     // a failure of the system or a library (I/O, MPI, CUDA), or replicas that diverged
  kExitBadInput = 2,    // bad input: command line, job file, data file, checkpoint, checkpoint folder in use
  kExitNonFinite = 3,   // the loss or the gradient norm was not finite: no update was applied, nothing written;
                        // or a tensor to checkpoint was not finite: that checkpoint was not written
  kExitStopped = 4,     // stopped by SIGTERM/SIGINT/SIGUSR1 after writing a checkpoint: resume with --resume auto
  kExitHung = 5,        // the watchdog saw a rank make no progress for job.watchdog_s seconds and ended the job
  // a second signal while stopping ends the rank at once with 128 + the signal's number
};

}  // namespace piper

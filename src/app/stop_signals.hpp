// Stop requests from the outside world: SIGTERM, SIGINT and SIGUSR1 (a scheduler's time limit or preemption,
// Ctrl-C) set one flag from process start on; start-up and the step sync fold it over all ranks; a second
// signal ends this rank at once.
#pragma once
#include <atomic>

namespace piper {

// Installs the handlers (again: a later call only relabels); `rank` only labels the message the handler
// prints (-1: not known yet, before MPI starts).
void install_stop_signals(int rank);

// Training has begun: a stop request from now on is answered with a checkpoint after the step. Before it,
// the handler says the run stops before training, with nothing to save.
void stop_signals_training_started();

// The run is over (ended, or failed): stop signals take their default action again, so that a launcher
// ending the ranks of a failed job (SIGTERM from mpirun or srun) is not held off by the handler.
void restore_default_stop_signals();

// The signal number of the first stop request on this rank, 0 while none came.
const std::atomic<int>& stop_signal();

}  // namespace piper

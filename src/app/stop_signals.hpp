// Stop requests from the outside world: SIGTERM, SIGINT and SIGUSR1 (a scheduler's time limit or preemption,
// Ctrl-C) set one flag that the step sync folds over all ranks; a second signal ends this rank at once.
#pragma once
#include <atomic>

namespace piper {

// Installs the handlers; `rank` only labels the message the handler prints.
void install_stop_signals(int rank);

// The signal number of the first stop request on this rank, 0 while none came.
const std::atomic<int>& stop_signal();

}  // namespace piper

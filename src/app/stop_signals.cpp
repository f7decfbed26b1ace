// Signal handlers for stop requests (see stop_signals.hpp). The handlers only store an atomic and write(2)
// a fixed message: both are async-signal-safe. The second request calls _exit(128 + signal).
#include "app/stop_signals.hpp"

#include <signal.h>
#include <unistd.h>

#include <cstring>

namespace piper {

namespace {

std::atomic<int> g_stop{0};
std::atomic<bool> g_training{false};
char g_rank_text[16] = "?";

void write_text(const char* s) {
  ssize_t r = write(STDERR_FILENO, s, std::strlen(s));
  (void)r;
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "a signal";
  }
}

void on_stop_signal(int sig) {
  int expected = 0;
  if (!g_stop.compare_exchange_strong(expected, sig)) {
    write_text("piper: rank ");
    write_text(g_rank_text);
    write_text(": second stop signal: exiting now, without a checkpoint\n");
    _exit(128 + sig);
  }
  write_text("piper: rank ");
  write_text(g_rank_text);
  write_text(": got ");
  write_text(signal_name(sig));
  if (g_training.load())
    write_text(": stopping after this step with a checkpoint (a second signal exits at once)\n");
  else
    write_text(": stopping before training starts, with nothing to save (a second signal exits at once)\n");
}

}  // namespace

void install_stop_signals(int rank) {
  static_assert(std::atomic<int>::is_always_lock_free, "the stop flag must be lock-free to be set by a handler");
  // rank as text now, so that the handler only copies bytes
  static_assert(std::atomic<bool>::is_always_lock_free, "the phase must be lock-free to be read by a handler");
  if (rank < 0) {
    g_rank_text[0] = '?';
    g_rank_text[1] = '\0';
  }
  char digits[16];
  int n = 0;
  unsigned v = unsigned(rank < 0 ? 0 : rank);
  do {
    digits[n++] = char('0' + v % 10);
    v /= 10;
  } while (v && n < 15);
  if (rank >= 0) {  // the terminator first: a handler running meanwhile reads a short label, never past it
    g_rank_text[n] = '\0';
    for (int i = 0; i < n; ++i) g_rank_text[i] = digits[n - 1 - i];
  }
  struct sigaction sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
}

void stop_signals_training_started() { g_training.store(true); }

void restore_default_stop_signals() {
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) ::signal(sig, SIG_DFL);
}

const std::atomic<int>& stop_signal() { return g_stop; }

}  // namespace piper

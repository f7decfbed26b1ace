// MPI_CHECK: turns a failed MPI call into a SystemError naming file:line, the call and MPI's message.
#pragma once
#include <mpi.h>

#include "util/error.hpp"

#define MPI_CHECK(call)                                                                           \
  do {                                                                                            \
    int rc_ = (call);                                                                             \
    if (rc_ != MPI_SUCCESS) {                                                                     \
      char msg_[MPI_MAX_ERROR_STRING];                                                            \
      int len_ = 0;                                                                               \
      MPI_Error_string(rc_, msg_, &len_);                                                         \
      throw ::piper::SystemError(::piper::cat(__FILE__, ":", __LINE__, ": ", #call, ": ", msg_)); \
    }                                                                                             \
  } while (0)

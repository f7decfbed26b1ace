// Test entry point. MPI is started only by the tests that need it (ensure_mpi in test_util.hpp) and
// finished here, so the many tests that use no MPI do not pay for starting it.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  int result = Catch::Session().run(argc, argv);
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
  return result;
}

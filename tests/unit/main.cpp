// Test entry point: MPI is initialized (thread-multiple) because the executor and checkpoints use it.
#define CATCH_CONFIG_RUNNER
#include <mpi.h>

#include <catch2/catch.hpp>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
  int result = Catch::Session().run(argc, argv);
  MPI_Finalize();
  return result;
}

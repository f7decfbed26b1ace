// The MPI reduction of bf16 values: a user-defined, commutative MPI_Op over MPI_UINT16_T (mpi_bf16_sum.hpp).
// Open MPI applies it in the same order on every run of the same group and sizes, as it does MPI_SUM.
#include "backend/mpi_bf16_sum.hpp"

#include <cstdint>
#include <mutex>

#include "util/mpi_check.hpp"
#include "util/precision.hpp"

namespace piper {

namespace {

// inout[i] = bf16(float(in[i]) + float(inout[i])) for i < len
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16_bits(bf16_value(a[i]) + bf16_value(b[i]));
}

}  // namespace

MPI_Op bf16_sum_op() {
  static std::once_flag once;
  static MPI_Op op = MPI_OP_NULL;
  std::call_once(once, [] { MPI_CHECK(MPI_Op_create(&bf16_sum, 1, &op)); });
  return op;
}

}  // namespace piper

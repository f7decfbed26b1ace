// Which OpenBLAS kernels this process runs: OpenBLAS gives a processor newer than its release its generic
// kernels, several times slower; blas_core_warning says so and names the OPENBLAS_CORETYPE that fixes it.
#pragma once

#include <string>

namespace piper {

// Empty where OpenBLAS runs kernels of this processor's vector width (or OPENBLAS_CORETYPE is set: the
// user chose), else one line: the core OpenBLAS picked and the OPENBLAS_CORETYPE of the nearest it knows.
std::string blas_core_warning();

}  // namespace piper

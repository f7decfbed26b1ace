// Checks that OpenBLAS recognized the processor: an x86-64 with AVX2 (or AVX-512) that OpenBLAS's release
// does not know runs its pre-AVX kernels (seen: an Intel Xeon of model 207 as "Katmai", sgemm at 1/4 speed).
#include "backend/cpu/blas_core.hpp"

#include <algorithm>
#include <cctype>
#include <cstdlib>

#include "util/error.hpp"

extern "C" char* openblas_get_corename(void);

namespace piper {

std::string blas_core_warning() {
#if defined(__x86_64__)
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return "";
  const char* name = openblas_get_corename();
  std::string core = name ? name : "unknown";
  std::string lower = core;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  for (const char* vector_core : {"haswell", "zen", "skylakex", "cooperlake", "sapphirerapids"})
    if (lower == vector_core) return "";
  const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                      __builtin_cpu_supports("avx512vl");
  const char* nearest = avx512 ? "SKYLAKEX" : (__builtin_cpu_is("amd") ? "ZEN" : "HASWELL");
  return cat("OpenBLAS does not know this processor and runs its '", core, "' kernels, made for processors without ",
             avx512 ? "AVX-512" : "AVX2", " (matmuls several times slower); OPENBLAS_CORETYPE=", nearest,
             " in the job's environment selects the kernels of the nearest processor it knows");
#else
  return "";
#endif
}

}  // namespace piper

// Picks the backend a job asks for; the CUDA backend exists only in builds that found the CUDA toolkit.
#include "backend/backend.hpp"
#include "util/error.hpp"

namespace piper {

std::unique_ptr<Backend> make_cpu_backend(int threads);
#ifdef PIPER_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_backend(int local_rank);
#endif

std::unique_ptr<Backend> make_backend(const std::string& name, int threads, int local_rank) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") {
#ifdef PIPER_HAVE_CUDA
    return make_cuda_backend(local_rank);
#else
    (void)local_rank;
    throw UserError("job.backend = \"cuda\" but this piper was built without CUDA (no CUDA toolkit at build time)");
#endif
  }
  throw UserError(cat("job.backend: unknown backend '", name, "'"));
}

}  // namespace piper

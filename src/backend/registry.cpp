// Picks the backend a job asks for. The CUDA backend exists only in builds that found the CUDA toolkit; it
// lives in libpiper_cuda.so next to the executable, loaded the first time a job asks for it (the unit tests
// link it in instead), so that a CPU run never loads the CUDA libraries.
#include <dlfcn.h>
#include <unistd.h>

#include <climits>

#include "backend/backend.hpp"
#include "util/error.hpp"

namespace piper {

std::unique_ptr<Backend> make_cpu_backend(int threads);

namespace {

CudaBackendFactory g_cuda_factory = nullptr;

#ifdef PIPER_HAVE_CUDA
// libpiper_cuda.so in the folder of this executable.
std::string cuda_module_path() {
  char exe[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) throw SystemError("cannot read /proc/self/exe to find libpiper_cuda.so");
  std::string dir(exe, size_t(n));
  dir.erase(dir.find_last_of('/') + 1);
  return dir + "libpiper_cuda.so";
}

CudaBackendFactory load_cuda_backend() {
  if (g_cuda_factory) return g_cuda_factory;  // linked in, or loaded before
  const std::string path = cuda_module_path();
  if (access(path.c_str(), R_OK) != 0)
    throw UserError(cat("job.backend = \"cuda\": the CUDA backend ", path,
                        " is missing; it is built next to piper (and goes with it when piper is copied)"));
  if (!dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
    const char* why = dlerror();
    throw UserError(cat("job.backend = \"cuda\": cannot load the CUDA backend ", path, ": ", why ? why : "?",
                        " (it needs the CUDA runtime, cuBLAS and NCCL libraries on the library path)"));
  }
  if (!g_cuda_factory) throw SystemError(cat(path, " loaded but did not register the CUDA backend"));
  return g_cuda_factory;
}
#endif

}  // namespace

void register_cuda_backend(CudaBackendFactory make) { g_cuda_factory = make; }

std::unique_ptr<Backend> make_backend(const std::string& name, int threads, int local_rank) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") {
#ifdef PIPER_HAVE_CUDA
    return load_cuda_backend()(local_rank);
#else
    (void)local_rank;
    throw UserError("job.backend = \"cuda\" but this piper was built without CUDA (no CUDA toolkit at build time)");
#endif
  }
  throw UserError(cat("job.backend: unknown backend '", name, "'"));
}

}  // namespace piper

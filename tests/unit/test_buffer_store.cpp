// The buffer store on a backend whose device work runs after the host moves on: memory reused within a
// step is ordered after the last use of its earlier holder on every stream that used it, and not at all
// once the step (and with it all device work) is over.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "runtime/buffer_store.hpp"

using namespace piper;

namespace {

class Named final : public StreamContext {
 public:
  explicit Named(int id) : id(id) {}
  int id;
};

// Host memory, and a log of the device-side waits asked for: (stream, event).
class WaitLog final : public Backend {
 public:
  std::string name() const override { return "wait-log"; }
  Kernels& kernels() override { return kernels_; }
  void* allocate(size_t bytes) override { return std::calloc(1, bytes ? bytes : 1); }
  void release(void* p, size_t) override { std::free(p); }
  void zero(void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  std::unique_ptr<StreamContext> make_stream(const std::string&) override { return nullptr; }
  void bind(StreamContext*) override {}
  void record(StreamContext*, int) override {}
  void wait(StreamContext* s, int event) override { waits.push_back({s ? static_cast<Named*>(s)->id : -1, event}); }
  void prepare_events(int) override {}
  void synchronize(StreamContext*) override {}
  std::unique_ptr<Communicator> make_communicator(MPI_Comm, MPI_Comm) override { return nullptr; }
  std::vector<std::pair<int, int>> waits;

 private:
  CpuKernels kernels_{1};
};

Plan two_buffers_of_one_size() {
  Plan p;
  PlanBuffer a;
  a.bytes = 4096;
  a.uses = 3;
  a.name = "a";
  PlanBuffer b = a;
  b.uses = 1;
  b.name = "b";
  p.buffers = {a, b};
  return p;
}

}  // namespace

TEST_CASE("memory reused within a step waits for its earlier holder's last use on each stream", "[buffers]") {
  const Plan plan = two_buffers_of_one_size();
  WaitLog backend;
  BufferStore store(plan, backend);
  Named s0(0), s1(1), s2(2);

  store.begin_step();
  void* a = store.acquire(0, &s0);
  CHECK(backend.waits.empty());  // fresh memory: nothing to wait for
  store.release_use(0, 0, 3);    // instruction 3 on stream 0
  store.release_use(0, 1, 5);    // instruction 5 on stream 1
  store.release_use(0, 0, 7);    // instruction 7 on stream 0: after 3 there
  void* b = store.acquire(1, &s2);
  CHECK(b == a);  // the size-keyed cache hands a's memory to b
  std::vector<std::pair<int, int>> waits = backend.waits;
  std::sort(waits.begin(), waits.end());
  CHECK(waits == std::vector<std::pair<int, int>>{{2, 5}, {2, 7}});  // on b's stream, after 5 and 7

  // A new step starts after all device work of the last one: cached memory needs no wait.
  store.release_use(1, 2, 9);
  store.begin_step();
  backend.waits.clear();
  CHECK(store.acquire(0, &s1) == a);
  CHECK(backend.waits.empty());
}

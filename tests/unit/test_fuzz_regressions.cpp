// Replays every input a fuzz target once failed on (tests/fuzz-regressions/<target>/) through the same code
// as the target (fuzz/targets.hpp), so that plain and sanitizer builds keep them fixed without clang.
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "fuzz_regressions.hpp"
#include "targets.hpp"

namespace {

void replay(const std::string& target, void (*one)(const uint8_t*, size_t)) {
  int n = 0;
  for (const FuzzRegression& r : fuzz_regressions()) {
    if (target != r.target) continue;
    INFO("tests/fuzz-regressions/" << r.target << "/" << r.name << " (" << r.size << " bytes)");
    CHECK_NOTHROW(one(r.data, r.size));
    ++n;
  }
  INFO(n << " saved inputs of fuzz_" << target);
  SUCCEED();
}

}  // namespace

TEST_CASE("every saved fuzz input belongs to a fuzz target", "[fuzz]") {
  const std::set<std::string> targets = {"job", "plan", "ckpt", "safetensors"};
  for (const FuzzRegression& r : fuzz_regressions()) {
    INFO(r.target << "/" << r.name);
    CHECK(targets.count(r.target) == 1);
  }
}

TEST_CASE("job files a fuzz run once failed on end in a JobSpec or a UserError", "[fuzz]") {
  replay("job", piper::fuzz::job);
}

TEST_CASE("plan bytes a fuzz run once failed on end in a checked Plan or a SystemError", "[fuzz]") {
  replay("plan", piper::fuzz::plan);
}

TEST_CASE("checkpoint files a fuzz run once failed on end in a CheckpointInfo or a UserError", "[fuzz]") {
  replay("ckpt", piper::fuzz::ckpt);
}

TEST_CASE("safetensors files a fuzz run once failed on end in tensors or a UserError", "[fuzz]") {
  replay("safetensors", piper::fuzz::safetensors);
}

// The inputs saved under tests/fuzz-regressions/<target>/, compiled in by tests/CMakeLists.txt
// (fuzz_regressions.cpp in the build folder): each with its fuzz target's name, its file name and bytes.
#pragma once
#include <cstddef>
#include <vector>

struct FuzzRegression {
  const char* target;  // job, plan, ckpt: the fuzz target (fuzz/fuzz_<target>.cpp)
  const char* name;    // file name
  const unsigned char* data;
  size_t size;
};

const std::vector<FuzzRegression>& fuzz_regressions();

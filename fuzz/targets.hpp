// What each fuzz target does with one input, shared by the libFuzzer entry points (fuzz_*.cpp) and the
// unit test that replays saved failing inputs (tests/unit/test_fuzz_regressions.cpp).
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ckpt/safetensors.hpp"
#include "ckpt/verify.hpp"
#include "compile/compile.hpp"
#include "config/load.hpp"
#include "plan/plan.hpp"
#include "util/error.hpp"

namespace piper::fuzz {

// A file of this process for targets that read files: in $TMPDIR, else /dev/shm, else /tmp.
inline std::string input_path(const std::string& tag, const std::string& ext) {
  const char* dir = std::getenv("TMPDIR");
  std::string d = dir && *dir ? dir : (access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
  return d + "/piper-fuzz-" + tag + "-" + std::to_string(getpid()) + ext;
}

inline void write_input(const std::string& path, const uint8_t* data, size_t size) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) throw SystemError("cannot write " + path);
  const bool written = std::fwrite(data, 1, size, f) == size;
  if (std::fclose(f) != 0 || !written) throw SystemError("cannot write " + path);
}

// The job-file loader: any text ends in a JobSpec or a UserError; any other exception escapes. Lines
// "#set KEY=VALUE" (TOML comments) are also given as --set overrides, so that those are fuzzed too.
inline void job(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    if (text.compare(at, 5, "#set ") == 0) overrides.push_back(text.substr(at + 5, end - at - 5));
    at = end + 1;
  }
  try {
    JobSpec spec = load_job_text(text, "fuzz.toml", overrides);
    (void)spec;
  } catch (const UserError&) {
  }
}

// The plan deserializer: any bytes end in a Plan or a SystemError. An accepted plan passed check_plan, so
// every rank of its set can bind it and everything that follows its indices (labels, the text dump, group
// ranks) stays in range; written again, it reads back.
inline void plan(const uint8_t* data, size_t size) {
  Plan body;
  try {
    body = deserialize_plan(data, size);
  } catch (const SystemError&) {
    return;
  }
  for (int rank : body.sets[size_t(body.set)]) {
    Plan bound = bind_plan(body, rank);
    for (const Instr& in : bound.instrs) (void)instr_label(bound, in);
    for (const GroupRef& g : bound.groups) (void)bound.group_ranks(g);
  }
  (void)plan_to_text(body);
  const std::vector<uint8_t> again = serialize_plan(body);
  (void)deserialize_plan(again.data(), again.size());
}

// The checkpoint check: any file ends in a CheckpointInfo or a UserError that names it. The bytes go to a
// file of this process in $TMPDIR (or /dev/shm, or /tmp), which verify_checkpoint reads.
inline void ckpt(const uint8_t* data, size_t size) {
  static const std::string path = input_path("ckpt", ".h5");
  write_input(path, data, size);
  try {
    CheckpointInfo info = verify_checkpoint(path);
    (void)info;
  } catch (const UserError&) {
  }
  std::remove(path.c_str());
}

// The safetensors reader (piper-ckpt import): any file ends in its tensors or a UserError that names it.
inline void safetensors(const uint8_t* data, size_t size) {
  static const std::string path = input_path("st", ".safetensors");
  write_input(path, data, size);
  try {
    SafetensorsFile st = read_safetensors(path);
    (void)st;
  } catch (const UserError&) {
  }
  std::remove(path.c_str());
}

}  // namespace piper::fuzz

// piper-ckpt: inspect, compare, verify, export and import piper checkpoints (src/ckpt/tool.hpp).
// Exit codes: 0 done, 1 a difference or a damaged file found, 2 bad input, with a message saying what and where.
#include <cstdio>
#include <string>
#include <vector>

#include "ckpt/tool.hpp"
#include "util/error.hpp"
#include "util/exit_codes.hpp"

int main(int argc, char** argv) {
  using namespace piper;
  std::vector<std::string> args(argv + 1, argv + argc);
  try {
    return ckpt_tool(args);
  } catch (const UserError& e) {
    std::fprintf(stderr, "piper-ckpt: error: %s\n", e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "piper-ckpt: error: %s\n", e.what());
    return kExitFailure;
  }
}

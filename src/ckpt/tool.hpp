// piper-ckpt's commands (ls, show, diff, verify, meta, export, import) as one function over the
// command-line words, so that tests call it in-process; src/piper_ckpt_main.cpp is the executable.
#pragma once
#include <string>
#include <vector>

namespace piper {

// Runs `piper-ckpt ARGS...` (args without the program name) and returns its exit code: 0 done (or no
// difference), 1 a difference beyond the tolerance or a file that does not verify, 2 bad input.
int ckpt_tool(const std::vector<std::string>& args);

// The usage text.
const char* ckpt_tool_usage();

}  // namespace piper

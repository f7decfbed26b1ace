// `piper sample CHECKPOINT ...`: loads a checkpoint's model and continues a prompt, greedy or drawn with
// temperature, top-k and top-p, on the CPU or a GPU. One process, no MPI.
#pragma once
#include <string>
#include <vector>

namespace piper {

// The words after "sample". Returns the exit code; UserError for bad input (exit 2).
int sample_command(const std::vector<std::string>& args);
const char* sample_usage();

}  // namespace piper

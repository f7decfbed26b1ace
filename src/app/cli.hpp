// Command-line options (Boost program_options): what to run and where its outputs go.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace piper {

struct CliOptions {
  std::string config;
  std::vector<std::string> overrides;  // --set key.path=value, in order
  int64_t steps = -1;                  // --steps: the step the run ends at (-1: job.steps)
  std::string metrics;                 // JSON lines
  std::string resume;                  // "", "auto" or a path
  bool dry_run = false;
  std::string dump_plan;               // directory
  int world = 0;                       // --world (dry run): compile for this many ranks
  std::string fit_memory;              // --fit-memory SIZE (dry run): as given
  uint64_t fit_memory_bytes = 0;       // ... and in bytes; 0: not asked
  std::string trace;                   // Chrome-trace JSON of the whole job
  bool profile = false;                // per-kernel time breakdown after the run
  bool json = false;                   // --json (dry run): the report as one JSON document on stdout
  std::string report_json;             // --report-json FILE: the end-of-run reports as one JSON document
  bool help = false, version = false;
  std::string help_text;
};

// Throws UserError for unknown or malformed options.
CliOptions parse_cli(int argc, char** argv);

const char* piper_version();

}  // namespace piper

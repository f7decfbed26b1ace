// libFuzzer entry point of the job-file loader (load_job_text): any text ends in a JobSpec or a
// piper::UserError; another exception, a crash or a sanitizer report is a finding. See targets.hpp.
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  piper::fuzz::job(data, size);
  return 0;
}

// libFuzzer entry point of the plan deserializer (deserialize_plan and its plan check): any bytes end in a
// Plan the executor can run or a piper::SystemError. See targets.hpp.
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  piper::fuzz::plan(data, size);
  return 0;
}

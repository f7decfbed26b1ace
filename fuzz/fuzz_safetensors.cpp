// libFuzzer entry point of the safetensors reader (what piper-ckpt import reads): any file ends in tensors
// or a piper::UserError naming it. See targets.hpp.
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  piper::fuzz::safetensors(data, size);
  return 0;
}

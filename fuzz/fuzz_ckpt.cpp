// libFuzzer entry point of the checkpoint check (verify_checkpoint, what --resume runs on a file): any file
// ends in a CheckpointInfo or a piper::UserError naming it. See targets.hpp.
#include "targets.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  piper::fuzz::ckpt(data, size);
  return 0;
}

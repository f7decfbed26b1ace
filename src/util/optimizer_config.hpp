// AdamW hyperparameters and the learning-rate schedule's knobs, shared by the job file, the plan and the
// runtime: a plain struct at the bottom layer, so that the runtime needs nothing of config/.
#pragma once
#include <cstdint>
#include <string>

namespace piper {

struct OptimizerConfig {
  std::string kind = "adamw";
  double lr = 3e-4;
  double min_lr = 0.0;  // cosine floor
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 disables clipping
  int64_t warmup_steps = 0;
  int64_t decay_steps = 0;  // cosine horizon; 0 = job.steps
};

}  // namespace piper

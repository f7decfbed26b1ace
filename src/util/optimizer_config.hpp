// AdamW hyperparameters and the learning-rate schedule's knobs, shared by the job file, the plan and the
// runtime: a plain struct at the bottom layer, so that the runtime needs nothing of config/.
#pragma once
#include <cstdint>
#include <string>

namespace piper {

// How the learning rate moves after warm-up (runtime/learning_rate.hpp).
enum class LrSchedule : uint8_t { Cosine, Linear, Constant, Wsd };
inline const char* lr_schedule_name(LrSchedule s) {
  switch (s) {
    case LrSchedule::Cosine: return "cosine";
    case LrSchedule::Linear: return "linear";
    case LrSchedule::Constant: return "constant";
    case LrSchedule::Wsd: return "wsd";
  }
  return "?";
}

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
  int64_t decay_steps = 0;  // where the decay reaches min_lr; 0 = job.steps
  LrSchedule schedule = LrSchedule::Cosine;
  double decay_fraction = 0.2;  // WSD: the last fraction of decay_steps spent decaying
};

}  // namespace piper

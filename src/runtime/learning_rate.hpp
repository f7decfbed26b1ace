// Learning-rate schedule: linear warm-up to lr over warmup_steps, then cosine decay to min_lr at
// decay_steps (which defaults to job.steps in the file, so --steps never changes the schedule).
#pragma once
#include <cmath>
#include <cstdint>

#include "util/optimizer_config.hpp"

namespace piper {

inline double learning_rate(const OptimizerConfig& o, int64_t step) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  const int64_t span = o.decay_steps - o.warmup_steps;
  if (span <= 0) return o.lr;
  double progress = std::min(1.0, std::max(0.0, double(step - o.warmup_steps) / double(span)));
  return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(3.141592653589793 * progress));
}

}  // namespace piper

// Learning-rate schedules: linear warm-up to lr over warmup_steps, then (optimizer.schedule) cosine or linear
// decay to min_lr at decay_steps, a constant lr, or warmup-stable-decay (lr until the last decay_fraction of
// decay_steps, then linear to min_lr). decay_steps defaults to job.steps in the file, so --steps never changes it.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "util/optimizer_config.hpp"

namespace piper {

inline double learning_rate(const OptimizerConfig& o, int64_t step) {
  if (o.warmup_steps > 0 && step < o.warmup_steps) return o.lr * double(step + 1) / double(o.warmup_steps);
  if (o.schedule == LrSchedule::Constant) return o.lr;
  // the decay's first step: after warm-up, or for WSD after the stable phase
  int64_t from = o.warmup_steps;
  if (o.schedule == LrSchedule::Wsd)
    from = std::max(from, o.decay_steps - int64_t(std::llround(o.decay_fraction * double(o.decay_steps))));
  const int64_t span = o.decay_steps - from;
  if (span <= 0) return o.lr;
  const double progress = std::min(1.0, std::max(0.0, double(step - from) / double(span)));
  if (o.schedule == LrSchedule::Cosine)
    return o.min_lr + 0.5 * (o.lr - o.min_lr) * (1.0 + std::cos(3.141592653589793 * progress));
  return o.lr + (o.min_lr - o.lr) * progress;  // linear, and WSD's decay
}

}  // namespace piper

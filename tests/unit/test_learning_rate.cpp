// Learning-rate schedules (optimizer.schedule): cosine, linear, constant and warmup-stable-decay, at the steps
// where their phases meet, and their keys in the job file.
#include <catch2/catch.hpp>

#include "config/load.hpp"
#include "runtime/learning_rate.hpp"
#include "util/error.hpp"

using namespace piper;

namespace {

OptimizerConfig schedule(LrSchedule s) {
  OptimizerConfig o;
  o.lr = 1.0;
  o.min_lr = 0.1;
  o.warmup_steps = 10;
  o.decay_steps = 110;
  o.schedule = s;
  return o;
}

const char* kJob = R"(
[job]
name = "t"
steps = 100

[model]
kind = "mlp"
d_in = 8
d_hidden = 16
n_layers = 2
n_classes = 4

[data]
batch = 8

[optimizer]
lr = 0.01
)";

}  // namespace

TEST_CASE("every schedule warms up linearly to lr", "[lr]") {
  for (LrSchedule s : {LrSchedule::Cosine, LrSchedule::Linear, LrSchedule::Constant, LrSchedule::Wsd}) {
    const OptimizerConfig o = schedule(s);
    CHECK(learning_rate(o, 0) == Approx(0.1));
    CHECK(learning_rate(o, 4) == Approx(0.5));
    CHECK(learning_rate(o, 9) == Approx(1.0));
  }
}

TEST_CASE("cosine and linear decay from lr after warm-up to min_lr at decay_steps", "[lr]") {
  const OptimizerConfig cos = schedule(LrSchedule::Cosine), lin = schedule(LrSchedule::Linear);
  CHECK(learning_rate(cos, 10) == Approx(1.0));
  CHECK(learning_rate(cos, 60) == Approx(0.55));  // half way: the mean of lr and min_lr
  CHECK(learning_rate(cos, 35) == Approx(0.1 + 0.45 * (1 + std::cos(3.141592653589793 / 4))));
  CHECK(learning_rate(lin, 35) == Approx(0.775));  // a quarter of the way down a line
  CHECK(learning_rate(lin, 60) == Approx(0.55));
  for (const OptimizerConfig& o : {cos, lin}) {
    CHECK(learning_rate(o, 110) == Approx(0.1));
    CHECK(learning_rate(o, 500) == Approx(0.1));  // past decay_steps: min_lr
  }
}

TEST_CASE("constant holds lr after warm-up", "[lr]") {
  const OptimizerConfig o = schedule(LrSchedule::Constant);
  for (int64_t step : {10, 60, 109, 500}) CHECK(learning_rate(o, step) == Approx(1.0));
}

TEST_CASE("wsd holds lr until the last decay_fraction of decay_steps, then falls linearly to min_lr", "[lr]") {
  OptimizerConfig o = schedule(LrSchedule::Wsd);  // decay_fraction 0.2 of 110: decays over steps 88..110
  CHECK(learning_rate(o, 10) == Approx(1.0));
  CHECK(learning_rate(o, 87) == Approx(1.0));
  CHECK(learning_rate(o, 88) == Approx(1.0));
  CHECK(learning_rate(o, 99) == Approx(0.55));
  CHECK(learning_rate(o, 110) == Approx(0.1));
  o.decay_fraction = 1.0;  // the decay cannot start before warm-up ends: it runs from step 10, as linear does
  CHECK(learning_rate(o, 60) == Approx(learning_rate(schedule(LrSchedule::Linear), 60)));
  o.decay_fraction = 0.0;  // no decay phase: lr to the end
  CHECK(learning_rate(o, 200) == Approx(1.0));
}

TEST_CASE("optimizer.schedule and decay_fraction in the job file", "[lr][config]") {
  CHECK(load_job_text(kJob, "job.toml").optimizer.schedule == LrSchedule::Cosine);
  const JobSpec wsd = load_job_text(kJob, "job.toml", {"optimizer.schedule=\"wsd\"", "optimizer.decay_fraction=0.1"});
  CHECK(wsd.optimizer.schedule == LrSchedule::Wsd);
  CHECK(wsd.optimizer.decay_fraction == 0.1);
  CHECK(load_job_text(kJob, "job.toml", {"optimizer.schedule=\"constant\""}).optimizer.schedule == LrSchedule::Constant);
  auto error_of = [](std::vector<std::string> sets) -> std::string {
    try {
      load_job_text(kJob, "job.toml", sets);
    } catch (const UserError& e) {
      return e.what();
    }
    return "";
  };
  CHECK(error_of({"optimizer.schedule=\"step\""}).find("optimizer.schedule") != std::string::npos);
  CHECK(error_of({"optimizer.decay_fraction=0.1"}).find("decay_fraction is the decay phase of schedule = \"wsd\"") !=
        std::string::npos);
  CHECK(error_of({"optimizer.schedule=\"wsd\"", "optimizer.decay_fraction=1.5"}).find("optimizer.decay_fraction") !=
        std::string::npos);
}

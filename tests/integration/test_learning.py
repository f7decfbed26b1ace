"""Small models learn: the MLP on the synthetic teacher task reaches a mean loss below 0.5 over its last 20
steps (from ln 8 = 2.08 at init), and a tiny GPT (d_model 32) on the fortunes text drops below 3.4 in 300 steps (from ln 256 = 5.55).
Each learning-rate schedule (optimizer.schedule: cosine, linear, constant, wsd) reaches the runtime: the lr of every
metrics line is the schedule's formula, written out here again."""
import math
import os

from common import DATA, fail, losses, metrics, run, tempdir, tiny_gpt, write

MLP = """
[job]
name = "mlp"
steps = 300
seed = 3
threads = 1

[model]
kind = "mlp"
d_in = 16
d_hidden = 64
n_layers = 3
n_classes = 8

[data]
batch = 64

[optimizer]
lr = 3e-3
warmup_steps = 10
weight_decay = 0.0
"""


def main():
    d = tempdir()
    run(1, write(d, "mlp.toml", MLP), "--metrics", os.path.join(d, "mlp.jsonl"))
    l = losses(os.path.join(d, "mlp.jsonl"))
    tail = sum(l[-20:]) / 20
    if not (abs(l[0] - 2.079) < 0.2 and tail < 0.5):
        fail(f"MLP: first loss {l[0]:.3f} (expected about ln 8 = 2.079), mean of last 20 {tail:.3f} (expected < 0.5)")
    print(f"ok  MLP synthetic task: loss {l[0]:.3f} -> mean of last 20 steps {tail:.3f} (< 0.5)")

    gpt = tiny_gpt(steps=300, batch=16)
    run(1, write(d, "gpt.toml", gpt), "--metrics", os.path.join(d, "gpt.jsonl"))
    l = losses(os.path.join(d, "gpt.jsonl"))
    tail = sum(l[-10:]) / 10
    if not (abs(l[0] - 5.545) < 0.05 and tail < 3.4):
        fail(f"GPT: first loss {l[0]:.3f} (expected ln 256 = 5.545), mean of last 10 {tail:.3f} (expected < 3.4)")
    print(f"ok  tiny GPT on {os.path.basename(DATA)}: loss {l[0]:.3f} -> mean of last 10 steps {tail:.3f} (< 3.4)")

    schedules(d)


def expected_lr(schedule, step, lr=3e-3, min_lr=3e-4, warmup=10, decay_steps=60, fraction=0.25):
    """The lr of 0-based `step`: linear warm-up, then the schedule (runtime/learning_rate.hpp)."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    start = max(warmup, decay_steps - int(fraction * decay_steps + 0.5)) if schedule == "wsd" else warmup
    progress = min(1.0, max(0.0, (step - start) / (decay_steps - start)))
    if schedule == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * progress))
    return lr + (min_lr - lr) * progress


def schedules(d):
    for schedule in ("cosine", "linear", "constant", "wsd"):
        extra = f'schedule = "{schedule}"\nmin_lr = 3e-4\n' + ("decay_fraction = 0.25\n" if schedule == "wsd" else "")
        text = MLP.replace("steps = 300", "steps = 60").replace("[optimizer]\n", "[optimizer]\n" + extra)
        out = os.path.join(d, f"lr-{schedule}.jsonl")
        run(1, write(d, f"lr-{schedule}.toml", text), "--metrics", out)
        got = [m["lr"] for m in metrics(out)]
        want = [expected_lr(schedule, i) for i in range(60)]
        worst = max(abs(a - b) / b for a, b in zip(got, want))
        if len(got) != 60 or worst > 1e-5:
            fail(f"schedule {schedule}: lr per step {got} is not {want} (worst relative {worst:.2g})")
        print(f"ok  schedule {schedule:8s}: 60 metrics lines follow its formula (lr at steps 30, 50, 60: "
              f"{got[29]:.2e} {got[49]:.2e} {got[59]:.2e})")


if __name__ == "__main__":
    main()

"""Small models learn: the MLP on the synthetic teacher task reaches a mean loss below 0.5 over its last 20
steps (from ln 8 = 2.08 at init), and a tiny GPT (d_model 32) on the fortunes text drops below 3.4 in 300 steps (from ln 256 = 5.55)."""
import os

from common import DATA, fail, losses, run, tempdir, tiny_gpt, write

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


if __name__ == "__main__":
    main()

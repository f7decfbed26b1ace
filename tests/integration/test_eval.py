"""[eval]: a validation token file's mean cross-entropy (val_loss) every `every` steps and after the last, from
`batches` batches of data.batch sequences read in order from its start, with that step's weights.

Checked: val_loss appears in the metrics and an "eval" line exactly at steps 5 and 10 of 10 (every = 5); the
training losses are the run without [eval] to the bit (evaluating changes no weight, moment or data order);
another validation file gives another val_loss; DP2, PP2 x DP2 (1F1B) and ZeRO-3 give the one-process val_loss
within 1e-5, as training losses do. Bad settings exit 2 naming the key: no path, a missing file, a file with ids
past the vocabulary, a family trained on synthetic data."""
import os
import subprocess
import sys

from common import DATA, ROOT, compare, fail, metrics, mesh, run, tempdir, tiny_gpt, write

RTOL = 1e-5


def main():
    d = tempdir()
    tokens = os.path.join(d, "tok")
    subprocess.run([sys.executable, os.path.join(ROOT, "tools", "text-to-tokens.py"), DATA, "--bytes", "--separator",
                    "\\n%\\n", "--out", tokens], check=True, capture_output=True, timeout=300)
    train_file, val_file = tokens + ".train.u16.bin", tokens + ".val.u16.bin"
    base = tiny_gpt(steps=10).replace("vocab = 256", "vocab = 257").replace(f'path = "{DATA}"',
                                                                             f'path = "{train_file}"')
    with_eval = base + f'\n[eval]\npath = "{val_file}"\nevery = 5\nbatches = 2\n'

    def train(name, text, ranks=1, args=()):
        out = os.path.join(d, f"{name}.jsonl")
        p = run(ranks, write(d, f"{name}.toml", text), "--metrics", out, *args, timeout=300)
        return metrics(out), p

    plain, _ = train("plain", base)
    one, p = train("one", with_eval)
    evals = [(m["step"], m["val_loss"]) for m in one if "val_loss" in m]
    lines = [l for l in p.stdout.splitlines() if l.startswith("eval ")]
    if [s for s, _ in evals] != [5, 10] or len(lines) != 2 or "2 batches of 16 sequences" not in lines[0]:
        fail(f"val_loss at steps {evals}, eval lines {lines}: expected steps 5 and 10")
    if [m["loss"] for m in one] != [m["loss"] for m in plain]:
        fail("the training losses of the run with [eval] are not those of the run without it")
    print(f"ok  val_loss at steps 5 and 10 ({evals[0][1]:.5f}, {evals[1][1]:.5f}); the training losses are the run "
          f"without [eval] to the bit")

    other, _ = train("other", with_eval.replace(f'path = "{val_file}"\nevery', f'path = "{train_file}"\nevery'))
    if [m.get("val_loss") for m in other if "val_loss" in m] == [v for _, v in evals]:
        fail("another validation file gave the same val_loss: the file is not what was read")
    print("ok  another validation file, another val_loss")

    for label, ranks, args in (("DP2", 2, mesh(dp=2)), ("PP2 x DP2 1F1B", 4, mesh(pp=2, dp=2, m=4, schedule="1f1b")),
                               ("DP2 ZeRO-3", 2, mesh(dp=2, zero=3))):
        got, _ = train(label.replace(" ", "_"), with_eval, ranks, args)
        compare(f"{label} val_loss", [v for _, v in evals], [m["val_loss"] for m in got if "val_loss" in m], RTOL)

    for text, says in (
            (base + "\n[eval]\nevery = 5\n", "eval.path"),
            (base + f'\n[eval]\npath = "{os.path.join(d, "missing.u16.bin")}"\n', "eval.path"),
            (base.replace("vocab = 257", "vocab = 256").replace(f'path = "{train_file}"', f'path = "{DATA}"')
             + f'\n[eval]\npath = "{val_file}"\n', "[eval]"),
            ("[job]\nname = \"m\"\nsteps = 2\n[model]\nkind = \"mlp\"\n[data]\nbatch = 8\n[eval]\npath = \"x\"\n",
             "synthetic")):
        p = run(1, write(d, "bad.toml", text), check=False)
        if p.returncode != 2 or says not in p.stderr:
            fail(f"a bad [eval] exited {p.returncode} without naming {says!r}:\n{p.stderr}")
    print("ok  bad [eval] settings exit 2 naming what is wrong (no path, a missing file, ids past the vocabulary, "
          "a synthetic-data family)")


if __name__ == "__main__":
    main()

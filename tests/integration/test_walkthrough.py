"""The README's walk "From a text file to a Hugging Face model", run line by line as written (read from the README
itself), in a folder of its own that links build/, tools/, configs/ and data/fortunes.txt, at a smaller size: the
training line gets `--set` overrides appended (a 2-layer Qwen3 of width 64, 4 steps, a checkpoint at step 4) and the
export and the sampling name that checkpoint. `make` is left out (the test runs from a build). Each line must exit 0; the token
files, the plot, the checkpoint and the model folder must exist; the last line (transformers and torch) runs where
an interpreter has them (TRANSFORMERS_PYTHON names one); it and `piper sample` must print the prompt and a
continuation."""
import os
import re
import shlex
import subprocess
import sys

from common import DATA, PIPER, ROOT, fail, tempdir

SMALL = ("--set model.d_model=64 --set model.n_layers=2 --set model.n_heads=4 --set model.n_kv_heads=2 "
         "--set model.head_dim=16 --set model.d_ff=128 --set model.seq_len=64 --set job.steps=4 "
         "--set checkpoint.every=4 --set job.threads=1")


def walk_lines():
    text = open(os.path.join(ROOT, "README.md")).read()
    at = text.index("## From a text file to a Hugging Face model")
    block = re.search(r"```sh\n(.*?)```", text[at:], re.S).group(1)
    lines = block.replace("\\\n", " ").splitlines()
    return [l.split("  #")[0].strip() for l in lines if l.strip()]


def main():
    d = tempdir()
    for name in ("tools", "configs"):
        os.symlink(os.path.join(ROOT, name), os.path.join(d, name))
    os.symlink(os.path.dirname(os.path.abspath(PIPER)), os.path.join(d, "build"))
    os.makedirs(os.path.join(d, "data"))
    os.makedirs(os.path.join(d, "runs"))
    os.symlink(DATA, os.path.join(d, "data", "fortunes.txt"))
    lines = walk_lines()
    if len(lines) < 6 or lines[0] != "make":
        fail(f"the README's walk is not the expected block: {lines}")
    pythons = [os.environ.get("TRANSFORMERS_PYTHON"), sys.executable, "/usr/bin/python3"]
    hf_python = next((p for p in pythons if p and os.path.exists(p) and subprocess.run(
        [p, "-c", "import transformers, torch"], capture_output=True).returncode == 0), None)
    for line in lines[1:]:
        if line.startswith("build/piper --config"):
            line += " " + SMALL
        line = line.replace("step_00000200.h5", "step_00000004.h5")
        words = shlex.split(line)
        if words[0] == "python3" and "hf-generate.py" in words[1]:
            if hf_python is None:
                print("ok  " + line[:60] + "...: skipped, no interpreter here has transformers and torch")
                continue
            words[0] = hf_python
        elif words[0].startswith("tools/") and words[0].endswith(".py"):
            words = [sys.executable] + words
        p = subprocess.run(words, cwd=d, capture_output=True, encoding="utf-8", errors="replace", timeout=600)
        if p.returncode != 0:
            fail(f"the README's line `{line}` exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
        if line.startswith("build/piper sample") and not (p.stdout.startswith("A fortune: ") and
                                                          "new tokens in" in p.stderr):
            fail(f"piper sample printed {p.stdout!r} {p.stderr!r}")
        if "hf-generate.py" in line and not (p.stdout.startswith("A fortune: ") and len(p.stdout.strip()) > 12):
            fail(f"hf-generate printed {p.stdout!r}")
        print(f"ok  {line[:100]}")
    for path in ("data/walk.train.u16.bin", "data/walk.val.u16.bin", "runs/walk.jsonl", "runs/walk.png",
                 "runs/walk/step_00000004.h5", "runs/walk-hf/config.json", "runs/walk-hf/model.safetensors"):
        if not os.path.isfile(os.path.join(d, path)) or os.path.getsize(os.path.join(d, path)) == 0:
            fail(f"the walk did not write {path}")
    print("ok  the walk wrote the token files, metrics, plot, checkpoint and model folder")


if __name__ == "__main__":
    main()

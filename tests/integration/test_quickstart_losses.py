"""The quickstart's numerics stay put while its kernels get faster: the losses of its first 20 steps, on 1 and 2
threads, stay within 1e-5 relative of those recorded in tests/reference/quickstart-losses.json."""
import json
import os

from common import ROOT, fail, losses, run, tempdir

RTOL = 1e-5


def main():
    ref = json.load(open(os.path.join(ROOT, "tests", "reference", "quickstart-losses.json")))
    d = tempdir()
    for threads, want in sorted(ref["losses"].items()):
        out = os.path.join(d, f"t{threads}.jsonl")
        run(1, os.path.join(ROOT, ref["config"]), "--steps", str(ref["steps"]), "--set", f"job.threads={threads}",
            "--set", 'checkpoint.dir=""', "--metrics", out)
        got = losses(out)
        if len(got) != len(want):
            fail(f"{threads} threads: {len(got)} losses, expected {len(want)}")
        worst = max(range(len(want)), key=lambda i: abs(got[i] - want[i]) / abs(want[i]))
        rel = abs(got[worst] - want[worst]) / abs(want[worst])
        if rel > RTOL:
            fail(f"{threads} threads: step {worst + 1} loss {got[worst]:.8f}, reference {want[worst]:.8f} "
                 f"(relative difference {rel:.2e} > {RTOL:.0e})")
        print(f"ok  quickstart on {threads} thread(s): {len(got)} losses within {rel:.1e} relative of the reference "
              f"(step {worst + 1} the farthest)")


if __name__ == "__main__":
    main()

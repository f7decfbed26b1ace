"""Shared by the benchmark scripts: where piper and the repository are, the environment MPI jobs run in (root
allowed, oversubscription allowed on a 2-core machine, shared-memory transport), and interval arithmetic for traces."""
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def piper_path(build):
    return os.path.abspath(os.path.join(build, "piper"))


def run_logged(cmd, log, who):
    """Runs cmd in the repository with its output in `log`, printing the command; exits naming `who` (the script) and
    the log when it fails. Returns the log's text."""
    print("+ " + " ".join(cmd) + f"   > {os.path.relpath(log, ROOT)}", flush=True)
    with open(log, "w") as f:
        p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT)
    if p.returncode != 0:
        sys.exit(f"{who}: command failed ({p.returncode}); see {log}")
    return open(log).read()


def mpi_env():
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl="self,vader")


def union(intervals):
    """Sorted, merged [start, end] intervals (empty ones dropped)."""
    out = []
    for a, b in sorted(intervals):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def overlap(x, y):
    """Total length where two lists of disjoint intervals overlap."""
    total = 0.0
    for a, b in x:
        for c, d in y:
            total += max(0.0, min(b, d) - max(a, c))
    return total

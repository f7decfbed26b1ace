"""Shared by the benchmark scripts: where piper and the repository are, the environment MPI jobs run in (root
allowed, oversubscription allowed on a 2-core machine, shared-memory transport), and interval arithmetic for traces."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def piper_path(build):
    return os.path.abspath(os.path.join(build, "piper"))


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

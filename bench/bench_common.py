"""Shared by the benchmark scripts: where piper and the repository are, and the environment MPI jobs run in
(root allowed, oversubscription allowed on a 2-core machine, shared-memory transport)."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def piper_path(build):
    return os.path.abspath(os.path.join(build, "piper"))


def mpi_env():
    return dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_btl="self,vader")

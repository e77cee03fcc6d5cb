"""Run a distfact fit on a SLURM allocation through dask-jobqueue (``pip install dask-jobqueue``).

    python cluster/slurm_cluster.py STORE RANK

Each SLURM job is one Dask worker process (1 core, 4 GiB, spilling to node-local disk); the scheduler runs in
this process (on a login node, or inside an interactive allocation). The store must be on a file system the
compute nodes share. Adjust queue/account/walltime to the site.
"""

import sys

from dask_jobqueue import SLURMCluster
from distributed import Client

import distfact


def main(store: str, rank: int) -> None:
    cluster = SLURMCluster(queue="normal", account=None, cores=1, processes=1, memory="4GiB", walltime="02:00:00",
                           local_directory="$TMPDIR", scheduler_options={"dashboard_address": "127.0.0.1:8787"})
    cluster.scale(jobs=8)
    with Client(cluster) as client:
        client.wait_for_workers(8, timeout=1800)
        model = distfact.NMF(rank, solver="hals", max_iter=200, random_state=0, checkpoint_dir="nmf-run",
                             checkpoint_every=10, resume=True).fit(store, client=client, W_out="nmf-run/W")
        print(model.group_errors_)
    cluster.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))

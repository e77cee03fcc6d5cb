"""Run a distfact fit on a SLURM allocation through dask-jobqueue (``pip install dask-jobqueue``).

    distfact make-certs certs --host "$(hostname)"     # once; the directory must be readable on the nodes
    python cluster/slurm_cluster.py STORE RANK certs

Each SLURM job is one Dask worker process (1 core, 4 GiB, spilling to node-local disk); the scheduler runs in
this process (on a login node, or inside an interactive allocation). All traffic is TLS with the certificates in
the directory given. The store must be on a file system the compute nodes share. Adjust
queue/account/walltime to the site.
"""

import sys

from dask_jobqueue import SLURMCluster
from distributed import Client

import distfact
from distfact.engine.tls import security_from_dir


def main(store: str, rank: int, certs: str) -> None:
    cluster = SLURMCluster(queue="normal", account=None, cores=1, processes=1, memory="4GiB", walltime="02:00:00",
                           local_directory="$TMPDIR", protocol="tls://", security=security_from_dir(certs),
                           scheduler_options={"dashboard_address": "127.0.0.1:8787"})
    cluster.scale(jobs=8)
    with Client(cluster) as client:
        client.wait_for_workers(8, timeout=1800)
        model = distfact.NMF(rank, solver="hals", max_iter=200, random_state=0, checkpoint_dir="nmf-run",
                             checkpoint_every=10, resume=True).fit(store, client=client, W_out="nmf-run/W")
        print(model.group_errors_)
    cluster.close()


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3])

#!/usr/bin/env bash
# Start a real Dask cluster on this machine from the Dask CLI: a scheduler and N worker processes (one thread and
# a memory limit each, with nannies), all on 127.0.0.1, the dashboard on loopback too, with cluster/dask.yaml
# (memory thresholds, timeouts). Writes DIR/scheduler.json (give it to distfact: --scheduler DIR/scheduler.json)
# and DIR/*.pid; logs in DIR/*.log. Stop it with cluster/stop-local.sh DIR.
#
#   cluster/start-local.sh [--tls CERT_DIR] [--preload FILE] [N_WORKERS=2] [MEMORY_LIMIT=2GiB] [DIR=./dask-cluster]
#
# --tls CERT_DIR: scheduler, worker and client traffic over TLS with CERT_DIR/{ca,cert,key}.pem (make them with
#                 `distfact make-certs CERT_DIR`); clients then need the same files (distfact --tls-dir CERT_DIR).
# --preload FILE: a Python file every worker runs at start (dask worker --preload).
set -euo pipefail
tls=() preload=() certs=""
usage() { echo "usage: $0 [--tls CERT_DIR] [--preload FILE] [N_WORKERS] [MEMORY_LIMIT] [DIR]" >&2; exit 2; }
while [ $# -gt 0 ]; do
    case "$1" in
        --tls|--preload) [ $# -ge 2 ] || usage;;&
        --tls) certs=$(cd "$2" && pwd); shift 2
               for f in ca.pem cert.pem key.pem; do
                   [ -r "$certs/$f" ] || { echo "--tls $certs: no $f there (make them: distfact make-certs DIR)" >&2; exit 1; }
               done
               tls=(--tls-ca-file "$certs/ca.pem" --tls-cert "$certs/cert.pem" --tls-key "$certs/key.pem");;
        --preload) preload=(--preload "$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift 2;;
        -*) echo "unknown option $1" >&2; usage;;
        *) break;;
    esac
done
[ $# -le 3 ] || { echo "unexpected arguments after DIR: ${*:4} (options come first)" >&2; usage; }
workers=${1:-2}
memory=${2:-2GiB}
dir=${3:-./dask-cluster}
here=$(cd "$(dirname "$0")" && pwd)
export DASK_CONFIG=${DASK_CONFIG:-$here/dask.yaml}
mkdir -p "$dir/worker-space"
dir=$(cd "$dir" && pwd)
if [ -e "$dir/scheduler.pid" ] && kill -0 "$(cat "$dir/scheduler.pid")" 2>/dev/null; then
    echo "a cluster already runs from $dir (stop it with cluster/stop-local.sh $dir)" >&2
    exit 1
fi
rm -f "$dir/scheduler.json"
dask scheduler --protocol "$([ -n "$certs" ] && echo tls || echo tcp)" ${tls[@]+"${tls[@]}"} \
    --host 127.0.0.1 --port 0 --dashboard-address 127.0.0.1:0 --scheduler-file "$dir/scheduler.json" \
    > "$dir/scheduler.log" 2>&1 &
echo $! > "$dir/scheduler.pid"
for _ in $(seq 1 200); do [ -s "$dir/scheduler.json" ] && break; sleep 0.1; done
[ -s "$dir/scheduler.json" ] || { echo "the scheduler did not start; see $dir/scheduler.log" >&2; exit 1; }
for i in $(seq 1 "$workers"); do
    # one `dask worker` per process, so that each can be stopped (or killed, to test fault tolerance) alone
    dask worker --scheduler-file "$dir/scheduler.json" --name "worker-$i" --nworkers 1 --nthreads 1 \
        --memory-limit "$memory" --local-directory "$dir/worker-space" --host 127.0.0.1 \
        --dashboard-address 127.0.0.1:0 ${tls[@]+"${tls[@]}"} ${preload[@]+"${preload[@]}"} \
        > "$dir/worker-$i.log" 2>&1 &
    echo $! > "$dir/worker-$i.pid"
done
python - "$dir/scheduler.json" "$workers" "$certs" <<'PY'
import sys
from distributed import Client

from distfact.engine.tls import security_from_dir

security = security_from_dir(sys.argv[3]) if sys.argv[3] else None
with Client(scheduler_file=sys.argv[1], timeout="30s", security=security) as client:
    client.wait_for_workers(int(sys.argv[2]), timeout=60)
    print(f"{client.scheduler.address}: {sys.argv[2]} workers; dashboard {client.dashboard_link}")
PY
echo "scheduler file: $dir/scheduler.json"

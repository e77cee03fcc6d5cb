#!/usr/bin/env bash
# Start a real Dask cluster on this machine from the Dask CLI: a scheduler and N worker processes (one thread and
# a memory limit each, with nannies), all on 127.0.0.1, the dashboard on loopback too, with cluster/dask.yaml
# (memory thresholds, timeouts). Writes DIR/scheduler.json (give it to distfact: --scheduler DIR/scheduler.json)
# and DIR/*.pid; logs in DIR/*.log. Stop it with cluster/stop-local.sh DIR.
#
#   cluster/start-local.sh [N_WORKERS=2] [MEMORY_LIMIT=2GiB] [DIR=./dask-cluster]
set -euo pipefail
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
dask scheduler --host 127.0.0.1 --port 0 --dashboard-address 127.0.0.1:0 --scheduler-file "$dir/scheduler.json" \
    > "$dir/scheduler.log" 2>&1 &
echo $! > "$dir/scheduler.pid"
for _ in $(seq 1 200); do [ -s "$dir/scheduler.json" ] && break; sleep 0.1; done
[ -s "$dir/scheduler.json" ] || { echo "the scheduler did not start; see $dir/scheduler.log" >&2; exit 1; }
for i in $(seq 1 "$workers"); do
    # one `dask worker` per process, so that each can be stopped (or killed, to test fault tolerance) alone
    dask worker --scheduler-file "$dir/scheduler.json" --name "worker-$i" --nworkers 1 --nthreads 1 \
        --memory-limit "$memory" --local-directory "$dir/worker-space" --host 127.0.0.1 \
        --dashboard-address 127.0.0.1:0 > "$dir/worker-$i.log" 2>&1 &
    echo $! > "$dir/worker-$i.pid"
done
python - "$dir/scheduler.json" "$workers" <<'PY'
import sys
from distributed import Client

with Client(scheduler_file=sys.argv[1], timeout="30s") as client:
    client.wait_for_workers(int(sys.argv[2]), timeout=60)
    print(f"{client.scheduler.address}: {sys.argv[2]} workers; dashboard {client.dashboard_link}")
PY
echo "scheduler file: $dir/scheduler.json"

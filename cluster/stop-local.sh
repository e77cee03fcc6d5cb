#!/usr/bin/env bash
# Stop a cluster started by cluster/start-local.sh: the workers first, all at once (SIGTERM, then SIGKILL to any
# still running after 10 s), then the scheduler likewise; removes the pid files and the scheduler file.
#
#   cluster/stop-local.sh [DIR=./dask-cluster]
set -uo pipefail
dir=${1:-./dask-cluster}
stop() {  # the processes of the pid files given; each worker takes 2-3 s to close, so they close side by side
    local pidfile pid alive pids=()
    for pidfile in "$@"; do
        pid=$(cat "$pidfile" 2>/dev/null) || continue
        [[ $pid =~ ^[1-9][0-9]*$ ]] || continue  # not a pid (`kill 0` would signal this script's process group)
        kill "$pid" 2>/dev/null && pids+=("$pid")
    done
    for _ in $(seq 1 100); do
        alive=0
        for pid in ${pids[@]+"${pids[@]}"}; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pid in ${pids[@]+"${pids[@]}"}; do kill -9 "$pid" 2>/dev/null; done
    rm -f "$@"
}
stop "$dir"/worker-*.pid
stop "$dir/scheduler.pid"
rm -f "$dir/scheduler.json"
echo "stopped the cluster of $dir"

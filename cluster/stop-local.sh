#!/usr/bin/env bash
# Stop a cluster started by cluster/start-local.sh: workers first (SIGTERM, then SIGKILL after 10 s), then the
# scheduler; removes the pid files and the scheduler file.
#
#   cluster/stop-local.sh [DIR=./dask-cluster]
set -uo pipefail
dir=${1:-./dask-cluster}
stop() {
    local pid
    pid=$(cat "$1" 2>/dev/null) || return 0
    if kill "$pid" 2>/dev/null; then
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -9 "$pid" 2>/dev/null
    fi
    rm -f "$1"
}
for pidfile in "$dir"/worker-*.pid; do [ -e "$pidfile" ] && stop "$pidfile"; done
stop "$dir/scheduler.pid"
rm -f "$dir/scheduler.json"
echo "stopped the cluster of $dir"

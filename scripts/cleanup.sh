#!/usr/bin/env bash
# Stop what scripts/setup.sh started, and nothing else: the private Slurm cluster (scripts/slurm.sh stop),
# the docker-registry and dockerd it started (by the pid files it wrote under /var/lib/servimg; a daemon
# the host ran before setup is not ours and keeps running).
# Installed packages, the registry's storage, the blob cache and .venv stay (`--purge-state` also removes
# /var/lib/servimg and /var/log/servimg).
set -uo pipefail
cd "$(dirname "$0")/.."
STATE=/var/lib/servimg

stop_pid() {  # name, pid file
  local pid
  [ -s "$2" ] || return 0
  pid=$(cat "$2")
  if kill -0 "$pid" 2>/dev/null; then
    echo "cleanup: stopping $1 (pid $pid)"
    kill "$pid"
    for _ in $(seq 1 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
  fi
  rm -f "$2"
}

[ -f "$STATE/slurm/slurm.conf" ] && bash scripts/slurm.sh stop
stop_pid docker-registry "$STATE/registry.pid"
stop_pid dockerd "$STATE/dockerd.pid"
if [ "${1:-}" = --purge-state ]; then
  echo "cleanup: removing $STATE and /var/log/servimg"
  rm -rf "$STATE" /var/log/servimg
fi
echo "cleanup: done"

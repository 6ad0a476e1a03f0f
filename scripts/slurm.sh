#!/usr/bin/env bash
# A single-node Slurm cluster on 127.0.0.1 for `servimg ladder --on slurm` tests (Debian slurm-wlm 22.05 +
# munge): `bash scripts/slurm.sh start|stop|status`. Idempotent. No GPU GRES (the CPU ladder needs none),
# no accounting daemon: job states and reasons come from slurmctld (`scontrol show job`), kept for an hour
# after a job ends (MinJobAge). The node's CPUs are this machine's, so several ladder chains run at once.
set -euo pipefail

STATE=/var/lib/servimg-slurm
LOGS=/var/log/servimg
CONF=/etc/slurm/slurm.conf
NODE=servimg-node
PARTITION=servimg

need_packages() {
  local need=()
  for pair in slurmctld:slurmctld slurmd:slurmd sbatch:slurm-client munged:munge; do
    command -v "${pair%%:*}" >/dev/null 2>&1 || [ -x "/usr/sbin/${pair%%:*}" ] || need+=("${pair#*:}")
  done
  if ((${#need[@]})); then
    echo "slurm: installing ${need[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  fi
}

write_conf() {
  local cpus
  cpus=$(nproc)
  mkdir -p /etc/slurm "$STATE/ctld" "$STATE/d" "$LOGS"
  cat >"$CONF.new" <<CONF
# Written by servimg scripts/slurm.sh: one node on loopback.
ClusterName=servimg
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/d
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$LOGS/slurmctld.log
SlurmdLogFile=$LOGS/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MinJobAge=3600
SlurmctldTimeout=30
SlurmdTimeout=60
KillWait=10
NodeName=$NODE NodeAddr=127.0.0.1 NodeHostname=$NODE CPUs=$cpus State=UNKNOWN
PartitionName=$PARTITION Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
CONF
  mv "$CONF.new" "$CONF"
}

start_munge() {
  if [ ! -s /etc/munge/munge.key ]; then
    mungekey --create --keyfile=/etc/munge/munge.key
  fi
  chown munge:munge /etc/munge/munge.key 2>/dev/null || true
  chmod 0400 /etc/munge/munge.key
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge 2>/dev/null || true
  if ! munge -n 2>/dev/null | unmunge >/dev/null 2>&1; then
    echo "slurm: starting munged"
    if id munge >/dev/null 2>&1; then
      runuser -u munge -- /usr/sbin/munged
    else
      /usr/sbin/munged --force
    fi
    for _ in $(seq 1 20); do munge -n 2>/dev/null | unmunge >/dev/null 2>&1 && break; sleep 0.5; done
  fi
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  need_packages
  write_conf
  start_munge
  alive "$STATE/slurmctld.pid" || { echo "slurm: starting slurmctld"; /usr/sbin/slurmctld -i; }
  alive "$STATE/slurmd.pid" || { echo "slurm: starting slurmd ($NODE)"; /usr/sbin/slurmd -N "$NODE"; }
  for _ in $(seq 1 60); do
    if sinfo -h -n "$NODE" -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
      echo "slurm: ready (partition $PARTITION, node $NODE, $(nproc) CPUs)"
      return 0
    fi
    scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
    sleep 1
  done
  echo "slurm: the node did not come up; see $LOGS/slurmctld.log and $LOGS/slurmd.log" >&2
  sinfo >&2 || true
  return 1
}

stop() {
  for pidfile in "$STATE/slurmd.pid" "$STATE/slurmctld.pid"; do
    if alive "$pidfile"; then
      kill "$(cat "$pidfile")"
      for _ in $(seq 1 20); do alive "$pidfile" || break; sleep 0.5; done
    fi
  done
  echo "slurm: stopped (munged left running: other tools may use it)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) sinfo && squeue ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

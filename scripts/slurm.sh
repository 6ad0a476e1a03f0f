#!/usr/bin/env bash
# A private single-node Slurm cluster on 127.0.0.1 for `servimg ladder --on slurm` tests (Debian slurm-wlm
# 22.05 + munge): `bash scripts/slurm.sh start|stop|status|env`. Idempotent.
#
# A guest on the host: it never writes a system file. Its configuration, munge key and socket, state,
# pid files and logs all live under one directory of its own ($SERVIMG_SLURM_DIR, default
# /var/lib/servimg/slurm: outside any home directory, because munged runs as the munge user and must
# reach its key and socket). A host's own /etc/slurm/slurm.conf and /etc/munge/munge.key are never read
# or written, and the daemons listen on ports of their own (6917/6918, not Slurm's 6817/6818), so a
# Slurm login or build node keeps its cluster. Slurm's commands reach this cluster through
# SLURM_CONF=$SERVIMG_SLURM_DIR/slurm.conf (`eval "$(bash scripts/slurm.sh env)"`; scripts/test.sh does).
#
# No GPU GRES (the CPU ladder needs none), no accounting daemon: job states and reasons come from
# slurmctld (`scontrol show job`), kept for an hour after a job ends (MinJobAge). The node's CPUs are this
# machine's, so several ladder chains run at once.
set -euo pipefail

ROOT=${SERVIMG_SLURM_DIR:-/var/lib/servimg/slurm}
CONF=$ROOT/slurm.conf
MUNGE=$ROOT/munge  # socket, pid, log and seed: 0755, every client must reach the socket
KEY=$ROOT/munge-key/munge.key  # 0700: the key stays private
SOCKET=$MUNGE/munge.socket
NODE=servimg-node
PARTITION=servimg
CTLD_PORT=${SERVIMG_SLURMCTLD_PORT:-6917}
SLURMD_PORT=${SERVIMG_SLURMD_PORT:-6918}

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
  mkdir -p "$ROOT/ctld" "$ROOT/d" "$ROOT/log"
  chmod 0755 "$ROOT"
  cat >"$CONF.new" <<CONF
# Written by servimg scripts/slurm.sh: a private one-node cluster on loopback (SLURM_CONF=$CONF).
ClusterName=servimg
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$SOCKET
CredType=cred/munge
StateSaveLocation=$ROOT/ctld
SlurmdSpoolDir=$ROOT/d
SlurmctldPidFile=$ROOT/slurmctld.pid
SlurmdPidFile=$ROOT/slurmd.pid
SlurmctldLogFile=$ROOT/log/slurmctld.log
SlurmdLogFile=$ROOT/log/slurmd.log
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
  mv "$CONF.new" "$CONF"  # our own file: the host's /etc/slurm is not touched
}

munge_ok() { munge --socket="$SOCKET" -n 2>/dev/null | unmunge --socket="$SOCKET" >/dev/null 2>&1; }

start_munge() {
  local user=munge
  id munge >/dev/null 2>&1 || user=root
  mkdir -p "$MUNGE" "$(dirname "$KEY")"
  [ -s "$KEY" ] || mungekey --create --keyfile="$KEY"
  chown -R "$user:" "$MUNGE" "$(dirname "$KEY")"
  chmod 0755 "$MUNGE"
  chmod 0700 "$(dirname "$KEY")"
  chmod 0400 "$KEY"
  munge_ok && return 0
  echo "slurm: starting a private munged ($SOCKET)"
  local args=(--socket="$SOCKET" --key-file="$KEY" --pid-file="$MUNGE/munged.pid"
    --log-file="$MUNGE/munged.log" --seed-file="$MUNGE/munged.seed")
  if [ "$user" = munge ]; then
    runuser -u munge -- /usr/sbin/munged "${args[@]}"
  else
    /usr/sbin/munged --force "${args[@]}"
  fi
  for _ in $(seq 1 20); do munge_ok && return 0; sleep 0.5; done
  echo "slurm: munged did not answer on $SOCKET; see $MUNGE/munged.log" >&2
  return 1
}

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

start() {
  need_packages
  write_conf
  start_munge
  export SLURM_CONF=$CONF
  alive "$ROOT/slurmctld.pid" || { echo "slurm: starting slurmctld"; /usr/sbin/slurmctld -i -f "$CONF"; }
  alive "$ROOT/slurmd.pid" || { echo "slurm: starting slurmd ($NODE)"; /usr/sbin/slurmd -N "$NODE" -f "$CONF"; }
  for _ in $(seq 1 60); do
    if sinfo -h -n "$NODE" -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)'; then
      echo "slurm: ready (partition $PARTITION, node $NODE, $(nproc) CPUs; SLURM_CONF=$CONF)"
      return 0
    fi
    scontrol update NodeName="$NODE" State=RESUME >/dev/null 2>&1 || true
    sleep 1
  done
  echo "slurm: the node did not come up; see $ROOT/log/slurmctld.log and $ROOT/log/slurmd.log" >&2
  sinfo >&2 || true
  return 1
}

stop() {
  for pidfile in "$ROOT/slurmd.pid" "$ROOT/slurmctld.pid" "$MUNGE/munged.pid"; do
    if alive "$pidfile"; then
      kill "$(cat "$pidfile")"
      for _ in $(seq 1 20); do alive "$pidfile" || break; sleep 0.5; done
    fi
  done
  echo "slurm: stopped (slurmd, slurmctld and the private munged of $ROOT)"
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  status) SLURM_CONF=$CONF sinfo && SLURM_CONF=$CONF squeue ;;
  env) echo "export SLURM_CONF=$CONF" ;;
  *) echo "usage: $0 start|stop|status|env" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# A real single-node Slurm cluster on localhost for the `slurm` tests (Debian's slurm-wlm + munge, run as root).
#   .ci/slurm_local.sh install   apt-get the daemons (root, Debian/Ubuntu)
#   .ci/slurm_local.sh start     munged + slurmctld + slurmd with a private config; prints `export SLURM_CONF=...`
#   .ci/slurm_local.sh stop      stop exactly the daemons this script started (by their recorded pids)
# Everything lives in $SLURM_LOCAL_DIR (default /tmp/litlab-slurm): key, sockets, state, logs, pid files.
# Nothing system-wide is changed (the system munge key and /etc/slurm are left alone); ports 16817/16818.
set -euo pipefail
DIR=${SLURM_LOCAL_DIR:-/tmp/litlab-slurm}
CONF=$DIR/slurm.conf

die() { echo "slurm_local: $*" >&2; exit 3; }

install() {
  [ "$(id -u)" = 0 ] || die "install needs root"
  command -v apt-get >/dev/null || die "no apt-get: install slurmctld slurmd slurm-client munge yourself"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge
}

start() {
  [ "$(id -u)" = 0 ] || die "start needs root (munged runs as the munge user, slurmd as root)"
  for c in munged slurmctld slurmd sinfo sbatch srun scontrol runuser; do
    command -v "$c" >/dev/null || die "$c not found (run: $0 install)"
  done
  id munge >/dev/null 2>&1 || die "no munge user (is the munge package installed?)"
  if [ -f "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; then
    echo "export SLURM_CONF=$CONF"; return 0   # already running
  fi
  rm -rf "$DIR"; mkdir -p "$DIR"/{state,spool,log} "$DIR/munge"
  chmod 0755 "$DIR" "$DIR/munge"
  head -c 128 /dev/urandom > "$DIR/munge/munge.key"
  chown -R munge: "$DIR/munge"; chmod 0400 "$DIR/munge/munge.key"
  local sock=$DIR/munge/munge.socket.2
  runuser -u munge -- munged --socket="$sock" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/munge/munged.log" --seed-file="$DIR/munge/munged.seed"
  for _ in $(seq 50); do [ -s "$DIR/munge/munged.pid" ] && break; sleep 0.1; done
  cp "$DIR/munge/munged.pid" "$DIR/munged.pid"
  local host mem
  host=$(hostname -s)
  mem=$(awk '/MemTotal/ {print int($2 / 1024 * 0.8)}' /proc/meminfo)
  cat > "$CONF" <<EOF
ClusterName=litlab
SlurmctldHost=$host
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
# cred_expire: a requeued job may restart after 10 s instead of 120 s
AuthInfo=socket=$sock,cred_expire=10
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.daemon.pid
SlurmdPidFile=$DIR/slurmd.daemon.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
JobRequeue=1
KillWait=10
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem State=UNKNOWN
PartitionName=debug Nodes=$host Default=YES MaxTime=INFINITE State=UP
EOF
  SLURM_CONF=$CONF slurmctld -D -c -f "$CONF" > "$DIR/log/slurmctld.out" 2>&1 &
  echo $! > "$DIR/slurmctld.pid"
  SLURM_CONF=$CONF slurmd -D -f "$CONF" > "$DIR/log/slurmd.out" 2>&1 &
  echo $! > "$DIR/slurmd.pid"
  for _ in $(seq 60); do
    if SLURM_CONF=$CONF sinfo -h -o %t 2>/dev/null | grep -qx idle; then
      echo "export SLURM_CONF=$CONF"; return 0
    fi
    sleep 0.5
  done
  echo "slurm_local: the node did not become idle; logs in $DIR/log" >&2
  tail -5 "$DIR"/log/*.log >&2 || true
  stop; exit 3
}

stop() {
  local pids=()
  for name in slurmd slurmctld munged; do
    local f=$DIR/$name.pid
    [ -f "$f" ] || continue
    local pid; pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then kill "$pid" 2>/dev/null || true; pids+=("$pid"); fi
    rm -f "$f"
  done
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  echo "slurm_local: stopped ${#pids[@]} daemon(s)"
}

case "${1:-}" in
  install) install ;;
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 install|start|stop" >&2; exit 2 ;;
esac

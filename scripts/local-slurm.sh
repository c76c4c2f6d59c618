#!/usr/bin/env bash
# A real Slurm cluster on this machine: munge, MariaDB + slurmdbd (sacct works), slurmctld and two
# slurmd "nodes" (node1, node2) on localhost. No systemd: every daemon is started by hand and stopped
# by its PID file. All state lives under $PRIMUS_SLURM_STATE (default /var/tmp/primus-local-slurm).
#
#   scripts/local-slurm.sh up       install (apt) if needed, write configs, start what is not running
#   scripts/local-slurm.sh down     stop every daemon this script started (PID files only)
#   scripts/local-slurm.sh status   print each daemon and the nodes; exit 0 only when all are up
#
# Knobs: PRIMUS_SLURM_CPUS (CPUs per node, default: cores of this machine),
#        PRIMUS_SLURM_ACCOUNTING=0 (no MariaDB/slurmdbd; status falls back to squeue).
set -euo pipefail

STATE=${PRIMUS_SLURM_STATE:-/var/tmp/primus-local-slurm}
CPUS=${PRIMUS_SLURM_CPUS:-$(nproc)}
ACCOUNTING=${PRIMUS_SLURM_ACCOUNTING:-1}
NODES=(node1 node2)
CONF_DIR=/etc/slurm
MARK="# managed by primus-slurm scripts/local-slurm.sh"
RUN=$STATE/run
LOG=$STATE/log
DB_SOCK=/run/mysqld/mysqld.sock   # slurmdbd's client library only knows the default socket
PACKAGES=(munge slurmctld slurmd slurm-client)
[ "$ACCOUNTING" = 1 ] && PACKAGES+=(slurmdbd mariadb-server)

say() { echo "local-slurm: $*" >&2; }
die() { say "error: $*"; exit 2; }

# pid_alive, wait_for, stop_pidfile, slurm_conf_common, slurmdbd_conf_common
. "$(dirname "$(readlink -f "$0")")/slurm-common.sh"

install_packages() {
  local missing=()
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  command -v apt-get >/dev/null || die "apt-get not found; install ${missing[*]} by hand"
  say "installing ${missing[*]}"
  apt-get update -q >"$LOG/apt.log" 2>&1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" \
    >>"$LOG/apt.log" 2>&1 || die "apt-get install failed, see $LOG/apt.log"
}

ensure_hosts() {  # node names must resolve (torchrun rendezvous on the first node's name)
  local n
  for n in "${NODES[@]}"; do
    getent hosts "$n" >/dev/null || echo "127.0.0.1 $n" >>/etc/hosts
  done
}

write_if_changed() {  # write_if_changed PATH MODE < content
  local tmp; tmp=$(mktemp)
  cat >"$tmp"
  if [ -f "$1" ] && cmp -s "$tmp" "$1"; then rm -f "$tmp"; else mv "$tmp" "$1"; fi
  chmod "$2" "$1"
}

write_configs() {
  mkdir -p "$CONF_DIR"
  if [ -f "$CONF_DIR/slurm.conf" ] && ! grep -qF "$MARK" "$CONF_DIR/slurm.conf"; then
    die "$CONF_DIR/slurm.conf exists and is not ours; refusing to overwrite it"
  fi
  local mem host acct before
  before=$(cat "$CONF_DIR/slurm.conf" 2>/dev/null || true)
  mem=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
  host=$(hostname -s)
  if [ "$ACCOUNTING" = 1 ]; then
    acct="AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost"
  else
    acct="AccountingStorageType=accounting_storage/none"
  fi
  write_if_changed "$CONF_DIR/slurm.conf" 0644 <<EOF
$MARK
ClusterName=primus-local
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
AuthType=auth/munge
$(slurm_conf_common)
$acct
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
StateSaveLocation=$STATE/slurmctld
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdSpoolDir=$STATE/slurmd/%n
SlurmdPidFile=$RUN/slurmd-%n.pid
SlurmdLogFile=$LOG/slurmd-%n.log
NodeName=node[1-2] NodeHostname=$host NodeAddr=127.0.0.1 Port=[6831-6832] CPUs=$CPUS RealMemory=$mem
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  [ "$before" = "$(cat "$CONF_DIR/slurm.conf")" ] || CONF_CHANGED=1
  if [ "$ACCOUNTING" = 1 ]; then
    write_if_changed "$CONF_DIR/slurmdbd.conf" 0600 <<EOF
$MARK
AuthType=auth/munge
DbdHost=localhost
SlurmUser=root
$(slurmdbd_conf_common)
StorageUser=slurm
StoragePass=primus-local
EOF
    chown root:root "$CONF_DIR/slurmdbd.conf"
  fi
}

start_munge() {
  pid_alive "$RUN/munged.pid" && return 0
  mkdir -p /run/munge "$STATE/munge"
  chown munge:munge /run/munge "$STATE/munge"; chmod 0755 /run/munge; chmod 0700 "$STATE/munge"
  [ -f /etc/munge/munge.key ] || die "/etc/munge/munge.key missing (reinstall the munge package)"
  rm -f "$STATE/munge/munged.pid"
  runuser -u munge -- /usr/sbin/munged --pid-file="$STATE/munge/munged.pid" \
    --log-file="$STATE/munge/munged.log" --seed-file="$STATE/munge/munged.seed"
  wait_for 10 munged test -s "$STATE/munge/munged.pid"
  cp "$STATE/munge/munged.pid" "$RUN/munged.pid"
  wait_for 10 munge sh -c 'munge -n | unmunge'
}

start_mariadb() {
  pid_alive "$RUN/mysqld.pid" && return 0
  mkdir -p /run/mysqld "$STATE/mysql" "$STATE/mysqld"   # mysqld/: pid + log, writable by mysql
  chown mysql:mysql /run/mysqld "$STATE/mysql" "$STATE/mysqld"
  if [ ! -d "$STATE/mysql/mysql" ]; then
    mariadb-install-db --user=mysql --datadir="$STATE/mysql" --skip-test-db \
      --auth-root-authentication-method=socket >"$LOG/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed, see $LOG/mariadb-install.log"
  fi
  mariadbd --no-defaults --user=mysql --datadir="$STATE/mysql" --socket="$DB_SOCK" \
    --pid-file="$STATE/mysqld/mysqld.pid" --skip-networking --log-error="$STATE/mysqld/mysqld.log" \
    --innodb-buffer-pool-size=64M >/dev/null 2>&1 &
  wait_for 30 mariadb mariadb-admin --socket="$DB_SOCK" ping
  wait_for 10 "mariadb pid file" test -s "$STATE/mysqld/mysqld.pid"
  cp "$STATE/mysqld/mysqld.pid" "$RUN/mysqld.pid"
  mariadb --socket="$DB_SOCK" -u root <<'SQL'
CREATE DATABASE IF NOT EXISTS slurm_acct_db;
CREATE USER IF NOT EXISTS 'slurm'@'localhost' IDENTIFIED BY 'primus-local';
GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';
FLUSH PRIVILEGES;
SQL
}

start_slurmdbd() {
  pid_alive "$RUN/slurmdbd.pid" && return 0
  /usr/sbin/slurmdbd
  wait_for 30 slurmdbd sacctmgr -i -n list cluster
}

start_slurmctld() {
  pid_alive "$RUN/slurmctld.pid" && return 0
  mkdir -p "$STATE/slurmctld"
  /usr/sbin/slurmctld
  wait_for 30 slurmctld scontrol ping
}

start_slurmd() {
  local n=$1
  pid_alive "$RUN/slurmd-$n.pid" && return 0
  mkdir -p "$STATE/slurmd/$n"
  /usr/sbin/slurmd -N "$n"
  wait_for 30 "slurmd $n" sh -c "sinfo -h -n $n -o %T | grep -qvE 'down|unknown|not_responding'"
}

up() {
  [ "$(id -u)" = 0 ] || die "must run as root (it installs packages and starts daemons)"
  mkdir -p "$STATE" "$RUN" "$LOG"; chmod 0755 "$STATE"
  install_packages
  ensure_hosts
  CONF_CHANGED=0
  write_configs
  if [ "$CONF_CHANGED" = 1 ] && pid_alive "$RUN/slurmctld.pid"; then  # running daemons keep their old config
    say "slurm.conf changed: restarting slurmctld and slurmd (running jobs keep running)"
    for n in "${NODES[@]}"; do stop_pidfile "slurmd $n" "$RUN/slurmd-$n.pid"; done
    stop_pidfile slurmctld "$RUN/slurmctld.pid"
  fi
  start_munge
  if [ "$ACCOUNTING" = 1 ]; then start_mariadb; start_slurmdbd; fi
  start_slurmctld
  local n
  for n in "${NODES[@]}"; do start_slurmd "$n"; done
  # a node left DOWN/DRAIN by an earlier run comes back
  scontrol update nodename=node[1-2] state=resume >/dev/null 2>&1 || true
  say "up (state $STATE)"
}

down() {
  local n
  for n in "${NODES[@]}"; do stop_pidfile "slurmd $n" "$RUN/slurmd-$n.pid"; done
  stop_pidfile slurmctld "$RUN/slurmctld.pid"
  stop_pidfile slurmdbd "$RUN/slurmdbd.pid"
  stop_pidfile mariadb "$RUN/mysqld.pid"
  stop_pidfile munged "$RUN/munged.pid"
  say "down"
}

status() {
  local ok=0 name
  local daemons=(munged slurmctld slurmd-node1 slurmd-node2)
  [ "$ACCOUNTING" = 1 ] && daemons+=(mysqld slurmdbd)
  for name in "${daemons[@]}"; do
    if pid_alive "$RUN/$name.pid"; then
      echo "$name: running (pid $(cat "$RUN/$name.pid"))"
    else
      echo "$name: stopped"; ok=1
    fi
  done
  [ $ok = 0 ] && sinfo -N -o "%N %T %c" 2>/dev/null || true
  return $ok
}

case "${1:-}" in
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac

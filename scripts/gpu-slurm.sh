#!/usr/bin/env bash
# A real Slurm cluster of ONE node with gres/gpu on the GPU machine, which has no Slurm, no network and an OS that
# is not Debian: slurmctld + slurmd + slurmdbd (over a private MariaDB, so that sacct answers with AllocTRES, as on
# a real cluster) from Debian 12's packages (Slurm 22.05.8), staged here and unpacked there with `dpkg -x` into a
# private prefix. Nothing is written outside $STATE (no package into /, no /etc, no /run), but for a loopback alias
# where the machine has no IPv4 address except 127.0.0.1 (loopback_alias).
#
#   bash scripts/gpu-slurm.sh stage    here (apt reachable): the debs into the git-ignored $KIT (18.3 MB)
#   bash scripts/gpu-slurm.sh up       there, as root (send $KIT along): unpack, write the configs, start the
#                                      daemons (they daemonize: they outlive the call), wait for the node to be idle,
#                                      print the lines a later command sources (also kept as $STATE/env.sh)
#   bash scripts/gpu-slurm.sh down     stop the daemons this script started (their PID files only)
#   bash scripts/gpu-slurm.sh status   each daemon, then sinfo; exit 0 only when all run
#   bash scripts/gpu-slurm.sh prove    here: `up`, a --gres=gpu:1 `sbatch --wrap hostname`, sacct, `down`, all in the
#                                      project's Debian 12 image (scripts/container-image.sh) with --network none
#
# Auth is auth/none + cred/none (Slurm 22.05 ships both): no munged, no key, no munge user. Only the libraries the
# machine lacks (by soname, `ldconfig -p`) go on LD_LIBRARY_PATH, so a job's own programs (torch) keep the
# system's. Its ports (3 from $PORT) and $STATE are not the local test cluster's (scripts/local-slurm.sh).
# Knobs: PRIMUS_GPU_SLURM_STATE (/var/tmp/primus-gpu-slurm), PRIMUS_GPU_SLURM_KIT (.gpu/slurm),
#        PRIMUS_GPU_SLURM_PORT (7817), PRIMUS_GPU_SLURM_GPUS (the GPU count; default: nvidia-smi -L, else torch).
#        PYTHON (python3): the interpreter of the loopback alias and of the torch GPU count.
set -euo pipefail
cd "$(dirname "$(readlink -f "$0")")/.."
KIT=$(readlink -m "${PRIMUS_GPU_SLURM_KIT:-.gpu/slurm}")
STATE=${PRIMUS_GPU_SLURM_STATE:-/var/tmp/primus-gpu-slurm}
PORT=${PRIMUS_GPU_SLURM_PORT:-7817}
P=$STATE/root                                   # the unpacked debs
SLURMLIB=$P/usr/lib/x86_64-linux-gnu/slurm-wlm  # libslurmfull.so and the plugins (the binaries' RUNPATH is /usr)
LIB=$STATE/lib                                  # links to the packaged libraries this machine lacks
BIN=$STATE/bin                                  # links to the Slurm commands: the PATH entry
ETC=$STATE/etc RUN=$STATE/run LOG=$STATE/log
DB_SOCK=$RUN/mysqld.sock
# Slurm 22.05.8 (Debian 12) and what it needs; then MariaDB 10.11 for slurmdbd (mariadb-install-db needs the
# client-core's my_print_defaults); then every shared library of these that is not glibc, from `dpkg -s` Depends
# and `ldd`, so that a bare image lacking any of them still runs (only those it lacks are used).
DEBS=(slurmctld slurmd slurm-client slurmdbd slurm-wlm-basic-plugins slurm-wlm-mysql-plugin
  mariadb-server-core mariadb-client-core libmariadb3
  libhwloc15 libjson-c5 liblua5.1-0 liblz4-1 libnuma1 libyaml-0-2 libdbus-1-3 libreadline8 libtinfo6 libncurses6
  libpam0g libaudit1 libcap-ng0 libcap2 libudev1 libsystemd0 libgcrypt20 libgpg-error0 liblzma5 libzstd1
  libaio1 liburing2 libpcre2-8-0 libssl3 libcrypt1 zlib1g libedit2 libbsd0 libmd0 libstdc++6 libgcc-s1)
PY=${PYTHON:-python3}                           # the loopback alias and the torch GPU count (no nvidia-smi)
CLIENTS=(sbatch squeue sacct scontrol scancel srun sinfo salloc sacctmgr sstat)

say() { echo "gpu-slurm: $*" >&2; }
die() {  # the daemons' last log lines too: on the device a failed call costs minutes, its output is all there is
  say "error: $*"
  local f
  for f in "$LOG"/{mariadb-install,mysqld,slurmdbd,slurmctld,slurmd}.log; do
    [ -s "$f" ] && { echo "== $f" >&2; tail -n 5 "$f" >&2; }
  done
  exit 2
}
# pid_alive, wait_for, stop_pidfile, slurm{,dbd}_conf_common (the lines the local test cluster has too)
. scripts/slurm-common.sh

stage() {
  grep -q '^VERSION_CODENAME=bookworm' /etc/os-release || die "stage on Debian 12: the kit is bookworm's packages"
  mkdir -p "$KIT"
  rm -f "$KIT"/*.deb
  (cd "$KIT" && apt-get download "${DEBS[@]}") >"$KIT/download.log" 2>&1 \
    || die "apt-get download failed (apt-get update first?), see $KIT/download.log"
  rm -f "$KIT/download.log"
  say "staged $(ls "$KIT"/*.deb | wc -l) debs, $(du -cb "$KIT"/*.deb | tail -1 | cut -f1) bytes \
($(du -csh "$KIT"/*.deb | tail -1 | cut -f1)) in $KIT"
}

unpack() {  # every deb into $P, again whenever the kit changed
  local debs stamp
  debs=$(ls "$KIT"/*.deb 2>/dev/null) || die "no debs in $KIT (run 'bash scripts/gpu-slurm.sh stage' here, send $KIT)"
  command -v dpkg-deb >/dev/null || die "dpkg-deb not found (the kit is .deb files)"
  stamp=$(cat $debs | cksum)
  [ -f "$STATE/unpacked" ] && [ "$(cat "$STATE/unpacked")" = "$stamp" ] && return 0
  rm -rf "$P" && mkdir -p "$P"
  for d in $debs; do dpkg-deb -x "$d" "$P"; done
  echo "$stamp" >"$STATE/unpacked"
}

link_libs() {  # $LIB: the packaged libraries whose names this machine's loader does not know
  local have f used=()
  have=$(ldconfig -p 2>/dev/null | awk 'NR > 1 {print $1}' | sort -u)
  # without the loader's list every packaged library (Debian 12's libstdc++, libssl ...) would go first on the
  # LD_LIBRARY_PATH that the suite and its jobs inherit: stop instead
  [ -n "$have" ] || die "ldconfig -p lists no libraries here: cannot tell which packaged libraries are missing"
  rm -rf "$LIB" "$BIN" "$STATE/sbin" && mkdir -p "$LIB" "$BIN"
  for f in "$P"/lib/x86_64-linux-gnu/*.so.* "$P"/usr/lib/x86_64-linux-gnu/*.so.*; do
    [ -e "$f" ] || continue
    grep -qxF "${f##*/}" <<<"$have" && continue
    ln -sf "$f" "$LIB/${f##*/}"
    [[ $f =~ \.so\.[0-9]+$ ]] && used+=("${f##*/}")
  done
  say "packaged libraries used (missing here): ${used[*]:-none}"
  for f in "${CLIENTS[@]}"; do ln -sf "$P/usr/bin/$f" "$BIN/$f"; done
  # Debian names the daemons slurmctld-wlm etc. (its alternatives link the plain names), but Slurm tells which daemon
  # it runs in by its program name: slurmctld-wlm called so crashes at its first accounting message
  mkdir -p "$STATE/sbin"
  for f in slurmctld slurmd slurmstepd; do ln -sfn "$P/usr/sbin/$f-wlm" "$STATE/sbin/$f"; done
  export LD_LIBRARY_PATH="$LIB:$SLURMLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  command -v ldd >/dev/null || return 0
  local missing
  missing=$(for f in "$P"/usr/sbin/{slurmctld-wlm,slurmd-wlm,slurmstepd-wlm,slurmdbd,mariadbd} "$P/usr/bin/sbatch" \
      "$SLURMLIB"/{accounting_storage_mysql,select_cons_tres,gres_gpu,auth_none,cred_none,jobcomp_filetxt}.so; do
    [ -e "$f" ] || { echo "${f##*/}: not in the kit"; continue; }
    ldd "$f" 2>&1 | sed -n "s|^\s*\(\S*\) => not found|${f##*/}: \1|p"; done | sort -u)
  [ -z "$missing" ] || die "libraries not found: $missing"
}

loopback_alias() {  # add|del|check: glibc's AI_ADDRCONFIG, which Slurm's getaddrinfo() asks for, finds no IPv4
  # address on a machine that has only 127.0.0.1, and every daemon then fails to bind; a second loopback address
  # (127.0.0.2 on lo:primus) is enough. Python's ioctl, as a bare image may have no `ip`.
  "$PY" - "$1" "$PORT" <<'PY'
import fcntl, socket, struct, sys
what, port = sys.argv[1], int(sys.argv[2])
if what == "check":
    try:
        socket.getaddrinfo(None, port, socket.AF_INET, socket.SOCK_STREAM, 0, socket.AI_ADDRCONFIG | socket.AI_PASSIVE)
    except socket.gaierror:
        sys.exit(1)
    sys.exit(0)
s, name = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), b"lo:primus"
if what == "add":  # SIOCSIFADDR
    fcntl.ioctl(s, 0x8916, struct.pack("16sH2s4s8s", name, socket.AF_INET, b"", socket.inet_aton("127.0.0.2"), b""))
else:  # SIOCGIFFLAGS, then SIOCSIFFLAGS without IFF_UP: the alias and its address go
    flags = struct.unpack("16sH", fcntl.ioctl(s, 0x8913, struct.pack("16sH14s", name, 0, b""))[:18])[1]
    fcntl.ioctl(s, 0x8914, struct.pack("16sH14s", name, flags & ~1, b""))
PY
}

gpu_count() {
  if [ -n "${PRIMUS_GPU_SLURM_GPUS:-}" ]; then echo "$PRIMUS_GPU_SLURM_GPUS"; return; fi
  if command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
    nvidia-smi -L | grep -c '^GPU ' || true; return
  fi
  "$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0
}

node_name() {  # the job script's rendezvous address is the first node's name: it must resolve
  local h; h=$(hostname -s 2>/dev/null || hostname)
  if getent hosts "$h" >/dev/null 2>&1; then echo "$h"; return; fi
  say "'$h' does not resolve: node named localhost"
  echo localhost
}

write_configs() {
  local node=$1 gpus=$2 mem gres="" i f
  mem=$(awk '/MemTotal/ {print int($2 / 1024)}' /proc/meminfo)
  mkdir -p "$ETC" "$STATE/ctld" "$STATE/spool" "$STATE/db"
  [ "$gpus" -gt 0 ] && gres=" Gres=gpu:$gpus"
  cat >"$ETC/slurm.conf" <<EOF
# written by scripts/gpu-slurm.sh: one node, $gpus GPU(s)
ClusterName=primus-gpu
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
SlurmUser=root
AuthType=auth/none
CredType=cred/none
PluginDir=$SLURMLIB
$(slurm_conf_common)
GresTypes=gpu
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort=$((PORT + 2))
AccountingStorageTRES=gres/gpu
JobCompType=jobcomp/filetxt
JobCompLoc=$STATE/jobcomp.txt
StateSaveLocation=$STATE/ctld
SlurmctldPidFile=$RUN/slurmctld.pid
SlurmctldLogFile=$LOG/slurmctld.log
SlurmdSpoolDir=$STATE/spool
SlurmdPidFile=$RUN/slurmd.pid
SlurmdLogFile=$LOG/slurmd.log
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc) RealMemory=$mem$gres
PartitionName=gpu Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
  # gres/gpu counts only GPUs with a File (slurmd drops "file-less" ones); where /dev/nvidiaK is absent (a forced
  # PRIMUS_GPU_SLURM_GPUS on a machine without GPUs, to prove the accounting) a placeholder device node stands in
  # (never opened; Slurm sets CUDA_VISIBLE_DEVICES only for character devices; a plain file where mknod is refused)
  { echo "AutoDetect=off"
    for ((i = 0; i < gpus; i++)); do
      f=/dev/nvidia$i
      if [ ! -e "$f" ]; then
        mkdir -p "$STATE/dev"; f=$STATE/dev/nvidia$i
        [ -e "$f" ] || mknod "$f" c 195 "$i" 2>/dev/null || : >"$f"
      fi
      echo "NodeName=$node Name=gpu File=$f"
    done; } >"$ETC/gres.conf"
  # no cgroup is used (proctrack/linuxproc, task/none, jobacct_gather/linux), yet slurmd loads a cgroup plugin
  # (cgroup/v1 here, v2 on the H200 machine): it must not ask systemd, which the device has not
  printf 'CgroupPlugin=autodetect\nIgnoreSystemd=yes\n' >"$ETC/cgroup.conf"
  (umask 077; cat >"$ETC/slurmdbd.conf" <<EOF
AuthType=auth/none
DbdHost=localhost
DbdPort=$((PORT + 2))
SlurmUser=root
PluginDir=$SLURMLIB
$(slurmdbd_conf_common)
StorageUser=root
EOF
  )
}

start_mariadb() {  # root over its own unix socket (unix_socket auth): no password, no TCP
  pid_alive "$RUN/mysqld.pid" && return 0
  local base=$P/usr
  if [ ! -d "$STATE/db/mysql" ]; then
    "$base/bin/mariadb-install-db" --no-defaults --basedir="$base" --datadir="$STATE/db" --user=root \
      --skip-test-db --skip-name-resolve --force --auth-root-authentication-method=socket \
      >"$LOG/mariadb-install.log" 2>&1 \
      || die "mariadb-install-db failed, see $LOG/mariadb-install.log"
  fi
  setsid "$base/sbin/mariadbd" --no-defaults --user=root --basedir="$base" --datadir="$STATE/db" \
    --lc-messages-dir="$base/share/mysql" --plugin-dir="$base/lib/mysql/plugin" --socket="$DB_SOCK" \
    --pid-file="$RUN/mysqld.pid" --skip-networking --log-error="$LOG/mysqld.log" --innodb-buffer-pool-size=64M \
    </dev/null >/dev/null 2>&1 &
  wait_for 60 mariadb test -S "$DB_SOCK"
  wait_for 10 "mariadb pid file" test -s "$RUN/mysqld.pid"
}

up() {
  [ "$(id -u)" = 0 ] || die "run as root"
  mkdir -p "$STATE" "$RUN" "$LOG"
  if ! loopback_alias check; then
    loopback_alias add || die "no IPv4 address but 127.0.0.1, and 127.0.0.2 could not be added to lo"
    touch "$RUN/lo-alias"
    say "only 127.0.0.1 here: added 127.0.0.2 (lo:primus) so that the daemons can bind"
  fi
  local node gpus
  node=$(node_name)
  gpus=$(gpu_count)
  local name running=
  for name in mysqld slurmdbd slurmctld slurmd; do pid_alive "$RUN/$name.pid" && running=1; done
  if [ -n "$running" ]; then  # any daemon still running keeps its libraries and configs as they are
    say "already running (down first to reconfigure)"
    export LD_LIBRARY_PATH="$LIB:$SLURMLIB${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    unpack
    link_libs
    write_configs "$node" "$gpus"
  fi
  export SLURM_CONF=$ETC/slurm.conf MYSQL_UNIX_PORT=$DB_SOCK PATH="$BIN:$PATH"
  start_mariadb
  pid_alive "$RUN/slurmdbd.pid" || "$P/usr/sbin/slurmdbd" || die "slurmdbd did not start"
  wait_for 60 slurmdbd sacctmgr -i -n list cluster
  pid_alive "$RUN/slurmctld.pid" || "$STATE/sbin/slurmctld" || die "slurmctld did not start"
  wait_for 30 slurmctld scontrol ping
  # cgroup/v2 with IgnoreSystemd makes its slurmstepd scope with a plain mkdir under system.slice, which a machine
  # without systemd lacks (the H200 machine, 2026-12-05: "Could not create scope directory
  # /sys/fs/cgroup/system.slice/vm_slurmstepd.scope", slurmd initialization failed): make the slice, once
  if [ -f /sys/fs/cgroup/cgroup.controllers ] && [ ! -d /sys/fs/cgroup/system.slice ]; then
    if mkdir /sys/fs/cgroup/system.slice 2>/dev/null; then
      touch "$RUN/made-system-slice"
      say "made /sys/fs/cgroup/system.slice (no systemd here) for slurmd's cgroup/v2 plugin"
    else
      say "cgroup v2 without /sys/fs/cgroup/system.slice, and it cannot be made: slurmd may not start"
    fi
  fi
  pid_alive "$RUN/slurmd.pid" || "$STATE/sbin/slurmd" -N "$node" -d "$STATE/sbin/slurmstepd" \
    || die "slurmd did not start"
  wait_for 60 "slurmd $node" sh -c "sinfo -h -n $node -o %T | grep -qxE 'idle|mixed|allocated'"
  cat >"$STATE/env.sh" <<EOF
export PATH="$BIN:\$PATH"
export LD_LIBRARY_PATH="$LIB:$SLURMLIB\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export SLURM_CONF="$ETC/slurm.conf"
EOF
  say "up: node $node, $gpus GPU(s) as gres/gpu, state $STATE; a later command sources $STATE/env.sh:"
  cat "$STATE/env.sh"
}

down() {
  stop_pidfile slurmd "$RUN/slurmd.pid"
  stop_pidfile slurmctld "$RUN/slurmctld.pid"
  stop_pidfile slurmdbd "$RUN/slurmdbd.pid"
  stop_pidfile mariadbd "$RUN/mysqld.pid"
  if [ -f "$RUN/made-system-slice" ]; then  # slurmd's scope holds child cgroups (system/, job_*): deepest first;
    # rmdir leaves a cgroup that still has processes, and then the marker stays for the next down
    find /sys/fs/cgroup/system.slice -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ -d /sys/fs/cgroup/system.slice ] || rm -f "$RUN/made-system-slice"
  fi
  if [ -f "$RUN/lo-alias" ]; then loopback_alias del && rm -f "$RUN/lo-alias"; fi
  say "down"
}

status() {
  local ok=0 name
  for name in mysqld slurmdbd slurmctld slurmd; do
    if pid_alive "$RUN/$name.pid"; then echo "$name: running (pid $(cat "$RUN/$name.pid"))"
    else echo "$name: stopped"; ok=1; fi
  done
  if [ $ok = 0 ]; then (. "$STATE/env.sh" && sinfo -N -o "%N %T %c %G"); fi
  return $ok
}

prove() {  # here: the kit in the project's Debian 12 image (no Slurm in it), no network, one placeholder GPU
  local image=${1:-$(bash scripts/container-image.sh tag)}
  podman image exists "$image" || die "no image $image (bash scripts/container-image.sh builds it)"
  ls "$KIT"/*.deb >/dev/null 2>&1 || die "no debs in $KIT: stage first"
  podman run --rm --network none --cap-add NET_ADMIN --cap-add MKNOD -v "$PWD:/src:ro" -v "$KIT:/kit:ro" \
    -e PRIMUS_GPU_SLURM_KIT=/kit -e PRIMUS_GPU_SLURM_GPUS=1 "$image" bash -euo pipefail -c '
    cd /src
    if command -v sbatch slurmd; then echo "the image has a Slurm of its own"; exit 3; fi
    start=$SECONDS; bash scripts/gpu-slurm.sh up; echo "up in $((SECONDS - start)) s"
    . /var/tmp/primus-gpu-slurm/env.sh
    echo "sbatch: $(command -v sbatch)"; sinfo -N -o "%N %T %c %G"
    id=$(sbatch --parsable --gres=gpu:1 -o /tmp/%j.out \
      --wrap "hostname; echo CUDA_VISIBLE_DEVICES=\$CUDA_VISIBLE_DEVICES")
    for _ in $(seq 120); do [ "$(sacct -n -X -P -j "$id" -o State)" = COMPLETED ] && break; sleep 0.5; done
    sacct -X -P -j "$id" -o JobID,State,ExitCode,AllocTRES; cat "/tmp/$id.out"
    state=$(sacct -n -X -P -j "$id" -o State)
    bash scripts/gpu-slurm.sh down
    [ "$state" = COMPLETED ]'
}

case "${1:-}" in
  stage) stage ;;
  prove) shift; prove "$@" ;;
  up) up ;;
  down) down ;;
  status) status ;;
  *) echo "usage: $0 stage|up|down|status|prove [IMAGE]" >&2; exit 2 ;;
esac

# Sourced by scripts/local-slurm.sh and scripts/gpu-slurm.sh: daemons started by hand, waited for, and stopped by
# their PID files only (never by name); the slurm.conf lines both clusters share. The sourcing script defines say()
# and die().

pid_alive() {  # pid_alive PIDFILE -> 0 when the pid in the file is a live process
  [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null
}

wait_for() {  # wait_for SECONDS DESCRIPTION CMD...
  local secs=$1 what=$2; shift 2
  local end=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    [ $SECONDS -ge $end ] && die "$what did not come up within ${secs}s (logs under $LOG)"
    sleep 0.2
  done
}

stop_pidfile() {  # stop_pidfile NAME PIDFILE: TERM, up to 10 s, then KILL
  local pidfile=$2 pid i
  pid_alive "$pidfile" || { rm -f "$pidfile"; return 0; }
  pid=$(cat "$pidfile")
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2>/dev/null; then say "$1 ($pid) ignored TERM; killing"; kill -KILL "$pid" 2>/dev/null || true; fi
  rm -f "$pidfile"
}

slurm_conf_common() {  # the slurm.conf lines that make a cluster on one host work (no cgroups, no systemd)
  cat <<'CONF'
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/linux
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
SchedulerParameters=batch_sched_delay=0
MailProg=/bin/true
ReturnToService=2
CONF
}

slurmdbd_conf_common() {  # slurmdbd.conf: its files under $RUN and $LOG, the accounting database on this host
  cat <<CONF
PidFile=$RUN/slurmdbd.pid
LogFile=$LOG/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageLoc=slurm_acct_db
CONF
}

#!/usr/bin/env bash
# A Slurm controller without compute nodes that copies one site's documented layout, for `sbatch --test-only`.
#   site-ctld.sh start --layout FILE [--dir DIR] [--port PORT]   start (a running one is replaced); prints slurm.conf
#   site-ctld.sh stop [--dir DIR]                                stop it
# FILE (tests/site-layouts/<site>.conf) holds slurm.conf lines: NodeName lines (State=CLOUD: no slurmd ever
# runs, the controller still schedules on them), PartitionName lines with the site's MaxNodes/MaxTime, and
# `#policy KIND NAME MIN_NODES MAX_NODES MAX_MINUTES` (and `#policy default_qos NAME`) lines for limits a site enforces beyond its partitions
# (QOS, size bins of one partition): a job whose partition (KIND=partition) or QOS (KIND=qos) has policy rows
# must fall into one row's node range and time, which scripts/site-ctld-policy.lua checks as the site's
# job_submit plugin would. A QOS without a row is refused where the layout names any QOS (no slurmdbd here).
# No munge (auth/none), no accounting; the controller listens on localhost:PORT (default 6917), so it runs
# beside scripts/slurm-cluster.sh's. All state lives under DIR (default /tmp/dlaunch-site-ctld).
set -euo pipefail

readonly START_TIMEOUT_S=30 CLIENT_TIMEOUT_S=10
die() { echo "site-ctld.sh: $*" >&2; exit 2; }
usage() { sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

parse_args() {
  LAYOUT= DIR=/tmp/dlaunch-site-ctld PORT=6917
  while [ $# -gt 0 ]; do
    case "$1" in
      --layout) [ $# -ge 2 ] || die "--layout needs a file"; LAYOUT=$2; shift 2 ;;
      --dir) [ $# -ge 2 ] || die "--dir needs a value"; DIR=$2; shift 2 ;;
      --port) [ $# -ge 2 ] || die "--port needs a value"; PORT=$2; shift 2 ;;
      *) die "unknown argument '$1' (see --help)" ;;
    esac
  done
  [[ "$DIR" =~ ^/[A-Za-z0-9._/-]+$ ]] || die "--dir must be an absolute path of [A-Za-z0-9._/-], got '$DIR'"
  [[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -ge 1024 ] && [ "$PORT" -le 65535 ] || die "--port must be 1024..65535, got '$PORT'"
  DIR=${DIR%/} CONF=${DIR%/}/etc/slurm.conf
}

alive() { [ -s "$DIR/slurmctld.pid" ] && kill -0 "$(cat "$DIR/slurmctld.pid")" 2>/dev/null; }

cmd_stop() {
  local pid i
  if alive; then
    pid=$(cat "$DIR/slurmctld.pid")
    kill -TERM "$pid"
    for i in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$DIR/slurmctld.pid"
}

write_config() {
  local policy
  rm -rf "$DIR/etc" "$DIR/state"
  mkdir -p "$DIR/etc" "$DIR/state" "$DIR/log"
  : > "$DIR/log/slurmctld.log"  # this start's lines only (a fatal line of an earlier start is no exit of this one)
  policy=$(sed -n 's/^#policy[[:space:]]\+//p' "$LAYOUT")
  cat > "$CONF" <<EOF
# Written by scripts/site-ctld.sh from $LAYOUT: a controller without compute nodes; everything under $DIR.
ClusterName=sitectld
SlurmctldHost=localhost
SlurmctldPort=$PORT
SlurmUser=root
AuthType=auth/none
CredType=cred/none
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
EnforcePartLimits=ALL
GresTypes=gpu
SuspendTime=INFINITE
ResumeProgram=/bin/true
SuspendProgram=/bin/true
MailProg=/bin/true
$( [ -z "$policy" ] || echo "JobSubmitPlugins=lua" )
# ---- the site's layout ($LAYOUT) ----
EOF
  grep -v '^#policy' "$LAYOUT" >> "$CONF"
  if [ -n "$policy" ]; then
    printf '%s\n' "$policy" > "$DIR/etc/policy.txt"
    sed "s|@POLICY@|$DIR/etc/policy.txt|" "$(dirname "${BASH_SOURCE[0]}")/site-ctld-policy.lua" > "$DIR/etc/job_submit.lua"
  fi
}

cmd_start() {
  [ -n "$LAYOUT" ] && [ -f "$LAYOUT" ] || die "start needs --layout FILE (tests/site-layouts/<site>.conf)"
  [ "$(id -u)" -eq 0 ] || die "must run as root (SlurmUser=root)"
  command -v slurmctld >/dev/null || die "slurmctld not found (scripts/bootstrap.sh full installs it)"
  cmd_stop
  write_config
  slurmctld -c -f "$CONF" 9>&-
  local deadline=$((SECONDS + START_TIMEOUT_S))
  until SLURM_CONF=$CONF timeout "$CLIENT_TIMEOUT_S" scontrol ping >/dev/null 2>&1; do
    [ $SECONDS -lt $deadline ] || die "slurmctld did not answer within ${START_TIMEOUT_S}s; see $DIR/log/slurmctld.log ($(tail -n 3 "$DIR/log/slurmctld.log" 2>/dev/null | paste -sd';' -))"
    # Daemonized, it writes its pid file a moment later (under load, after the first ping): no pid file yet is
    # still starting; a pid file whose process is gone, or a fatal line in its log, is an exit.
    if { [ -s "$DIR/slurmctld.pid" ] && ! alive; } || grep -q "fatal" "$DIR/log/slurmctld.log" 2>/dev/null; then
      die "slurmctld exited; see $DIR/log/slurmctld.log ($(tail -n 3 "$DIR/log/slurmctld.log" 2>/dev/null | paste -sd';' -))"
    fi
    sleep 0.1
  done
  echo "$CONF"
}

main() {
  [ $# -ge 1 ] || usage
  local cmd=$1; shift
  case "$cmd" in
    -h|--help|help) usage ;;
    start|stop) parse_args "$@" ;;
    *) die "unknown command '$cmd' (start|stop)" ;;
  esac
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock -w 60 9 || die "another site-ctld.sh holds $DIR/.lock"
  "cmd_$cmd"
}

main "$@"

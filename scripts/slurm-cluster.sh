#!/usr/bin/env bash
# A throw-away Slurm cluster on this machine (root; Debian's slurmctld, slurmd, slurm-client, munge).
#   slurm-cluster.sh start [--nodes N] [--cpus C] [--dir DIR] [--second-network SUFFIX] [--pin-cores]
#                                                                start (a no-op when already running); prints slurm.conf
#   slurm-cluster.sh stop [--dir DIR]                            cancel jobs, stop daemons, remove namespaces and bridge
#   slurm-cluster.sh status [--dir DIR]                          exit 0 when running, 3 when stopped
#   slurm-cluster.sh node-down|node-up NODE [--dir DIR]          kill a node's slurmd (a node failure) / start it again
#   slurm-cluster.sh node-slow NODE [--cpu-percent P] [--dir DIR]  limit a node to P % of one CPU (default 30)
#   slurm-cluster.sh node-restore NODE [--dir DIR]               lift that limit
# --nodes 1 runs one slurmd on the host (node = this host's name, loopback). --nodes N>1 gives every node its own
# network namespace dl-node<i> (address 10.77.0.<10+i>, host name dl-node<i>, interface dl0) on the bridge
# dlaunch-br0 (10.77.0.1, where slurmctld listens). All state, spool, logs and the munge socket live under DIR
# (default $DLAUNCH_SLURM_DIR or /tmp/dlaunch-slurm); `SLURM_CONF=DIR/etc/slurm.conf` is all a client needs.
# N>1 also mounts DIR/small-disk, a 16 MiB tmpfs every node sees (full-disk failures).
# Partition `debug` (the default) is plain Slurm. Partition `psslurm` (the same nodes) has as many pretend GPUs
# per node as CPUs (there are none here) and shows them as ParaStation's psslurm does on JSC's systems:
# scripts/psslurm-task-prolog.sh, the TaskProlog, gives the batch script the node's GPUs and each task of a step
# its own one (all of them to a step's only task on a node), and keeps a CUDA_VISIBLE_DEVICES the job script set.
# --second-network SUFFIX (N>1) gives every node a second interface ib0 (10.78.0.<10+i>, bridge dlaunch-br1) named
# dl-node<i>SUFFIX in the hosts file, the way JSC names a node's InfiniBand address (<host>i); Slurm itself keeps
# to the first network, as on JSC's systems.
# --pin-cores runs node i's slurmd, and so every job it starts, on the i-th core this script may use only (round
# robin; taskset): nodes sharing this machine then do not compete for each other's cores (cluster.env: NODE_CORES).
# node-slow moves node NODE's slurmd and every process in its network namespace (running job steps) into the
# cgroup v1 cpu group dlaunch-slurm-NODE with a CFS quota of P % of one CPU; what they fork later (new job
# steps) inherits it: proctrack/linuxproc and task/none never move a job's processes. A slowed node stands for
# a throttled GPU, a degraded link or a noisy neighbour. node-restore moves them back and removes the group
# (stop does too).
# AuthInfo's cred_expire is 10 s (Slurm's default 120): it is also how long a requeued job waits before it may start
# again (slurm.conf(5)), so a node failure's requeue waits about 10 s, not 2 minutes; the credential of a job or
# step is checked by a slurmd within a second of being made here.
# SlurmdTimeout is 10 s (Slurm's default 300, the test cluster's 30 before): a node that stops answering (node-down)
# is noticed and its job ended or requeued within about 10 s.
# DIR/cluster.env describes the running cluster (NODES, NODE_NAMES, CPUS_PER_NODE, IFNAME, SECOND_*, ...).
set -euo pipefail

readonly BRIDGE=dlaunch-br0 SUBNET_PREFIX=10.77.0 BRIDGE_ADDR=10.77.0.1 NODE_IFNAME=dl0 NS_PREFIX=dl-node
readonly BRIDGE2=dlaunch-br1 SUBNET2_PREFIX=10.78.0 BRIDGE2_ADDR=10.78.0.1 NODE_IFNAME2=ib0
readonly MAX_NODES=50 START_TIMEOUT_S=30 CLIENT_TIMEOUT_S=10
readonly PSSLURM_PARTITION=psslurm TASK_PROLOG=$(dirname "${BASH_SOURCE[0]}")/psslurm-task-prolog.sh
# node-slow's quota is granted per 10 ms: a node slowed to 30 % runs 3 ms of every 10, about uniformly slower like
# a throttled GPU, where a 100 ms period lets a 10 ms forward pass finish at full speed before the quota runs out
# (measured: a 30 % node's forward only 1.7x the other's, its backward 3x). The kernel's shortest quota is 1 ms.
readonly CPU_CGROUP=/sys/fs/cgroup/cpu CGROUP_PREFIX=dlaunch-slurm- CFS_PERIOD_US=10000

die() { echo "slurm-cluster.sh: $*" >&2; exit 2; }
log() { echo "slurm-cluster.sh: $*" >&2; }
usage() { sed -n '2,30p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

parse_args() {
  NODES=1 CPUS=2 DIR=${DLAUNCH_SLURM_DIR:-/tmp/dlaunch-slurm} SUFFIX2= NODE= PIN=false CPU_PERCENT=30
  while [ $# -gt 0 ]; do
    case "$1" in
      --nodes) [ $# -ge 2 ] || die "--nodes needs a value"; NODES=$2; shift 2 ;;
      --cpus) [ $# -ge 2 ] || die "--cpus needs a value"; CPUS=$2; shift 2 ;;
      --dir) [ $# -ge 2 ] || die "--dir needs a value"; DIR=$2; shift 2 ;;
      --second-network) [ $# -ge 2 ] || die "--second-network needs a host-name suffix"; SUFFIX2=$2; shift 2 ;;
      --pin-cores) PIN=true; shift ;;
      --cpu-percent) [ $# -ge 2 ] || die "--cpu-percent needs a value"; CPU_PERCENT=$2; shift 2 ;;
      dl-node*) NODE=$1; shift ;;
      *) die "unknown argument '$1' (see --help)" ;;
    esac
  done
  [[ "$NODES" =~ ^[1-9][0-9]*$ ]] && [ "$NODES" -le $MAX_NODES ] || die "--nodes must be 1..$MAX_NODES, got '$NODES'"
  [[ "$CPUS" =~ ^[1-9][0-9]*$ ]] && [ "$CPUS" -le 1024 ] || die "--cpus must be 1..1024, got '$CPUS'"
  [[ "$CPU_PERCENT" =~ ^[1-9][0-9]*$ ]] && [ "$CPU_PERCENT" -ge 10 ] && [ "$CPU_PERCENT" -le 100000 ] || die "--cpu-percent must be 10..100000 (100 = one CPU; the kernel grants at least 1 ms of each 10 ms period), got '$CPU_PERCENT'"
  [[ "$SUFFIX2" =~ ^[a-z0-9-]*$ ]] || die "--second-network: the suffix may only contain a-z, 0-9 and -, got '$SUFFIX2'"
  [ -z "$SUFFIX2" ] || [ "$NODES" -gt 1 ] || die "--second-network needs --nodes 2 or more (one network namespace per node)"
  # The path ends up in slurm.conf, which has no quoting: keep it to plain characters.
  [[ "$DIR" =~ ^/[A-Za-z0-9._/-]+$ ]] || die "--dir must be an absolute path of [A-Za-z0-9._/-], got '$DIR'"
  DIR=${DIR%/}
  CONF=$DIR/etc/slurm.conf
}

require_tools() {
  [ "$(id -u)" -eq 0 ] || die "must run as root"
  local t
  for t in slurmctld slurmd munged scontrol sinfo squeue scancel ip nsenter unshare timeout flock taskset; do
    command -v "$t" >/dev/null || die "'$t' not found (scripts/bootstrap.sh full installs it)"
  done
}

slurm() { SLURM_CONF=$CONF timeout "$CLIENT_TIMEOUT_S" "$@"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }
node_name() { if [ "$NODES" -eq 1 ]; then hostname -s; else echo "$NS_PREFIX$1"; fi; }
node_addr() { if [ "$NODES" -eq 1 ]; then echo 127.0.0.1; else echo "$SUBNET_PREFIX.$((10 + $1))"; fi; }
node_addr2() { echo "$SUBNET2_PREFIX.$((10 + $1))"; }
# The cores this script may run on (its Cpus_allowed_list, ranges expanded), one a line.
allowed_cores() {
  local part
  for part in $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status | tr ',' ' '); do
    case "$part" in *-*) seq "${part%-*}" "${part#*-}" ;; *) echo "$part" ;; esac
  done
}
# The core node $1 runs on with --pin-cores: one per node, round robin over the allowed cores.
node_core() { allowed_cores | sed -n "$(( ($1 - 1) % $(allowed_cores | wc -l) + 1 ))p"; }

# Every daemon of the cluster described by DIR/cluster.env is alive.
running() {
  [ -f "$DIR/cluster.env" ] || return 1
  local nodes; nodes=$(sed -n 's/^NODES=//p' "$DIR/cluster.env")
  alive "$DIR/run/munged.pid" && alive "$DIR/run/slurmctld.pid" || return 1
  local n
  for n in $(sed -n 's/^NODE_NAMES=//p' "$DIR/cluster.env" | tr ',' ' '); do alive "$DIR/run/slurmd-$n.pid" || return 1; done
  RUNNING_NODES=$nodes
}

write_config() {
  local names addr_list first i ctld ifname
  names=$(for i in $(seq 1 "$NODES"); do node_name "$i"; done | paste -sd, -)
  mkdir -p "$DIR"/{etc,log,run,spool/ctld,munge,munge-run}
  chmod 0700 "$DIR/munge"; chmod 0755 "$DIR/munge-run"
  for i in $(seq 1 "$NODES"); do mkdir -p "$DIR/spool/$(node_name "$i")" "$DIR/tmp/$(node_name "$i")"; done
  if [ "$NODES" -eq 1 ]; then ctld="localhost"; else ctld="localhost($BRIDGE_ADDR)"; fi
  cat > "$CONF.tmp" <<EOF
# Written by scripts/slurm-cluster.sh: a throw-away cluster; everything lives under $DIR.
ClusterName=dlaunch
SlurmctldHost=$ctld
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$DIR/munge-run/munge.socket.2,cred_expire=10
StateSaveLocation=$DIR/spool/ctld
SlurmdSpoolDir=$DIR/spool/%n
TmpFS=$DIR/tmp/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
JobCompType=jobcomp/filetxt
JobCompLoc=$DIR/log/jobcomp.log
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
TaskProlog=$DIR/etc/task-prolog.sh
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
EnforcePartLimits=ALL
MinJobAge=600
KillWait=5
MessageTimeout=10
SlurmdTimeout=10
InactiveLimit=0
EOF
  for i in $(seq 1 "$NODES"); do
    echo "NodeName=$(node_name "$i") NodeAddr=$(node_addr "$i") CPUs=$CPUS State=UNKNOWN" >> "$CONF.tmp"
  done
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >> "$CONF.tmp"
  echo "PartitionName=$PSSLURM_PARTITION Nodes=ALL MaxTime=INFINITE State=UP" >> "$CONF.tmp"
  install -m 0755 "$TASK_PROLOG" "$DIR/etc/task-prolog.sh"
  echo "$CPUS" > "$DIR/etc/psslurm-gpus"   # the pretend GPUs per node of partition psslurm
  mv "$CONF.tmp" "$CONF"

  # Name resolution inside the namespaces: every node and the controller.
  { echo "127.0.0.1 localhost"
    [ "$NODES" -eq 1 ] || echo "$BRIDGE_ADDR dlaunch-ctl"
    for i in $(seq 1 "$NODES"); do echo "$(node_addr "$i") $(node_name "$i")"; done
    [ -z "$SUFFIX2" ] || for i in $(seq 1 "$NODES"); do echo "$(node_addr2 "$i") $(node_name "$i")$SUFFIX2"; done
  } > "$DIR/etc/hosts"

  first=$(node_name 1)
  if [ "$NODES" -eq 1 ]; then addr_list=127.0.0.1 ifname=lo
  else addr_list=$(for i in $(seq 1 "$NODES"); do node_addr "$i"; done | paste -sd, -) ifname=$NODE_IFNAME; fi
  cat > "$DIR/cluster.env.tmp" <<EOF
SLURM_CONF=$CONF
NODES=$NODES
NODE_NAMES=$names
NODE_ADDRS=$addr_list
FIRST_NODE=$first
CPUS_PER_NODE=$CPUS
IFNAME=$ifname
PARTITION=debug
GPUS_PER_NODE=$CPUS
PSSLURM_PARTITION=$PSSLURM_PARTITION
SECOND_SUFFIX=$SUFFIX2
SECOND_IFNAME=${SUFFIX2:+$NODE_IFNAME2}
SMALL_DISK=$([ "$NODES" -eq 1 ] || echo "$DIR/small-disk")
NODE_CORES=$($PIN && for i in $(seq 1 "$NODES"); do node_core "$i"; done | paste -sd, -)
EOF
  mv "$DIR/cluster.env.tmp" "$DIR/cluster.env"
}

start_munge() {
  [ -s "$DIR/munge/munge.key" ] || dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
  chmod 0400 "$DIR/munge/munge.key"
  munged --force --socket="$DIR/munge-run/munge.socket.2" --key-file="$DIR/munge/munge.key" \
    --pid-file="$DIR/run/munged.pid" --log-file="$DIR/log/munged.log" --seed-file="$DIR/munge/munge.seed" 9>&-
}

create_network() {
  local i name
  ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
  [[ "$(ip -4 -o addr show dev "$BRIDGE")" == *" $BRIDGE_ADDR/"* ]] || ip addr add "$BRIDGE_ADDR/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  for i in $(seq 1 "$NODES"); do
    name=$NS_PREFIX$i
    [ -e "/run/netns/$name" ] && ip netns del "$name"
    ip netns add "$name"
    ip link add "dlveth$i" type veth peer name "$NODE_IFNAME" netns "$name"
    ip link set "dlveth$i" master "$BRIDGE" up
    nsenter --net="/run/netns/$name" sh -ec "ip link set lo up; ip addr add $(node_addr "$i")/24 dev $NODE_IFNAME; ip link set $NODE_IFNAME up"
  done
  [ -n "$SUFFIX2" ] || return 0
  ip link show "$BRIDGE2" >/dev/null 2>&1 || ip link add "$BRIDGE2" type bridge
  [[ "$(ip -4 -o addr show dev "$BRIDGE2")" == *" $BRIDGE2_ADDR/"* ]] || ip addr add "$BRIDGE2_ADDR/24" dev "$BRIDGE2"
  ip link set "$BRIDGE2" up
  for i in $(seq 1 "$NODES"); do
    ip link add "dlveth2-$i" type veth peer name "$NODE_IFNAME2" netns "$NS_PREFIX$i"
    ip link set "dlveth2-$i" master "$BRIDGE2" up
    nsenter --net="/run/netns/$NS_PREFIX$i" sh -ec "ip addr add $(node_addr2 "$i")/24 dev $NODE_IFNAME2; ip link set $NODE_IFNAME2 up"
  done
}

# The words that run a node's slurmd on its core (cluster.env's NODE_CORES), or none when not pinned.
pinned() {
  local core
  core=$(sed -n 's/^NODE_CORES=//p' "$DIR/cluster.env" | cut -d, -f"$1")
  [ -z "$core" ] || echo "taskset -c $core"
}

# One node's slurmd in its namespace. Not `ip netns exec`: it remounts /sys and hides /sys/fs/cgroup.
start_node() {
  # shellcheck disable=SC2046  # pinned's words are meant to split
  $(pinned "${1#"$NS_PREFIX"}") nsenter --net="/run/netns/$1" unshare --mount --uts \
    sh -ec 'mount --bind "$1" /etc/hosts; hostname "$2"; exec slurmd -f "$3" -N "$2"' sh "$DIR/etc/hosts" "$1" "$CONF" 9>&-
}

start_slurmds() {
  local i
  # shellcheck disable=SC2046
  if [ "$NODES" -eq 1 ]; then $(pinned 1) slurmd -f "$CONF" -N "$(node_name 1)" 9>&-; return; fi
  for i in $(seq 1 "$NODES"); do start_node "$NS_PREFIX$i"; done
}

# A node failure as Slurm sees it: the node's slurmd is gone (its job processes run on, unreachable).
cmd_node_down() {
  running || die "no cluster running under $DIR"
  [ -n "$NODE" ] && [ -e "/run/netns/$NODE" ] || die "node-down needs one of: $(sed -n 's/^NODE_NAMES=//p' "$DIR/cluster.env")"
  stop_daemons "$DIR/run/slurmd-$NODE.pid"
}

cmd_node_up() {
  [ -n "$NODE" ] && [ -e "/run/netns/$NODE" ] || die "node-up needs a node of the running cluster"
  local group=$CPU_CGROUP/$CGROUP_PREFIX$NODE
  # A slowed node stays slowed: the new slurmd starts inside its group.
  alive "$DIR/run/slurmd-$NODE.pid" || ( [ ! -d "$group" ] || echo "$BASHPID" > "$group/cgroup.procs"; start_node "$NODE" )
}

# The path of process $1 in the cgroup v1 cpu hierarchy ("/" at its root).
cpu_cgroup_of() { awk -F: '$2 ~ /(^|,)cpu(,|$)/ {print $3}' "/proc/$1/cgroup"; }

# Move every process of cgroup directory $1 into cgroup directory $2 and remove $1 (rounds, for processes that
# fork or exit meanwhile); status 1 when $1 could not be removed within 5 s.
remove_group() {
  local pid i
  for i in $(seq 1 50); do
    while read -r pid; do echo "$pid" > "$2/cgroup.procs" 2>/dev/null || true; done < "$1/cgroup.procs"
    rmdir "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  return 1
}

cmd_node_slow() {
  running || die "no cluster running under $DIR"
  [ -n "$NODE" ] && [ -e "/run/netns/$NODE" ] || die "node-slow needs one of: $(sed -n 's/^NODE_NAMES=//p' "$DIR/cluster.env")"
  [ -w "$CPU_CGROUP/cgroup.procs" ] && [ -e "$CPU_CGROUP/cpu.cfs_quota_us" ] || die "node-slow needs cgroup v1's cpu controller at $CPU_CGROUP"
  local group=$CPU_CGROUP/$CGROUP_PREFIX$NODE slurmd pid moved=0
  slurmd=$(cat "$DIR/run/slurmd-$NODE.pid")
  [ -d "$group" ] || { cpu_cgroup_of "$slurmd" > "$DIR/run/slow-$NODE.from"; mkdir "$group"; }
  echo "$CFS_PERIOD_US" > "$group/cpu.cfs_period_us"
  echo $((CPU_PERCENT * CFS_PERIOD_US / 100)) > "$group/cpu.cfs_quota_us"
  for pid in $({ echo "$slurmd"; ip netns pids "$NODE"; } | sort -u); do
    if echo "$pid" > "$group/cgroup.procs" 2>/dev/null; then moved=$((moved + 1)); fi   # else it ended meanwhile
  done
  log "$NODE: $moved process(es) (slurmd and its namespace's) limited to $CPU_PERCENT % of one CPU in $group"
}

# Lift node $1's limit: its processes back where its slurmd was, the group removed (status 1 if it could not be).
restore_node() {
  local group=$CPU_CGROUP/$CGROUP_PREFIX$1 from
  [ -d "$group" ] || return 0
  from=$(cat "$DIR/run/slow-$1.from" 2>/dev/null || echo /)
  remove_group "$group" "$CPU_CGROUP${from%/}" || return 1
  rm -f "$DIR/run/slow-$1.from"
}

cmd_node_restore() {
  [ -n "$NODE" ] || die "node-restore needs a node name (dl-node<i>)"
  [ -d "$CPU_CGROUP/$CGROUP_PREFIX$NODE" ] || { log "$NODE is not slowed"; return 0; }
  restore_node "$NODE" || die "$NODE: processes keep $CPU_CGROUP/$CGROUP_PREFIX$NODE busy; try again"
  log "$NODE: CPU limit lifted"
}

mount_small_disk() {
  mkdir -p "$DIR/small-disk"
  mountpoint -q "$DIR/small-disk" || mount -t tmpfs -o size=16m tmpfs "$DIR/small-disk"
}

wait_idle() {
  local deadline=$((SECONDS + START_TIMEOUT_S)) idle
  while [ $SECONDS -lt $deadline ]; do
    idle=$(slurm sinfo -h -N -t idle -o '%N' 2>/dev/null | sort -u | wc -l || true)
    [ "$idle" -eq "$NODES" ] && return 0
    sleep 0.3
  done
  die "nodes not idle after ${START_TIMEOUT_S}s; see $DIR/log/ ($(slurm sinfo -h -N -o '%N %T %E' 2>&1 | paste -sd';' -))"
}

cmd_start() {
  if running; then
    [ "$RUNNING_NODES" -eq "$NODES" ] || die "already running with $RUNNING_NODES nodes under $DIR; stop it first"
    [ "$(sed -n 's/^SECOND_SUFFIX=//p' "$DIR/cluster.env")" = "$SUFFIX2" ] || die "already running with another --second-network under $DIR; stop it first"
    local pinned_now=false
    [ -z "$(sed -n 's/^NODE_CORES=//p' "$DIR/cluster.env")" ] || pinned_now=true
    [ "$pinned_now" = "$PIN" ] || die "already running with$($PIN && echo "out") --pin-cores under $DIR; stop it first"
    echo "$CONF"; return 0
  fi
  [ ! -f "$DIR/cluster.env" ] || stop_cluster   # half-running leftovers of an earlier start
  if [ "$NODES" -gt 1 ] && ip link show "$BRIDGE" >/dev/null 2>&1; then
    die "bridge $BRIDGE exists: another cluster is running (stop it with its --dir)"
  fi
  rm -rf "$DIR/spool" "$DIR/tmp" "$DIR/run" "$DIR/log"   # a fresh cluster: no jobs or logs of an earlier one
  write_config
  start_munge
  [ "$NODES" -eq 1 ] || { create_network; mount_small_disk; }   # before the slurmds: they inherit the mount
  slurmctld -f "$CONF" 9>&-
  start_slurmds
  wait_idle
  log "running: $NODES node(s) $(sed -n 's/^NODE_NAMES=//p' "$DIR/cluster.env"); export SLURM_CONF=$CONF"
  echo "$CONF"
}

# TERM the daemons named by pid files, KILL what is left after 10 s.
stop_daemons() {
  local pids=() pf pid i any_alive
  for pf in "$@"; do [ -s "$pf" ] && pids+=("$(cat "$pf")"); done
  if [ ${#pids[@]} -gt 0 ]; then
    kill -TERM "${pids[@]}" 2>/dev/null || true
    for i in $(seq 1 100); do
      any_alive=false
      for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && any_alive=true; done
      $any_alive || break
      sleep 0.1
    done
    kill -KILL "${pids[@]}" 2>/dev/null || true
  fi
  rm -f "$@"
}

stop_cluster() {
  local names jobs ns pids i
  names=
  [ ! -f "$DIR/cluster.env" ] || names=$(sed -n 's/^NODE_NAMES=//p' "$DIR/cluster.env" | tr ',' ' ')
  if alive "$DIR/run/slurmctld.pid"; then
    jobs=$(slurm squeue -h -o %A 2>/dev/null || true)
    if [ -n "$jobs" ]; then
      slurm scancel $jobs 2>/dev/null || true
      for i in $(seq 1 50); do   # KillWait=5: steps end within a few seconds
        [ -z "$(slurm squeue -h -t running,completing,configuring,pending -o %A 2>/dev/null)" ] && break
        sleep 0.2
      done
    fi
  fi
  stop_daemons "$DIR"/run/slurm*.pid
  for ns in $names; do
    [ -e "/run/netns/$ns" ] || continue
    pids=$(ip netns pids "$ns" 2>/dev/null || true)   # job steps that outlived their slurmd
    if [ -n "$pids" ]; then
      kill -KILL $pids 2>/dev/null || true
    fi
    ip netns del "$ns"
  done
  for ns in $names; do restore_node "$ns" || log "could not remove $CPU_CGROUP/$CGROUP_PREFIX$ns (still busy)"; done
  ! ip link show "$BRIDGE" >/dev/null 2>&1 || ip link del "$BRIDGE"
  ! ip link show "$BRIDGE2" >/dev/null 2>&1 || ip link del "$BRIDGE2"
  stop_daemons "$DIR/run/munged.pid"
  ! mountpoint -q "$DIR/small-disk" 2>/dev/null || umount "$DIR/small-disk"
  rm -f "$DIR/cluster.env" "$DIR/munge-run/munge.socket.2"*
}

cmd_stop() {
  if [ ! -f "$DIR/cluster.env" ] && [ ! -d "$DIR/run" ]; then log "nothing running under $DIR"; return 0; fi
  stop_cluster
  log "stopped (logs kept in $DIR/log)"
}

cmd_status() {
  local pf
  if ! running; then echo "stopped ($DIR)"; return 3; fi
  echo "running: $RUNNING_NODES node(s); SLURM_CONF=$CONF"
  for pf in "$DIR"/run/*.pid; do echo "  $(basename "$pf" .pid) pid $(cat "$pf")"; done
  slurm sinfo -N -o '%N %T %c %P' || echo "  sinfo did not answer within ${CLIENT_TIMEOUT_S}s"
}

main() {
  [ $# -ge 1 ] || usage
  local cmd=$1; shift
  case "$cmd" in
    -h|--help|help) usage ;;
    start|stop|status|node-down|node-up|node-slow|node-restore) parse_args "$@" ;;
    *) die "unknown command '$cmd' (start|stop|status|node-down|node-up|node-slow|node-restore)" ;;
  esac
  require_tools
  mkdir -p "$DIR"
  exec 9>"$DIR/.lock"
  flock -w 60 9 || die "another slurm-cluster.sh holds $DIR/.lock"
  "cmd_${cmd//-/_}"
}

main "$@"

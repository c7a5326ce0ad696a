#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Start/stop a throw-away Slurm cluster on localhost for the test suite.
#
#   slurm-cluster.sh start DIR NODES   # prints: export SLURM_CONF=DIR/slurm.conf
#   slurm-cluster.sh stop  DIR
#   slurm-cluster.sh env   DIR         # prints: export SLURM_CONF=DIR/slurm.conf
#
# Everything the cluster writes (config, state, spool, logs, pid files, each
# node's TmpFS) lives under DIR, so several clusters can coexist and nothing
# outside DIR is touched. Runs as root without systemd. Exits 77 ("skip") when
# the Slurm daemons are not installed.
#
# Typical use:
#   eval "$(tests/slurm/slurm-cluster.sh start "$d" 2)"
#   OMPI_MCA_btl=self,tcp timeout 60 srun -N 2 -n 4 --ntasks-per-node=2 --mpi=pmix ./prog
#   tests/slurm/slurm-cluster.sh stop "$d"
#
# Notes for callers:
# - Each virtual node advertises CPUS_PER_NODE (8) CPUs whatever the real core
#   count. More tasks than the whole partition has CPUs queue forever instead
#   of failing: pass `--immediate=N` to srun when unsure (-N1 with too many
#   tasks does fail at once).
# - `-N 2 -n 4` alone packs the first node (3+1 tasks): add
#   --ntasks-per-node=2 for an even split.
# - Open MPI direct launch needs `srun --mpi=pmix`. Virtual nodes share one
#   host name, so Open MPI would use shared memory between ranks of different
#   nodes and crash (segfault in btl/vader): export OMPI_MCA_btl=self,tcp.
set -euo pipefail

readonly CPUS_PER_NODE=${KFT_SLURM_CPUS_PER_NODE:-8}
readonly READY_TIMEOUT=${KFT_SLURM_READY_TIMEOUT:-30}
readonly STOP_GRACE=${KFT_SLURM_STOP_GRACE:-5}
# auth/none is simplest (no munged); "munge" forces the fallback, for testing it.
readonly AUTH=${KFT_SLURM_AUTH:-auto}
readonly PLUGIN_DIRS="/usr/lib/x86_64-linux-gnu/slurm-wlm /usr/lib64/slurm /usr/lib/slurm /usr/local/lib/slurm"
# Set in every daemon's environment, so `stop` finds exactly this DIR's
# daemons even if a pid file is stale or was reused.
readonly MARKER_VAR=KFT_SLURM_CLUSTER_DIR

die() { echo "slurm-cluster.sh: $*" >&2; exit 1; }

usage() {
    cat >&2 <<'EOF'
usage: slurm-cluster.sh start DIR NODES
       slurm-cluster.sh stop DIR
       slurm-cluster.sh env DIR
EOF
    exit 2
}

find_bin() {
    local name=$1 d
    command -v "$name" 2>/dev/null && return 0
    # root's PATH normally has sbin; a test runner's PATH may not.
    for d in /usr/sbin /usr/local/sbin /sbin; do
        [[ -x $d/$name ]] && { echo "$d/$name"; return 0; }
    done
    return 1
}

have_plugin() {
    local d
    for d in $PLUGIN_DIRS; do
        [[ -e $d/$1.so ]] && return 0
    done
    return 1
}

# --- process bookkeeping -----------------------------------------------------

# A zombie counts as dead: where PID 1 does not reap orphans (some VM and
# container inits) our killed daemons linger as <defunct> forever.
alive() {
    local stat
    { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
    stat=${stat##*) }
    [[ ${stat%% *} != Z ]]
}

# True if PID's environment carries this DIR's marker. This is what ties a
# daemon to DIR: pids can be reused, and the caller's own shell may well have
# SLURM_CONF=DIR/slurm.conf exported, so neither is trusted on its own.
has_marker() {
    grep -qzxF "$MARKER_VAR=$DIR" "/proc/$1/environ" 2>/dev/null
}

# True if PID is a slurmstepd of this cluster. slurmd starts job steps with an
# empty environment and they are reparented to init, so neither the marker nor
# the process tree finds them; they do keep their node's slurmd log open.
is_our_stepd() {
    local comm fd
    { read -r comm <"/proc/$1/comm"; } 2>/dev/null || return 1
    [[ $comm == slurmstepd ]] || return 1
    for fd in "/proc/$1"/fd/*; do
        [[ $(readlink "$fd" 2>/dev/null) == "$DIR"/log/* ]] && return 0
    done
    return 1
}

# Pids of this cluster's processes: daemons (from pid files and the marker),
# job steps, and all their descendants (the user's tasks, which run with the
# job's environment, not the marker). Never the caller or this script.
cluster_pids() {
    local -A keep=() parent=()
    local f p stat changed
    for f in /proc/[0-9]*/stat; do
        p=${f#/proc/}; p=${p%/stat}
        { read -r stat <"$f"; } 2>/dev/null || continue
        stat=${stat##*) }          # comm may contain spaces and parentheses
        [[ $stat == Z* ]] && continue  # dead already, and childless
        stat=${stat#* }
        parent[$p]=${stat%% *}
    done
    for f in "$DIR"/pids/*.pid; do
        [[ -f $f ]] || continue
        { read -r p <"$f"; } 2>/dev/null || continue
        [[ $p =~ ^[0-9]+$ ]] && has_marker "$p" && keep[$p]=1
    done
    for p in "${!parent[@]}"; do
        [[ -z ${keep[$p]:-} ]] && { has_marker "$p" || is_our_stepd "$p"; } && keep[$p]=1
    done
    changed=1
    while ((changed)); do
        changed=0
        for p in "${!parent[@]}"; do
            if [[ -z ${keep[$p]:-} && -n ${keep[${parent[$p]:-0}]:-} ]]; then
                keep[$p]=1; changed=1
            fi
        done
    done
    p=$$
    while [[ -n $p && $p != 0 && $p != 1 ]]; do
        unset "keep[$p]"
        p=${parent[$p]:-}
    done
    echo "${!keep[@]}"
}

# --- stop ---------------------------------------------------------------------

cmd_stop() {
    local pids p deadline sig=TERM
    local -A signalled=()
    # Let Slurm end running jobs first, while the daemons still run: a slurmd
    # killed while it reports a just-cancelled step to a dead slurmctld
    # ignores SIGTERM for a long time.
    if [[ -f $DIR/slurm.conf && -f $DIR/pids/slurmctld.pid ]] \
        && has_marker "$(<"$DIR/pids/slurmctld.pid")"; then
        local -x SLURM_CONF=$DIR/slurm.conf
        local jobs
        jobs=$(timeout 5 squeue -h -o %i 2>/dev/null) || true
        # shellcheck disable=SC2086
        [[ -n $jobs ]] && { timeout 5 scancel --quiet $jobs >/dev/null 2>&1 || true; }
        deadline=$((SECONDS + STOP_GRACE))
        while ((SECONDS < deadline)) \
            && [[ -n $(timeout 5 squeue -h -o %i 2>/dev/null || echo timeout) ]]; do
            sleep 0.2
        done
    fi
    deadline=$((SECONDS + STOP_GRACE))
    while :; do
        pids=$(cluster_pids)
        [[ -z $pids ]] && break
        if ((SECONDS >= deadline)); then
            [[ $sig == KILL ]] && break
            sig=KILL
            deadline=$((SECONDS + STOP_GRACE))
        fi
        for p in $pids; do
            kill -s "$sig" "$p" 2>/dev/null || true
            signalled[$p]=1
        done
        sleep 0.2
    done
    if [[ -n $pids ]]; then
        # shellcheck disable=SC2086
        ps -o pid=,args= -p "${pids// /,}" >&2 || true
        die "processes of $DIR survived SIGKILL: $pids"
    fi
    rm -f "$DIR"/pids/*.pid
    # Dead daemons are orphans, so init reaps them; some inits (this VM's)
    # take a second or two. Wait a little so that a `pgrep slurm` right after
    # `stop` comes back empty, but don't fail over zombies.
    deadline=$((SECONDS + STOP_GRACE))
    for p in "${!signalled[@]}"; do
        while [[ -e /proc/$p ]] && ((SECONDS < deadline)); do sleep 0.1; done
    done
}

# --- start --------------------------------------------------------------------

port_in_use() {
    ss -Htan "( sport = :$1 )" 2>/dev/null | grep -q .
}

# Picks COUNT consecutive free ports below the ephemeral range (so srun's and
# the daemons' own outgoing ports cannot take them between check and bind).
# Random start so that clusters in other DIRs started at the same time rarely
# collide.
pick_ports() {
    local count=$1 lo hi base i tries
    read -r lo _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || lo=32768
    hi=$((lo - count - 1)); lo=10000
    ((hi > lo)) || hi=30000
    for ((tries = 0; tries < 100; tries++)); do
        base=$((lo + (RANDOM * 32768 + RANDOM) % (hi - lo)))
        for ((i = 0; i < count; i++)); do
            port_in_use $((base + i)) && continue 2
        done
        echo "$base"
        return 0
    done
    die "no $count consecutive free TCP ports found"
}

write_config() {
    local nodes=$1 base=$2 cluster=$3 auth=$4 i
    {
        cat <<EOF
# Generated by slurm-cluster.sh: a throw-away test cluster, all state in DIR.
ClusterName=$cluster
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$base
SlurmdPort=$((base + 1))
SlurmUser=root
SlurmdUser=root
EOF
        if [[ $auth == none ]]; then
            echo "AuthType=auth/none"
            echo "CredType=cred/none"
        else
            echo "AuthType=auth/munge"
            echo "CredType=cred/munge"
            echo "AuthInfo=socket=$DIR/munge/munge.socket"
        fi
        cat <<EOF
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool/%n
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdLogFile=$DIR/log/slurmd-%n.log
SlurmctldDebug=info
SlurmdDebug=info
# %n: every virtual node needs its own TmpFS, or the PMIx directories of
# steps on two nodes of the same host collide.
TmpFS=$DIR/tmp/%n
PlugStackConfig=$DIR/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
# Lets nodes advertise more CPUs than the machine has.
SlurmdParameters=config_overrides
MpiDefault=none
SwitchType=switch/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SchedulerType=sched/builtin
ReturnToService=2
# Short timeouts: a broken test should fail fast, not hang.
MessageTimeout=10
TCPTimeout=2
KillWait=2
InactiveLimit=0
SlurmctldTimeout=10
SlurmdTimeout=30
Waittime=0
MinJobAge=60
EOF
        for ((i = 1; i <= nodes; i++)); do
            echo "NodeName=n$i NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((base + i)) CPUs=$CPUS_PER_NODE RealMemory=1024 State=UNKNOWN"
        done
        echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    } >"$DIR/slurm.conf"
    : >"$DIR/plugstack.conf"
}

# Runs a daemon detached (own session, no inherited stdio: a caller doing
# $(slurm-cluster.sh start ...) would otherwise wait on the pipe forever),
# tagged with the marker, and records its pid in DIR/pids (DIR/run has
# Slurm's own pid files, which the daemons delete when they exit). The
# working directory is DIR because job steps inherit slurmd's, and the
# caller's may be deleted while the cluster runs. setsid does not fork here
# (a background job is no process group leader), so $! is the daemon itself.
spawn() {
    local name=$1; shift
    (cd "$DIR" && exec env "$MARKER_VAR=$DIR" setsid "$@" </dev/null >>"$DIR/log/$name.out" 2>&1) &
    echo $! >"$DIR/pids/$name.pid"
}

start_munged() {
    local munged mungekey
    munged=$(find_bin munged) || { echo "slurm-cluster.sh: skip: munged not installed and auth/none unavailable" >&2; exit 77; }
    mkdir -m 755 "$DIR/munge"
    if mungekey=$(find_bin mungekey); then
        "$mungekey" --create --keyfile="$DIR/munge/munge.key" >/dev/null 2>&1
    else
        dd if=/dev/urandom of="$DIR/munge/munge.key" bs=1024 count=1 status=none
    fi
    chmod 400 "$DIR/munge/munge.key"
    spawn munged "$munged" --foreground --force \
        --socket="$DIR/munge/munge.socket" --key-file="$DIR/munge/munge.key" \
        --pid-file="$DIR/munge/munged.pid" --log-file="$DIR/log/munged.log" \
        --seed-file="$DIR/munge/munged.seed"
    local deadline=$((SECONDS + 10))
    until [[ -S $DIR/munge/munge.socket ]]; do
        alive "$(<"$DIR/pids/munged.pid")" || { tail -n 20 "$DIR"/log/munged.* >&2 || true; die "munged died"; }
        ((SECONDS < deadline)) || die "munged did not create its socket"
        sleep 0.1
    done
}

dump_logs() {
    local f
    for f in "$DIR"/log/*; do
        [[ -s $f ]] || continue
        echo "==> $f <==" >&2
        tail -n 25 "$f" >&2
    done
}

cmd_start() {
    local nodes=$1 slurmctld slurmd auth base cluster i deadline idle p
    [[ $nodes =~ ^[1-9][0-9]*$ ]] || die "NODES must be a positive integer, got '$nodes'"
    slurmctld=$(find_bin slurmctld) || { echo "slurm-cluster.sh: skip: slurmctld not installed" >&2; exit 77; }
    slurmd=$(find_bin slurmd) || { echo "slurm-cluster.sh: skip: slurmd not installed" >&2; exit 77; }
    command -v sinfo >/dev/null || { echo "slurm-cluster.sh: skip: sinfo not installed" >&2; exit 77; }

    case $AUTH in
        none | munge) auth=$AUTH ;;
        auto) if have_plugin auth_none && have_plugin cred_none; then auth=none; else auth=munge; fi ;;
        *) die "KFT_SLURM_AUTH must be auto, none or munge" ;;
    esac

    cmd_stop
    # Old state would bring back the previous run's nodes and jobs.
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/tmp" "$DIR/munge" "$DIR/log" "$DIR/run"
    mkdir -p "$DIR/state" "$DIR/run" "$DIR/pids" "$DIR/log"
    for ((i = 1; i <= nodes; i++)); do
        mkdir -p "$DIR/spool/n$i" "$DIR/tmp/n$i"
    done

    base=$(pick_ports $((nodes + 1)))
    # Lowercase (Slurm would lowercase it) and different per start, like the ports,
    # so that clusters in different DIRs can never be mistaken for each other.
    cluster=kft$(printf '%04x%04x' $((RANDOM)) $(($$ & 0xffff)))
    write_config "$nodes" "$base" "$cluster" "$auth"

    [[ $auth == munge ]] && start_munged
    # -i: don't refuse to start over state it can't read; -D: stay in the
    # foreground so the recorded pid is the daemon itself.
    spawn slurmctld "$slurmctld" -D -i -f "$DIR/slurm.conf"
    for ((i = 1; i <= nodes; i++)); do
        spawn "slurmd-n$i" "$slurmd" -D -N "n$i" -f "$DIR/slurm.conf"
    done

    deadline=$((SECONDS + READY_TIMEOUT))
    while :; do
        idle=$(SLURM_CONF=$DIR/slurm.conf timeout 5 sinfo -h -N -o '%N %t' 2>/dev/null \
            | awk '$2 == "idle"' | sort -u | wc -l) || idle=0
        ((idle >= nodes)) && break
        for p in "$DIR"/pids/*.pid; do
            alive "$(<"$p")" || { dump_logs; cmd_stop || true; die "$(basename "$p" .pid) exited during startup"; }
        done
        if ((SECONDS >= deadline)); then
            SLURM_CONF=$DIR/slurm.conf timeout 5 sinfo -N >&2 || true
            dump_logs
            cmd_stop || true
            die "cluster in $DIR not ready after ${READY_TIMEOUT}s ($idle/$nodes nodes idle)"
        fi
        sleep 0.2
    done
    cmd_env
}

cmd_env() {
    printf 'export SLURM_CONF=%q\n' "$DIR/slurm.conf"
}

# --- main ---------------------------------------------------------------------

[[ $# -ge 2 ]] || usage
cmd=$1
[[ -n $2 ]] || usage
[[ $cmd == start ]] && mkdir -p "$2"
# Canonical, so that every spelling of DIR finds the same processes; -m
# because `stop` must still work after DIR was deleted.
DIR=$(realpath -m "$2")
readonly DIR

case $cmd in
    start) [[ $# -eq 3 ]] || usage; cmd_start "$3" ;;
    stop) [[ $# -eq 2 ]] || usage; cmd_stop ;;
    env) [[ $# -eq 2 ]] || usage; cmd_env ;;
    *) usage ;;
esac

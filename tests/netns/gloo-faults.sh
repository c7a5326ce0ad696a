#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Faults in a job across two network-namespace hosts with Gloo between them (no MPI): two kftrun
# agents, two ranks each, allreducing with a 5 s deadline (tests/netns/gloo_fault_worker.cpp).
# Each fault must end the whole job within the deadline + 5 s, with the culprit named in the
# ranks' errors, and leave no process or shared-memory segment behind:
#   worker_kill9  kill -9 of rank 3 (host 1)
#   agent_kill9   kill -9 of host 1's kftrun agent
#   blackhole     every packet in or out of host 1 dropped (iptables), after the job started
#   sigstop       SIGSTOP of rank 2 (host 1): every rank's error names rank 2, including the
#                 errors of ranks that waited for a rank that was itself waiting for rank 2
#   sigstop_host  SIGSTOP of both ranks of host 1: host 0's ranks wait in Gloo for them, and
#                 for each other in the node's shared memory; every error names rank 2 or 3
#   sigstop_member SIGSTOP of rank 3 (local rank 1 of host 1): rank 2 waits for it in host 1's
#                 shared memory, rank 1 (local rank 1 of host 0) in Gloo between the local
#                 ranks 1 of the hosts (rail 1), and rank 0 for rank 1 in host 0's shared memory
#
# In the SIGSTOP scenarios the ranks' flight recorders dump to a directory (KFT_TRACE_DIR; the
# ranks still waiting when kftrun stops the job dump on its SIGUSR1), and kft-trace must name
# the stopped rank(s) and no other, and follow a chain of waits from host 0 through a rank that
# is itself waiting to the stopped one. Which chain depends on where each rank was: with rank 2
# stopped, rank 1 -> rank 0 -> rank 2 (rank 1 in host 0's shared memory, rank 0 in Gloo) or
# rank 1 -> rank 3 -> rank 2 (rank 1 in Gloo between the local ranks 1, rank 3 in host 1's
# shared memory); with rank 3 stopped, rank 0 -> rank 1 -> rank 3 or rank 0 -> rank 2 -> rank 3.
#
#   gloo-faults.sh <kftrun> <gloo_fault_worker> <kft-trace> [scenario...]
#
# Exit 77 (skip) when namespaces cannot be created.
set -euo pipefail
trap 'echo "$(basename "$0"): line $LINENO: a command failed (exit $?)" >&2' ERR
kftrun=$1 worker=$2 kft_trace=$3; shift 3
scenarios=("$@")
((${#scenarios[@]})) || scenarios=(worker_kill9 agent_kill9 blackhole sigstop sigstop_host sigstop_member)
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/netns-cluster.sh"
name="kftf$$"
tmp=$(mktemp -d)
agents=()
cleanup() {
  for p in "${agents[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  pkill -9 -f "$worker $tmp" 2>/dev/null || true
  "$cluster" down "$name"
  [[ -z "${KEEP_TRACE:-}" ]] || cp -r "$tmp/trace" "$KEEP_TRACE" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
"$cluster" up "$name" 2 || exit $?   # 77 passes through as a skip
command -v iptables >/dev/null || { echo "gloo-faults: iptables is not installed (Debian: apt-get install iptables)" >&2; exit 1; }
master=$("$cluster" addr "$name" 0)
export KFT_RDZV_TOKEN="gloo-faults-$$-$RANDOM"
deadline_s=5 budget_s=10   # the collectives' deadline, and the time the job may take to end after the fault
shm_before=$(ls /dev/shm | sort)

fail() {
  echo "FAILED ($scenario): $*" >&2
  for f in "$tmp"/agent*.out; do echo "--- $f" >&2; tail -n 30 "$f" >&2; done
  exit 1
}

for scenario in "${scenarios[@]}"; do
  rm -f "$tmp"/pid.* "$tmp"/agent*.out
  agents=()
  # kftrun ends a job whose worker stays stopped past --heartbeat-timeout (exit 5, naming it);
  # the SIGSTOP scenarios check the ranks' own errors at their 5 s deadline, so there kftrun
  # waits longer than the ranks do.
  heartbeat=2
  [[ "$scenario" != sigstop* ]] || heartbeat=10
  rm -rf "$tmp/trace"
  trace=()
  [[ "$scenario" != sigstop* ]] || trace=(env "KFT_TRACE_DIR=$tmp/trace")
  for i in 0 1; do
    "$cluster" exec "$name" "$i" "${trace[@]}" "$kftrun" --nnodes 2 --node-rank "$i" --master-addr "$master" --master-port 29500 \
      --nproc-per-node 2 --heartbeat-timeout "$heartbeat" --run-id "f$scenario" -- "$worker" "$tmp" "$deadline_s" 120 \
      > "$tmp/agent$i.out" 2>&1 &
    agents+=($!)
  done
  for _ in $(seq 1 300); do
    [[ $(cat "$tmp"/agent*.out 2>/dev/null | grep -c "ready rank" || true) == 4 ]] && break
    sleep 0.1
  done
  [[ $(cat "$tmp"/agent*.out | grep -c "ready rank") == 4 ]] || fail "the 4 ranks did not start"
  grep -q "Gloo between nodes" "$tmp/agent0.out" || fail "the group is not Gloo's"
  sleep 0.5   # a few hundred steps in
  t0=$(date +%s.%N)
  case "$scenario" in
    worker_kill9) kill -9 "$(cat "$tmp/pid.3")" ;;
    agent_kill9) kill -9 "${agents[1]}" ;;
    blackhole)
      "$cluster" exec "$name" 1 iptables -A INPUT ! -i lo -j DROP
      "$cluster" exec "$name" 1 iptables -A OUTPUT ! -o lo -j DROP ;;
    sigstop) kill -STOP "$(cat "$tmp/pid.2")" ;;
    sigstop_host) kill -STOP "$(cat "$tmp/pid.2")" "$(cat "$tmp/pid.3")" ;;
    sigstop_member) kill -STOP "$(cat "$tmp/pid.3")" ;;
    *) echo "unknown scenario $scenario" >&2; exit 2 ;;
  esac
  # The job must end: every agent exits, non-zero, within the budget (a watchdog kills stragglers).
  rcs=()
  for i in 0 1; do
    rc=0
    timeout $((budget_s + 20)) tail --pid="${agents[$i]}" -f /dev/null || true
    wait "${agents[$i]}" || rc=$?
    rcs+=("$rc")
  done
  took=$(awk -v a="$(date +%s.%N)" -v b="$t0" 'BEGIN { printf "%.1f", a - b }')
  agents=()
  [[ "$scenario" == blackhole ]] && { "$cluster" exec "$name" 1 iptables -F; }
  cat "$tmp"/agent*.out > "$tmp/all.out"
  echo "== $scenario: job ended in ${took}s (agent exits: ${rcs[*]}); what the ranks said:"
  grep -E "kft: rank|^kftrun\[" "$tmp/all.out" | cut -c1-400 | head -12
  [[ "${rcs[0]}" != 0 ]] || fail "node 0's agent exited 0"
  [[ "$scenario" == agent_kill9 || "${rcs[1]}" != 0 ]] || fail "node 1's agent exited 0"
  awk -v t="$took" -v b="$budget_s" 'BEGIN { exit !(t <= b) }' || fail "the job took ${took}s to end, more than the deadline ${deadline_s}s + 5s"
  # The culprit: kftrun names a dead worker or agent; the ranks' errors name the rank(s) on
  # host 1 that fell silent (a stopped rank, a host cut off).
  case "$scenario" in
    worker_kill9) want="rank 3 \\(local rank 1, node 1\\) on $name-h1 was killed by signal 9|recorded no failure.*rank 3 \\($name-h1\\)" ;;
    # (a killed agent's store connection closes: node 0 says it is gone; a cut-off one is silent)
    agent_kill9) want="the agent of node 1 on $name-h1 is gone|recorded no failure.*rank [23] \\($name-h1\\)" ;;
    blackhole) want="the agent of node 1 on $name-h1 stopped sending heartbeats|recorded no failure.*rank [23] \\($name-h1\\)" ;;
    sigstop) want="rank 2 \\($name-h1\\)|job rank 2([^0-9]|\$)" ;;
    sigstop_host) want="rank [23] \\($name-h1\\)|job rank [23]([^0-9]|\$)" ;;
    sigstop_member) want="rank 3 \\($name-h1\\)|job rank 3([^0-9]|\$)" ;;
  esac
  grep -Eq "$want" "$tmp/all.out" || fail "no error names the culprit (/$want/)"
  # A stopped rank is silent, not dead: the ranks that wait for it, directly or through a rank
  # that is itself waiting for it (rank 0 inside the Gloo allreduce of rail 0 while rank 1
  # waits for it in the node's allgather), must each name it, never only the rank in between.
  if [[ "$scenario" == sigstop* ]]; then
    errors=$(grep -E "^\[[0-9]+\]: kft: rank [0-9]+/4 " "$tmp/all.out" || true)
    [[ -n "$errors" ]] || fail "no rank reported an error"
    while IFS= read -r line; do
      grep -Eq "$want" <<<"$line" || fail "an error does not name a stopped rank (/$want/): $line"
    done <<<"$errors"
  fi
  # The flight recorders' dumps, read by kft-trace: the stopped rank(s) named, no other, and the
  # chain of waits from host 0 followed to them.
  if [[ "$scenario" == sigstop* ]]; then
    "$kft_trace" "$tmp/trace" | sed 's/^/   kft-trace: /' | cut -c1-300
    "$kft_trace" --json "$tmp/trace" > "$tmp/trace.json" || fail "kft-trace could not read the dumps"
    case "$scenario" in
      sigstop) stopped="2" across=1 ;;
      sigstop_host) stopped="2 3" across=0 ;;
      sigstop_member) stopped="3" across=1 ;;
    esac
    python3 - "$tmp/trace.json" "$stopped" "$across" <<'PY' || fail "kft-trace did not name the stopped rank(s)"
import json, sys
r = json.load(open(sys.argv[1]))
stopped = sorted(int(x) for x in sys.argv[2].split())
across = sys.argv[3] == "1"
culprits = sorted(c["rank"] for c in r["culprits"])
ok = culprits == stopped
print(f"   kft-trace culprits {culprits}, want {stopped}: {'ok' if ok else 'WRONG'}")
ends = sorted({c[-1] for c in r["chains"]})
ok_ends = bool(ends) and set(ends) <= set(stopped)
print(f"   chains {r['chains']} end at {ends}: {'ok' if ok_ends else 'WRONG'}")
# (a chain from host 0's ranks 0 or 1, through a rank that waits in turn, to the stopped one)
ok_chain = not across or any(len(c) >= 3 and c[0] in (0, 1) and c[-1] in stopped for c in r["chains"])
print(f"   a chain from host 0 through a waiting rank to the stopped one: {'ok' if ok_chain else 'WRONG'}")
sys.exit(0 if ok and ok_ends and ok_chain else 1)
PY
  fi
  # Nothing left behind: no worker process, no new shared-memory segment.
  sleep 0.5
  if pgrep -f "$worker $tmp" >/dev/null; then fail "worker processes are left: $(pgrep -af "$worker $tmp")"; fi
  shm_after=$(ls /dev/shm | sort)
  left=$(comm -13 <(echo "$shm_before") <(echo "$shm_after") | grep kft || true)
  [[ -z "$left" ]] || fail "shared-memory segments left in /dev/shm: $left"
  echo "   ok: ended within ${took}s <= ${budget_s}s, culprit named, nothing left"
done
echo "all Gloo fault scenarios passed: ${scenarios[*]}"

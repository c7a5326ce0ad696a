#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Going on without a lost rank across network-namespace hosts (issue 46): shared memory per
# host + Gloo between hosts, ranks started by hand (rank 0 hosts the store), allreducing
# (tests/netns/gloo_shrink_worker.cpp). After the fault the survivors shrink their process group
# (they agree through the store and build the group again over themselves) and check it:
#   rank3     2 hosts x 2 ranks, rank 3 (host 1) killed: ranks 0,1,2 go on
#   host1     2 hosts x 2 ranks, both ranks of host 1 killed: ranks 0,1 go on
#             (in both: the survivors together knew every victim was gone, so none waited out the
#             agreement's window; the time from the death to the new group is printed)
#   cut       3 hosts x 1 rank, the link between hosts 1 and 2 cut (iptables), both still reach
#             the store on host 0: one membership or clear errors, never two groups that work
#   trainer   2 hosts x 2 ranks of the DDP trainer in deterministic mode
#             (tests/integration/trainer_shrink_worker.cpp), rank 2 killed in step 5: the
#             survivors finish on the bits of an uninterrupted run across the same hosts
#
#   heal      the trainer case under two kftrun agents with --on-failure heal: node 1's agent
#             starts a replacement for rank 2, which joins the running group across the hosts at a
#             step boundary; all 4 ranks end on the uninterrupted run's bits
#   kftrun    the rank3 case under two kftrun agents with --on-failure continue: both exit 0
#   agent     node 1's kftrun agent killed (its workers die with it): node 0's agent goes on
#             without it, its two ranks shrink to a group of 2 and the job exits 0
#
#   gloo-shrink.sh <gloo_shrink_worker> <trainer_shrink_worker> <kftrun> [scenario...]
#
# Exit 77 (skip) when namespaces cannot be created.
set -euo pipefail
trap 'echo "$(basename "$0"): line $LINENO: a command failed (exit $?)" >&2' ERR
worker=$1 trainer=$2 kftrun=$3; shift 3
scenarios=("$@")
((${#scenarios[@]})) || scenarios=(rank3 host1 cut trainer heal kftrun agent)
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/netns-cluster.sh"
name="kfts$$"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  pkill -9 -f "$worker $tmp" 2>/dev/null || true
  pkill -9 -f "$trainer $tmp" 2>/dev/null || true
  pkill -9 -f "kftrun.*$worker $tmp" 2>/dev/null || true
  pkill -9 -f "kftrun.*$trainer $tmp" 2>/dev/null || true
  "$cluster" down "$name"
  rm -rf "$tmp"
}
trap cleanup EXIT
"$cluster" up "$name" 3 || exit $?   # 77 passes through as a skip
command -v iptables >/dev/null || { echo "gloo-shrink: iptables is not installed (Debian: apt-get install iptables)" >&2; exit 1; }
master=$("$cluster" addr "$name" 0)
shm_before=$(ls /dev/shm | sort)

fail() {
  echo "FAILED ($scenario): $*" >&2
  for f in "$tmp"/rank*.out "$tmp"/agent*.out; do [[ -e "$f" ]] || continue; echo "--- $f" >&2; tail -n 20 "$f" >&2; done
  exit 1
}

port=29700
# start HOSTS PER PROGRAM ARGS...: every rank in its host's namespace, rank 0 hosting the store.
start() {
  local hosts=$1 per=$2; shift 2
  local world=$((hosts * per)) r h
  port=$((port + 1))
  for ((r = 0; r < world; r++)); do
    h=$((r / per))
    "$cluster" exec "$name" "$h" env RANK=$r WORLD_SIZE=$world LOCAL_RANK=$((r % per)) LOCAL_WORLD_SIZE=$per \
      GROUP_RANK=$h GROUP_WORLD_SIZE=$hosts MASTER_ADDR="$master" MASTER_PORT=$port KFT_INTER_NODE=gloo \
      KFT_RDZV_TOKEN="gloo-shrink-$$" KFT_RUN_ID="s$scenario$port" KFT_TIMEOUT=20s "$@" > "$tmp/rank$r.out" 2>&1 &
    pids+=($!)
  done
}
finish() {  # waits for every rank; their exit statuses in rcs
  rcs=()
  for p in "${pids[@]}"; do
    rc=0
    timeout 90 tail --pid="$p" -f /dev/null || true
    wait "$p" || rc=$?
    rcs+=("$rc")
  done
  pids=()
}
trainer_hashes() { grep -ho "trainer_shrink: rank [0-9]* of [0-9]* hash [0-9]* steps [0-9]*" "$tmp"/rank*.out | sort || true; }
ref_hash=""  # the uninterrupted 2 x 2 trainer run's hash
reference() {
  [[ -z "$ref_hash" ]] || return 0
  rm -f "$tmp"/rank*.out "$tmp"/seen.*
  pids=()
  start 2 2 "$trainer" "$tmp" -1 0 deterministic
  finish
  local ref
  ref=$(trainer_hashes)
  [[ "${rcs[*]}" == "0 0 0 0" && $(wc -l <<<"$ref") == 4 ]] || fail "the uninterrupted run (exits ${rcs[*]}): $ref"
  ref_hash=$(awk '{print $7}' <<<"$ref" | sort -u)
  [[ $(wc -l <<<"$ref_hash") == 1 ]] || fail "the uninterrupted run's ranks differ: $ref"
}
for scenario in "${scenarios[@]}"; do
  if [[ "$scenario" == kftrun || "$scenario" == agent ]]; then
    rm -f "$tmp"/pid.* "$tmp"/agent*.out "$tmp"/death
    pids=()
    port=$((port + 1))
    victims=$([[ "$scenario" == kftrun ]] && echo 3 || echo "")
    for i in 0 1; do
      "$cluster" exec "$name" "$i" env KFT_RDZV_TOKEN="gloo-shrink-$$" "$kftrun" --nnodes 2 --node-rank "$i" \
        --master-addr "$master" --master-port "$port" --nproc-per-node 2 --on-failure continue --exit-grace 0 \
        --run-id "k$scenario$port" -- "$worker" "$tmp" 3 ${victims:+"$victims"} ${victims:+200} > "$tmp/agent$i.out" 2>&1 &
      pids+=($!)
    done
    for _ in $(seq 1 300); do
      [[ $(cat "$tmp"/agent*.out 2>/dev/null | grep -c "ready rank" || true) == 4 ]] && break
      sleep 0.1
    done
    [[ $(cat "$tmp"/agent*.out | grep -c "ready rank") == 4 ]] || fail "the 4 ranks did not start under kftrun"
    if [[ "$scenario" == agent ]]; then
      sleep 0.5
      kill -9 "$(pgrep -f -- "--node-rank 1 .*--run-id kagent$port" | head -1)"
    fi
    finish
    cat "$tmp"/agent*.out > "$tmp/all.out"
    echo "== $scenario: agent exits ${rcs[*]}"
    grep -E "gloo_shrink|kftrun\[" "$tmp/all.out" | cut -c1-300 || true
    if [[ "$scenario" == kftrun ]]; then
      [[ "${rcs[*]}" == "0 0" ]] || fail "the agents exited ${rcs[*]}, not 0 0"
      grep -q "rank 3 (local rank 1) was killed by signal 9 (SIGKILL); the other workers go on" "$tmp/agent1.out" ||
        fail "node 1's agent does not say rank 3 was lost and the others go on"
      [[ $(grep -c "gloo_shrink: rank [012] ok" "$tmp/all.out") == 3 ]] || fail "ranks 0, 1 and 2 did not all go on"
    else
      [[ "${rcs[0]}" == 0 ]] || fail "node 0's agent exited ${rcs[0]}, not 0"
      grep -q "the agent of node 1 on $name-h1 is gone (its connection to the store closed); the other nodes go on" \
        "$tmp/agent0.out" || fail "node 0's agent does not say node 1's agent is gone and it goes on"
      grep -q "gloo_shrink: rank 0 -> 0 of 2, members 0,1" "$tmp/all.out" && grep -q "gloo_shrink: rank 1 ok" "$tmp/all.out" ||
        fail "ranks 0 and 1 did not go on as a group of 2"
    fi
    echo "   ok: the job went on under kftrun --on-failure continue"
    continue
  fi
  if [[ "$scenario" == heal ]]; then
    reference
    rm -f "$tmp"/rank*.out "$tmp"/seen.* "$tmp"/agent*.out
    pids=()
    port=$((port + 1))
    for i in 0 1; do
      "$cluster" exec "$name" "$i" env KFT_RDZV_TOKEN="gloo-shrink-$$" KFT_INTER_NODE=gloo KFT_TIMEOUT=20s "$kftrun" \
        --nnodes 2 --node-rank "$i" --master-addr "$master" --master-port "$port" --nproc-per-node 2 \
        --on-failure heal --max-restarts 1 --exit-grace 0 --run-id "kheal$port" -- \
        "$trainer" "$tmp" 2 5 deterministic > "$tmp/agent$i.out" 2>&1 &
      pids+=($!)
    done
    finish
    cat "$tmp"/agent*.out > "$tmp/rank.all.out"
    got=$(trainer_hashes)
    echo "== heal: agent exits ${rcs[*]}"
    grep -hE "lost rank|joined|replacement" "$tmp"/agent*.out | cut -c1-300 || true
    echo "$got"
    [[ "${rcs[*]}" == "0 0" ]] || fail "the agents exited ${rcs[*]}, not 0 0"
    grep -q "a replacement joins them at a step boundary (--on-failure heal" "$tmp/agent1.out" ||
      fail "node 1's agent does not say it started a replacement for rank 2"
    grep -q "step [0-9]*: rank(s) 2 joined; going on with 4 rank(s)" "$tmp/rank.all.out" ||
      fail "the trainer does not say rank 2 joined"
    [[ $(wc -l <<<"$got") == 4 && $(awk '$5 == 4 && $9 == 20' <<<"$got" | wc -l) == 4 ]] ||
      fail "all 4 ranks, the replacement included, should end as a group of 4 after 20 steps: $got"
    [[ $(awk '{print $7}' <<<"$got" | sort -u) == "$ref_hash" ]] ||
      fail "the healed run did not end on the uninterrupted run's bits ($ref_hash): $got"
    echo "   ok: rank 2's replacement joined across the hosts; all 4 ranks ended on the uninterrupted run's bits"
    continue
  fi
  if [[ "$scenario" == trainer ]]; then
    reference
    rm -f "$tmp"/rank*.out "$tmp"/seen.*
    start 2 2 "$trainer" "$tmp" 2 5 deterministic
    finish
    got=$(trainer_hashes)
    echo "== trainer: exits ${rcs[*]}"
    grep -h "lost rank" "$tmp"/rank*.out | cut -c1-300 || true
    echo "$got"
    for r in 0 1 3; do [[ "${rcs[$r]}" == 0 ]] || fail "survivor rank $r exited ${rcs[$r]}"; done
    [[ $(wc -l <<<"$got") == 3 && $(awk '$5 == 3 && $9 == 20' <<<"$got" | wc -l) == 3 ]] ||
      fail "ranks 0, 1 and 3 should end as a group of 3 after 20 steps: $got"
    [[ $(awk '{print $7}' <<<"$got" | sort -u) == "$ref_hash" ]] ||
      fail "the survivors did not end on the uninterrupted run's bits ($ref_hash): $got"
    grep -q "step 5: lost rank(s) 2 of 4" "$tmp"/rank*.out || fail "no rank says rank 2 was lost in step 5"
    echo "   ok: ranks 0, 1, 3 went on across the hosts and ended on the uninterrupted run's bits"
    continue
  fi
  rm -f "$tmp"/pid.* "$tmp"/rank*.out "$tmp"/death
  pids=()
  case "$scenario" in
    rank3) hosts=2 per=2 victims=3 ;;
    host1) hosts=2 per=2 victims=2,3 ;;
    cut) hosts=3 per=1 victims="" ;;
    *) echo "unknown scenario $scenario" >&2; exit 2 ;;
  esac
  world=$((hosts * per))
  start "$hosts" "$per" "$worker" "$tmp" 3 ${victims:+"$victims"} ${victims:+200}
  for _ in $(seq 1 300); do
    [[ $(cat "$tmp"/rank*.out 2>/dev/null | grep -c "^ready rank" || true) == "$world" ]] && break
    sleep 0.1
  done
  [[ $(cat "$tmp"/rank*.out | grep -c "^ready rank") == "$world" ]] || fail "the $world ranks did not start"
  grep -q "Gloo between nodes" "$tmp/rank0.out" || fail "the group is not Gloo's"
  if [[ "$scenario" == cut ]]; then
    sleep 0.5
    date +%s%3N > "$tmp/death"
    h2=$("$cluster" addr "$name" 2)
    "$cluster" exec "$name" 1 iptables -A INPUT -s "$h2" -j DROP
    "$cluster" exec "$name" 1 iptables -A OUTPUT -d "$h2" -j DROP
  fi
  finish
  [[ "$scenario" != cut ]] || "$cluster" exec "$name" 1 iptables -F
  cat "$tmp"/rank*.out > "$tmp/all.out"
  echo "== $scenario: exits ${rcs[*]}"
  grep -E "^gloo_shrink|allreduce failed|^rank [0-9]+: kft" "$tmp/all.out" | cut -c1-300 || true
  case "$scenario" in
    rank3|host1)
      want=$([[ "$scenario" == rank3 ]] && echo "0,1,2" || echo "0,1")
      survivors=$(tr ',' ' ' <<<"$want")
      for r in $survivors; do
        [[ "${rcs[$r]}" == 0 ]] || fail "survivor rank $r exited ${rcs[$r]}"
        grep -q "^gloo_shrink: rank $r -> [0-9] of $(wc -w <<<"$survivors"), members $want, generation 1" "$tmp/rank$r.out" ||
          fail "rank $r does not report the membership $want"
        grep -q "^gloo_shrink: rank $r ok" "$tmp/rank$r.out" || fail "rank $r's new group did not check out"
      done
      # What the survivors knew was lost when their calls failed, together: every victim. Each
      # files it with its arrival, so they decide as soon as they have all come instead of
      # waiting out the agreement's 1 s window (host1: each host-0 rank sees only its rail
      # peer's connection close; nobody sees the other victim's process).
      knew=$(grep -ho "knew lost: [0-9,]*" "$tmp/all.out" | sed 's/knew lost: //' | tr ',' '\n' | { grep . || true; } | sort -un | paste -sd, -)
      [[ "$knew" == "$victims" ]] || fail "the survivors together knew ${knew:-no rank} lost, not $victims"
      # detection and the new group, after the death (one clock across the namespaces)
      worst=$(grep -ho "shrunk [0-9-]* ms after" "$tmp/all.out" | awk '{print $2}' | sort -n | tail -1)
      echo "   ok: survivors $want, knowing $knew lost; the new group ${worst} ms after the death at the latest" ;;
    cut)
      # One job at most: every "ok" rank reports the same membership; the others exited with an error.
      oks=$( (grep -l "^gloo_shrink: rank [0-9]* ok" "$tmp"/rank*.out || true) | wc -l)
      memberships=$( (grep -ho "members [0-9,]*" "$tmp/all.out" || true) | sort -u | wc -l)
      ok_memberships=$(for f in "$tmp"/rank*.out; do
        if grep -q "^gloo_shrink: rank [0-9]* ok" "$f"; then grep -ho "members [0-9,]*" "$f"; fi; done | sort -u | wc -l)
      ((ok_memberships <= 1)) || fail "two groups work: $(grep -h "members" "$tmp/all.out")"
      ((memberships <= 1)) || fail "the ranks read different memberships: $(grep -h "members" "$tmp/all.out")"
      for i in "${!rcs[@]}"; do
        if [[ "${rcs[$i]}" != 0 ]]; then grep -q "kft: " "$tmp/rank$i.out" || fail "rank $i exited ${rcs[$i]} without kft's error"; fi
      done
      echo "   ok: $oks rank(s) went on in $ok_memberships membership(s); the others ended with kft's error" ;;
  esac
  sleep 0.3
  if pgrep -f "$worker $tmp" >/dev/null; then fail "worker processes are left: $(pgrep -af "$worker $tmp")"; fi
  left=$(comm -13 <(echo "$shm_before") <(ls /dev/shm | sort) | grep kft || true)
  [[ -z "$left" ]] || fail "shared-memory segments left in /dev/shm: $left"
done
echo "all Gloo shrink scenarios passed: ${scenarios[*]}"

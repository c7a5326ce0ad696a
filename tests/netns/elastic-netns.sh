#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# An elastic job (kftrun --nnodes 2:3) of the DDP trainer across three network-namespace hosts,
# Gloo between them: the agent of host 2 is killed -9 mid-training, the job goes on with hosts
# 0 and 1 from the last checkpoint, then host 2's agent comes back and is taken in at the next
# round. The trainer runs in deterministic mode (96 samples per step in 6 fixed shards: the same
# bits on 1, 2 or 3 ranks), so the parameters the elastic job ends with must be, to the bit,
# those of one process trained straight through: the job kept its place in the data (the
# checkpoint's global sample cursor) across both changes of world size.
#
#   elastic-netns.sh <kftrun> <05-fashion-mnist>
#
# Exit 77 (skip) when namespaces cannot be created.
set -euo pipefail
trap 'echo "$(basename "$0"): line $LINENO: a command failed (exit $?)" >&2' ERR
kftrun=$1 demo=$2
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/netns-cluster.sh"
name="kfte$$"
tmp=$(mktemp -d)
agents=()
cleanup() {
  for p in "${agents[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  pkill -9 -f "$demo .*$tmp" 2>/dev/null || true
  "$cluster" down "$name"
  rm -rf "$tmp"
}
trap cleanup EXIT
"$cluster" up "$name" 3 || exit $?   # 77 passes through as a skip
master=$("$cluster" addr "$name" 0)
export KFT_RDZV_TOKEN="elastic-$$-$RANDOM"
steps=360
model=(--threads 1 --deterministic --global-batch 96 --micro-shards 6 --max-steps "$steps" --epochs 1 --evals-per-epoch 1)
train=("${model[@]}" --checkpoint-dir "$tmp/ckpt" --checkpoint-every 20 --resume)
mkdir "$tmp/ckpt"

fail() {
  echo "FAILED: $*" >&2
  for f in "$tmp"/agent*.out; do echo "--- $f" >&2; tail -n 25 "$f" >&2; done
  exit 1
}
agent() {  # agent <host> <output>
  "$cluster" exec "$name" "$1" "$kftrun" --nnodes 2:3 --node-rank "$1" --master-addr "$master" --master-port 29500 \
    --nproc-per-node 1 --heartbeat-timeout 2 --rdzv-last-call 1 --max-restarts 2 --run-id elastic \
    -- "$demo" "${train[@]}" --log-json "$tmp/log.jsonl" > "$2" 2>&1 &
  agents+=($!)
}
wait_for() {  # wait_for <seconds> <what> <command...>: polls until the command succeeds
  local limit=$1 what=$2; shift 2
  local t0=$SECONDS
  until "$@"; do
    ((SECONDS - t0 < limit)) || fail "$what: not within $limit s"
    sleep 0.1
  done
  echo "$what ($((SECONDS - t0)) s)"
}
checkpoints() { grep -c '"event":"checkpoint"' "$tmp/log.jsonl" 2>/dev/null || true; }
more_checkpoints() { (($(checkpoints) >= $1)); }

# The reference: one process, straight through.
"$demo" "${model[@]}" --log-json "$tmp/ref.jsonl" > "$tmp/ref.out" 2>&1 ||
  { cat "$tmp/ref.out" >&2; fail "the reference run"; }
ref=$(grep '"event":"summary"' "$tmp/ref.jsonl" | sed 's/.*"parameters_hash":"\([0-9]*\)".*/\1/')
echo "reference: $steps steps on 1 rank, parameters hash $ref"

agent 0 "$tmp/agent0.out"
agent 1 "$tmp/agent1.out"
agent 2 "$tmp/agent2.out"
wait_for 60 "round 0 formed with 3 nodes" grep -q "round 0: 3 node(s)" "$tmp/agent0.out"
wait_for 30 "the trainer runs over Gloo between the hosts" grep -q "Gloo between nodes" "$tmp/agent0.out"
wait_for 120 "round 0 wrote 2 checkpoints" more_checkpoints 2
n0=$(checkpoints)
kill -9 "${agents[2]}"
t_kill=$SECONDS
wait_for 20 "after kill -9 of host 2's agent, round 1 formed with 2 nodes" grep -q "round 1: 2 node(s)" "$tmp/agent0.out"
# (the survivors' collectives fail at once when host 2's rank dies with its agent: that is the
# round's first failure, before node 2's heartbeats are missed)
grep -q "restarting all workers (restart 1 of 2) after:" "$tmp/agent0.out" || fail "node 0 does not restart the workers"
wait_for 120 "round 1 resumed and wrote 2 more checkpoints" more_checkpoints $((n0 + 2))
grep -q 'resumed from .* written by 3 rank(s), resumed on 2' "$tmp/agent0.out" ||
  fail "round 1 did not resume from round 0's checkpoint on 2 ranks"
agent 2 "$tmp/agent2b.out"
wait_for 20 "host 2 came back: round 2 formed with 3 nodes" grep -q "round 2: 3 node(s)" "$tmp/agent0.out"
grep -q "re-forming the job (round 2): node 2 on $name-h2 asked to join" "$tmp/agent0.out" ||
  fail "node 0 does not say why round 1 ended"

status=0
for i in 0 1 3; do
  rc=0
  wait "${agents[$i]}" || rc=$?
  ((rc == 0)) || status=1
done
agents=()
((status == 0)) || fail "an agent of the elastic job did not exit 0"
grep -q 'resumed from .* written by 2 rank(s), resumed on 3' "$tmp/agent0.out" ||
  fail "round 2 did not resume on 3 ranks"
got=$(grep '"event":"summary"' "$tmp/log.jsonl" | tail -1 | sed 's/.*"parameters_hash":"\([0-9]*\)".*/\1/')
echo "elastic job: rounds of 3, 2 and 3 nodes, $(checkpoints) checkpoints, parameters hash $got"
[[ -n "$got" && "$got" == "$ref" ]] || fail "the elastic job ends with other parameters ($got) than one process straight through ($ref)"
left=$(pgrep -f "$demo .*$tmp" || true)
[[ -z "$left" ]] || fail "processes left: $left"
echo "elastic-netns: the job lost a node and took it back, and ended on the reference's bits"

#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# CPU collectives across nodes without MPI: one kftrun agent per "host", Gloo over TCP between
# hosts, shared memory inside each. Runs the conformance binary (tests/conformance/launched.cpp:
# the Gloo communicator and the factory's process group, every dtype/op/size, results compared
# bit for bit across ranks): the namespace form on 2 hosts x 2 ranks and 3 hosts x 1 rank, the
# loopback form on the uneven 2 + 1 (and the namespace form too with `all`).
#
#   gloo-netns.sh netns    <kftrun> <test_conformance_launched> [all]   # network-namespace hosts (root)
#   gloo-netns.sh loopback <kftrun> <test_conformance_launched>         # one machine split by KFT_HOST_ID
#
# netns exits 77 (skip) only when namespaces cannot be created.
set -euo pipefail
trap 'echo "$(basename "$0"): line $LINENO: a command failed (exit $?)" >&2' ERR
mode=$1 kftrun=$2 prog=$3
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/netns-cluster.sh"
name="kftg$$"
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  [[ "$mode" == netns ]] && "$cluster" down "$name"
  rm -rf "$tmp"
}
trap cleanup EXIT
if [[ "$mode" == netns ]]; then
  "$cluster" up "$name" 3 || exit $?   # 77 passes through as a skip
fi
export KFT_RDZV_TOKEN="gloo-netns-$$-$RANDOM"

free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run() {  # <expected layout> <ranks per host...>
  local expect=$1; shift
  local nodes=$# world=0 i=0 master port
  for n in "$@"; do world=$((world + n)); done
  if [[ "$mode" == netns ]]; then master=$("$cluster" addr "$name" 0); port=29500
  else master=127.0.0.1; port=$(free_port); fi
  echo "== $expect: $nodes kftrun agents ($*), Gloo between hosts, store at $master:$port"
  pids=()
  rm -f "$tmp"/agent*.out
  for n in "$@"; do
    local cmd=(env "KFT_TEST_EXPECT_GROUP=Gloo between nodes" "$kftrun" --nnodes "$nodes"
               --node-rank "$i" --master-addr "$master" --master-port "$port" --nproc-per-node "$n"
               --run-id "gloo$$" -- "$prog" --log_level=error --report_level=short --color_output=false)
    if [[ "$mode" == netns ]]; then
      "$cluster" exec "$name" "$i" "${cmd[@]}" > "$tmp/agent$i.out" 2>&1 &
    else
      KFT_HOST_ID="host$i" "${cmd[@]}" > "$tmp/agent$i.out" 2>&1 &
    fi
    pids+=($!)
    i=$((i + 1))
  done
  local failed=0
  for ((i = 0; i < nodes; i++)); do
    if ! wait "${pids[$i]}"; then echo "FAILED: agent $i exited non-zero" >&2; failed=1; fi
  done
  pids=()
  cat "$tmp"/agent*.out > "$tmp/all.out"
  grep -E "group: |Test module .* has (passed|failed)|error: in|failed" "$tmp/all.out" | sort | uniq -c | head -40
  local ok cases
  ok=$(grep -c "No errors detected\|has passed with" "$tmp/all.out" || true)
  if [[ "$ok" != "$world" || "$failed" != 0 ]]; then
    echo "FAILED: $ok of $world ranks passed for '$expect'" >&2
    tail -50 "$tmp/all.out" >&2
    exit 1
  fi
  if ! grep -q "group: shared memory per node + Gloo between nodes (TCP on .*): $expect" "$tmp/all.out"; then
    echo "FAILED: the group is not '... Gloo between nodes ...: $expect'" >&2
    grep "group: " "$tmp/all.out" >&2 || true
    exit 1
  fi
  cases=$(grep -o "[0-9]* test cases out of [0-9]* passed" "$tmp/all.out" | head -1 || true)
  echo "   $world of $world ranks passed ($cases)"
}
# The namespace hosts run the even layouts, 2 x 2 (shared memory inside each host) and 3 x 1 (a
# Gloo ring of three hosts); the loopback form (KFT_HOST_ID splitting one machine, for those who
# cannot make namespaces) runs the uneven one, 2 + 1. The suite runs both forms (~18 s a layout).
# Run by hand, `gloo-netns.sh netns ... all` adds the uneven layout between namespace hosts.
if [[ "$mode" == netns ]]; then
  run "2 nodes x 2 ranks" 2 2
  run "3 nodes x 1 rank" 1 1 1
fi
if [[ "$mode" != netns || "${4:-}" == all ]]; then
  run "2 nodes, uneven: 2+1" 2 1
fi
echo "all Gloo layouts passed ($mode)"

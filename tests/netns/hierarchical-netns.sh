#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Real multi-node runs on one machine: network-namespace "hosts" (tests/netns/netns-cluster.sh),
# Open MPI started across them through an rsh agent that enters each namespace, shared memory
# inside a host and TCP between hosts. Checks the node layout kft sees and the allreduce results
# for 2 hosts x 2 ranks, 3 hosts x 1 rank and the uneven 2 + 1.
#
#   hierarchical-netns.sh <test_hierarchical binary>
#
# Exit 77 (skip) only when namespaces cannot be created.
set -euo pipefail
prog=$1
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/netns-cluster.sh"
name="kfth$$"
cleanup() { "$cluster" down "$name"; rm -rf "$tmp"; }
tmp=$(mktemp -d)
trap cleanup EXIT
"$cluster" up "$name" 3 || exit $?   # 77 passes through as a skip

a0=$("$cluster" addr "$name" 0)
net="${a0%.*}.0/24"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
run() {  # <expected layout> <np> <slots per host...>
  local expect=$1 np=$2; shift 2
  : > "$tmp/hosts"
  local i=0
  for s in "$@"; do echo "$("$cluster" addr "$name" $i) slots=$s" >> "$tmp/hosts"; i=$((i + 1)); done
  echo "== $expect: mpirun -np $np over $(paste -sd' ' "$tmp/hosts")"
  timeout 300 mpirun --hostfile "$tmp/hosts" -np "$np" \
    --mca plm_rsh_agent "$cluster agent $name" \
    --mca oob_tcp_if_include "$net" --mca btl_tcp_if_include "$net" --mca btl self,vader,tcp \
    -x "KFT_TEST_EXPECT_LAYOUT=$expect" \
    "$prog" --run_test=host_id_from_the_environment --log_level=message --color_output=false 2>&1 | tee "$tmp/out"
  # every rank ran the case and passed (Boost prints one line per process)
  local ok
  ok=$(grep -c "No errors detected" "$tmp/out" || true)
  if [[ "$ok" != "$np" ]]; then
    echo "FAILED: $ok of $np ranks passed for '$expect'" >&2
    exit 1
  fi
}
run "2 nodes x 2 ranks" 4 2 2
run "3 nodes x 1 rank" 3 1 1 1
run "2 nodes, uneven: 2+1" 3 2 1
grep -q "nodes hold different numbers of ranks" "$tmp/out" || { echo "FAILED: no fallback warning for 2+1" >&2; exit 1; }
echo "all netns layouts passed"

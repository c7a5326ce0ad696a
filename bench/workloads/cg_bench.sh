#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Example 06's CG solver: iterations per second with kft's allreduce vs MPI_Allreduce for its two
# dot products per iteration (8-byte allreduces: the latency case), in one run per layout. Each
# row is one `mpirun ... 06-poisson-cg --allreduce both`: the two solves alternate, --rounds
# times each, and the fastest of each is reported.
#
#   bash bench/workloads/cg_bench.sh [build dir] [ranks list] [grid sizes] [rounds] [netns hosts]
#   bash bench/workloads/cg_bench.sh build "2 3 4" "64 128 256 512" 5 2
#
# One machine with 2, 3, 4 ranks, then (when netns hosts > 0, root, iproute2) the same across
# that many network-namespace "hosts" (tests/netns/netns-cluster.sh, 2 ranks each, unthrottled
# veth links; MPI between the hosts over TCP, shared memory inside each). The "hosts" share this
# machine's cores, which Open MPI cannot see from the host file: mpi_yield_when_idle keeps its
# busy polling from starving the other ranks (what --oversubscribe does on one host).
set -euo pipefail
build=${1:-build}; ranks=${2:-"2 3 4"}; sizes=${3:-"64 128 256 512"}; rounds=${4:-5}; hosts=${5:-2}
here=$(cd "$(dirname "$0")" && pwd)
cg="$(cd "$build" && pwd)/examples/06-poisson-cg"
[[ -x "$cg" ]] || { echo "cg_bench: $cg is not built (needs MPI and CLI11)" >&2; exit 2; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

row() {  # layout, n, then the mpirun command: prints one table row, fails with the solver's output
  local layout=$1 n=$2 out
  shift 2
  if ! out=$("$@" 2>&1); then
    echo "cg_bench: $layout, n=$n failed:" >&2
    echo "$out" >&2
    exit 1
  fi
  local it kft mpi
  it=$(sed -n 's/.*kft allreduce: converged in \([0-9]*\) iterations.*/\1/p' <<<"$out")
  kft=$(sed -n 's/.*kft allreduce: .* \([0-9]*\) iterations\/s$/\1/p' <<<"$out")
  mpi=$(sed -n 's/.*mpi allreduce: .* \([0-9]*\) iterations\/s$/\1/p' <<<"$out")
  awk -v l="$layout" -v n="$n" -v it="$it" -v k="$kft" -v m="$mpi" \
    'BEGIN { printf "| %s | %d | %s | %s | %s | %.2f |\n", l, n, it, k, m, k / m }'
}

echo "# 06-poisson-cg, tol 1e-8, fastest of $rounds solves each; CPU: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores"
echo "| layout | n | iterations | kft it/s | MPI_Allreduce it/s | kft / MPI |"
echo "| --- | --- | --- | --- | --- | --- |"
for p in $ranks; do
  for n in $sizes; do
    row "1 host x $p ranks" "$n" mpirun -np "$p" --oversubscribe "$cg" --n "$n" --rounds "$rounds"
  done
done

if ((hosts > 0)); then
  cluster="$here/../../tests/netns/netns-cluster.sh"
  name="kftcg$$"
  tmp=$(mktemp -d)
  trap '"$cluster" down "$name" >/dev/null 2>&1; rm -rf "$tmp"' EXIT
  rc=0
  "$cluster" up "$name" "$hosts" >/dev/null || rc=$?
  if ((rc == 77)); then
    echo "cg_bench: no network namespaces here (needs root): across-host rows skipped" >&2
    exit 0
  fi
  ((rc == 0)) || exit "$rc"
  for ((i = 0; i < hosts; i++)); do echo "$("$cluster" addr "$name" $i) slots=2"; done > "$tmp/hosts"
  a0=$("$cluster" addr "$name" 0)
  net="${a0%.*}.0/24"
  for n in $sizes; do
    row "$hosts hosts x 2 ranks" "$n" mpirun --hostfile "$tmp/hosts" -np $((hosts * 2)) \
      --mca plm_rsh_agent "$cluster agent $name" --mca oob_tcp_if_include "$net" --mca btl_tcp_if_include "$net" \
      --mca btl self,vader,tcp --mca mpi_yield_when_idle 1 "$cg" --n "$n" --rounds "$rounds"
  done
fi

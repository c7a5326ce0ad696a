#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# allreduce across network-namespace "hosts" on one machine, with each host's link throttled:
# kft hierarchical vs kft flat vs MPI_Allreduce, and the bytes each node sent (its interface
# counters), in one run. Needs root, iproute2 (tc) and a built tree.
#
# Open MPI's TCP transport moves one direction at a time over a single connection between two
# ranks (measured: a 2-rank exchange took twice the link time, while two plain sockets reached
# the throttled rate in both directions at once); btl_tcp_links 2 (KFT_BENCH_TCP_LINKS) gives
# each pair two connections and restores full duplex, for every algorithm alike.
#
# KFT_BENCH_INTER=gloo puts Gloo between the nodes instead of MPI (kft hierarchical over Gloo,
# Gloo's own flat ring allreduce, and MPI_Allreduce, in one table; Gloo on each host's eth0);
# KFT_BENCH_CHUNK_BYTES then sets the hierarchical pipeline's chunk.
#
#   bash bench/network/netns_allreduce.sh [build dir] [hosts] [ranks per host] [rate] [-- allreduce_perf flags]
#   bash bench/network/netns_allreduce.sh build 2 2 1gbit -- -b 1M -e 64M -f 4 -n 5 -w 1
#   KFT_BENCH_INTER=gloo bash bench/network/netns_allreduce.sh build 3 2 1gbit
set -euo pipefail
build=${1:-build}; hosts=${2:-2}; per=${3:-2}; rate=${4:-1gbit}
shift $(( $# < 4 ? $# : 4 ))
[[ "${1:-}" == "--" ]] && shift
flags=("$@")
[[ ${#flags[@]} -eq 0 ]] && flags=(-b 1M -e 64M -f 4 -n 5 -w 1)
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/../../tests/netns/netns-cluster.sh"
name="kftb$$"
tmp=$(mktemp -d)
trap '"$cluster" down "$name"; rm -rf "$tmp"' EXIT
"$cluster" up "$name" "$hosts" "$rate"
for ((i = 0; i < hosts; i++)); do echo "$("$cluster" addr "$name" $i) slots=$per"; done > "$tmp/hosts"
a0=$("$cluster" addr "$name" 0)
net="${a0%.*}.0/24"
echo "# $hosts namespace hosts x $per ranks, egress of every host throttled to $rate (tc tbf); kft's group between hosts: ${KFT_BENCH_INTER:-mpi}; MPI_Allreduce over TCP (btl_tcp_links ${KFT_BENCH_TCP_LINKS:-2})"
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  mpirun --hostfile "$tmp/hosts" -np $((hosts * per)) \
  --mca plm_rsh_agent "$cluster agent $name" \
  --mca oob_tcp_if_include "$net" --mca btl_tcp_if_include "$net" --mca btl self,vader,tcp \
  --mca btl_tcp_links "${KFT_BENCH_TCP_LINKS:-2}" \
  -x "KFT_INTER_NODE=${KFT_BENCH_INTER:-mpi}" -x KFT_SOCKET_IFNAME=eth0 ${KFT_BENCH_CHUNK_BYTES:+-x KFT_BENCH_CHUNK_BYTES} \
  "$(cd "$build" && pwd)/bench/allreduce_perf" "${flags[@]}"

# What plain TCP carries through the same qdiscs in a ring (each host sending to the next while
# receiving from the previous): the link bound above counts payload at the tc rate, while tbf
# meters whole frames and the reverse ACKs share each host's egress.
addrs=$(for ((i = 0; i < hosts; i++)); do printf '%s%s' "$([[ $i -gt 0 ]] && echo ,)" "$("$cluster" addr "$name" $i)"; done)
for bytes in $((16 << 20)) $((64 << 20)); do
  pids=()
  for ((i = 0; i < hosts; i++)); do
    "$cluster" exec "$name" "$i" python3 "$here/tcp_ring.py" --me "$i" --addrs "$addrs" --port 29777 --bytes "$bytes" \
      > "$tmp/ring$i.json" &
    pids+=($!)
  done
  for p in "${pids[@]}"; do wait "$p"; done
  cat "$tmp"/ring*.json | python3 -c '
import json, re, sys
rate, hosts = sys.argv[1], int(sys.argv[2])
rows = [json.loads(l) for l in sys.stdin if l.strip()]
if len(rows) != hosts:
    sys.exit(f"tcp ring: {len(rows)} of {hosts} hosts reported")
m = re.fullmatch(r"([0-9.]+)([kmg]?)bit", rate.lower())
bps = float(m.group(1)) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[m.group(2)] if m else None
n, t = rows[0]["bytes"], max(r["seconds"] for r in rows)
good = 8 * n / t
share = f", {100 * good / bps:.1f}% of the {rate} rate" if bps else ""
print(f"# plain TCP ring through the same links, {n >> 20} MiB per host: {t * 1e3:.1f} ms (slowest host), "
      f"{good / 1e6:.0f} Mbit/s of payload per host{share}")
' "$rate" "$hosts"
done

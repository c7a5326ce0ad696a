#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# "Hosts" on one machine: network namespaces joined by a bridge, each with its own host name
# (a UTS namespace per command), so MPI and kft see several nodes that talk over TCP.
#
#   netns-cluster.sh up   <name> <hosts> [rate]   create <name>-h0..h<hosts-1> (addresses
#                                                   169.254.<net>.1..) and a bridge in the root
#                                                   namespace (169.254.<net>.254); with a rate
#                                                   (tc syntax: 200mbit, 1gbit) every host's
#                                                   egress is throttled to it
#   netns-cluster.sh down <name>                    remove them (idempotent)
#   netns-cluster.sh addr <name> <i>                address of host i
#   netns-cluster.sh agent <name> <addr> <cmd...>   Open MPI rsh agent: run cmd in the host
#                                                   that owns addr, under its host name
#   netns-cluster.sh exec <name> <i> <cmd...>       run cmd in host i, under its host name
#
# Needs root, iproute2 and util-linux (unshare). Exit status 77 when namespaces cannot be made
# (CTest's skip code). Traffic stays on the bridge and inside the namespaces.
set -euo pipefail

net_of() {  # a /24 per cluster name, so concurrent clusters do not collide
  echo $(( ($(printf '%s' "$1" | cksum | cut -d' ' -f1) % 200) + 20 ))
}

cmd=${1:-}; shift || true
case "$cmd" in
  up)
    name=$1 hosts=$2 rate=${3:-}
    net=$(net_of "$name")
    br="${name:0:10}-br"
    if ! ip netns add "$name-probe" 2>/dev/null; then
      echo "netns-cluster: cannot create network namespaces here (need root and CAP_SYS_ADMIN)" >&2
      exit 77
    fi
    ip netns del "$name-probe"
    ip link add "$br" type bridge
    ip addr add "169.254.$net.254/24" dev "$br"
    ip link set "$br" up
    for ((i = 0; i < hosts; i++)); do
      ns="$name-h$i" v="${name:0:8}-v$i"
      ip netns add "$ns"
      ip link add "$v" type veth peer name eth0 netns "$ns"
      ip link set "$v" master "$br" up
      ip -n "$ns" addr add "169.254.$net.$((i + 1))/24" dev eth0
      ip -n "$ns" link set eth0 up
      ip -n "$ns" link set lo up
      if [[ -n "$rate" ]]; then
        ip netns exec "$ns" tc qdisc add dev eth0 root tbf rate "$rate" burst 256kb latency 50ms
      fi
    done
    ;;
  down)
    name=$1
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$name-h" || true); do ip netns del "$ns" || true; done
    ip link del "${name:0:10}-br" 2>/dev/null || true
    ;;
  addr)
    echo "169.254.$(net_of "$1").$(($2 + 1))"
    ;;
  agent)
    # Open MPI calls: <agent> <host> <command words...>; the words form one shell command.
    name=$1 host=$2; shift 2
    i=$(( ${host##*.} - 1 ))
    exec ip netns exec "$name-h$i" unshare --uts /bin/sh -c 'hostname "$0"; exec /bin/sh -c "$1"' "$name-h$i" "$*"
    ;;
  exec)
    name=$1 i=$2; shift 2
    exec ip netns exec "$name-h$i" unshare --uts /bin/sh -c 'hostname "$0"; shift; exec "$@"' "$name-h$i" _ "$@"
    ;;
  *)
    sed -n '2,18p' "$0" >&2
    exit 2
    ;;
esac

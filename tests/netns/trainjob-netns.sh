#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# A Kubeflow TrainJob made by kft-manifest, run end to end on two network-namespace "pods":
# each pod gets what the Trainer controller would give it (its host name <job>-node-0-<i>, the
# headless service's DNS name for node 0 through a private /etc/hosts, the PET_* variables of
# the torch runtime, the Secret's token), then runs the job's own command (kftrun -- the DDP
# demo). The demo must train to its accuracy target across the two pods, with Gloo between them.
#
#   trainjob-netns.sh <kft-manifest> <kftrun> <05-fashion-mnist>
#
# Exit 77 (skip) when namespaces cannot be created.
set -euo pipefail
trap 'echo "$(basename "$0"): line $LINENO: a command failed (exit $?)" >&2' ERR
manifest=$1 kftrun=$2 demo=$3
here=$(cd "$(dirname "$0")" && pwd)
cluster="$here/netns-cluster.sh"
name="kftt$$" job="fmnist"
tmp=$(mktemp -d)
pods=()
cleanup() {
  for p in "${pods[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  "$cluster" down "$name"
  rm -rf "$tmp"
}
trap cleanup EXIT
"$cluster" up "$name" 2 || exit $?   # 77 passes through as a skip

# The job as a user would write it: 2 CPU nodes, 2 processes each, the demo to its target.
"$manifest" trainjob --name "$job" --image registry.example/kft:test --nodes 2 --nproc-per-node 2 --cpus 1 \
  -o "$tmp/trainjob.yaml" -- "$demo" --threads 1 --require-target
# What the controller reads from it (Debian's python3 has PyYAML).
/usr/bin/python3 - "$tmp/trainjob.yaml" > "$tmp/spec.sh" <<'EOF'
import shlex, sys, yaml
tj = yaml.safe_load(open(sys.argv[1]))
t = tj["spec"]["trainer"]
assert tj["kind"] == "TrainJob", tj["kind"]
print("nodes=%d" % t["numNodes"])
print("nproc=%s" % shlex.quote(str(t["numProcPerNode"])))
print("command=(%s)" % " ".join(shlex.quote(a) for a in t["command"]))
env = []
for e in t.get("env", []):
    if "value" in e:
        env.append("%s=%s" % (e["name"], e["value"]))
    elif e.get("valueFrom", {}).get("secretKeyRef"):
        env.append("%s=@secret" % e["name"])  # the Secret's value: filled in below
print("env=(%s)" % " ".join(shlex.quote(x) for x in env))
EOF
source "$tmp/spec.sh"
echo "TrainJob: $nodes nodes x $nproc, command: ${command[*]}"
[[ "${command[0]}" == kftrun ]] || { echo "FAILED: the job's command is not kftrun: ${command[*]}" >&2; exit 1; }
token="trainjob-secret-$$-$RANDOM"
pod_env=()
for e in "${env[@]}"; do [[ "$e" == *=@secret ]] && pod_env+=("${e%=@secret}=$token") || pod_env+=("$e"); done

# The headless service's name for node 0, as the pods' DNS would answer it.
{
  echo "127.0.0.1 localhost"
  for ((i = 0; i < nodes; i++)); do
    echo "$("$cluster" addr "$name" "$i") $job-node-0-$i.$job $job-node-0-$i"
  done
} > "$tmp/hosts"

bin=$(dirname "$kftrun")
for ((i = 0; i < nodes; i++)); do
  ip netns exec "$name-h$i" unshare --uts --mount /bin/sh -c \
    'mount --bind "$1" /etc/hosts && hostname "$2" && shift 2 && exec "$@"' _ "$tmp/hosts" "$job-node-0-$i" \
    env -i PATH="$bin:/usr/bin:/bin" HOME=/tmp "${pod_env[@]}" \
      PET_NNODES="$nodes" PET_NPROC_PER_NODE="$nproc" PET_NODE_RANK="$i" JOB_COMPLETION_INDEX="$i" \
      PET_MASTER_ADDR="$job-node-0-0.$job" PET_MASTER_PORT=29500 \
      "${command[@]}" > "$tmp/pod$i.out" 2>&1 &
  pods+=($!)
done
status=0
for ((i = 0; i < nodes; i++)); do
  rc=0
  wait "${pods[$i]}" || rc=$?
  echo "--- pod $job-node-0-$i (exit $rc)"
  tail -8 "$tmp/pod$i.out"
  [[ $rc == 0 ]] || status=1
done
pods=()
((status == 0)) || { echo "FAILED: a pod exited non-zero" >&2; exit 1; }
grep -q "Gloo between nodes" "$tmp"/pod*.out || { echo "FAILED: the job did not run Gloo between the pods" >&2; exit 1; }
grep -Eq "summary: .*time to 0\.[0-9]+: " "$tmp/pod0.out" || { echo "FAILED: rank 0 did not report the accuracy target" >&2; exit 1; }
echo "TrainJob trained to its target across 2 pods"

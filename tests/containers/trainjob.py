# SPDX-License-Identifier: Apache-2.0
"""A TrainJob's pods as containers: kft-manifest's TrainJob + ClusterTrainingRuntime, run as a
cluster with Kubeflow Trainer v2.3 and JobSet v0.12 would run them, and the demo trained to
the target accuracy across the pods.

    trainjob.py KFT_MANIFEST IMAGE --nodes N --nproc-per-node P [--name JOB] [--repeat-local KFTRUN EXE]

What the test does in place of the controllers (facts from kubeflow/trainer pkg/runtime/framework/
plugins/torch and kubernetes-sigs/jobset, see docs/kubernetes.md):
- the trainer job is the runtime's replicated job `node`; its container `node` takes the
  TrainJob's image, command, args and env (trainer.env overrides the runtime's by name);
- the Trainer injects PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK (the pod's completion index),
  PET_MASTER_ADDR=<job>-node-0-0.<job>, PET_MASTER_PORT=29500; the Indexed Job adds
  JOB_COMPLETION_INDEX; the webhook refuses a trainer.env that sets a PET_* name;
- JobSet names pod i `<job>-node-0-<i>` with subdomain `network.subdomain` (default the job's
  name), so `<job>-node-0-<i>.<subdomain>` resolves on the pod network;
- Secrets the TrainJob refers to exist (the docs' `kubectl create secret` step).
Then: every pod exits 0, rank 0 reports a final test accuracy >= 0.87, the world has N x P ranks
over N nodes. It prints the time from the first `podman run` to the job's first rendezvous and
the samples/s; with --repeat-local it runs the same job as N kftrun agents on this host without
containers and prints its samples/s beside.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import pods  # noqa: E402

RESERVED = {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"}
DEMO = ["/opt/kft/examples/05-fashion-mnist", "--threads", "1", "--evals-per-epoch", "1", "--require-target"]


def emit(tool, out, *args):
    r = subprocess.run([tool, args[0], "-o", out, *args[1:]], text=True, capture_output=True, timeout=60)
    if r.returncode != 0:
        pods.fail(f"kft-manifest {' '.join(args)} exited {r.returncode}: {r.stderr.strip()}")
    with open(out) as f:
        return f.read()


def trainer_pods(runtime, trainjob, secrets_by_name):
    """What the Trainer + JobSet controllers would create: [(hostname, aliases, env, command)]."""
    job = trainjob["metadata"]["name"]
    tspec = trainjob["spec"]
    if tspec["runtimeRef"]["name"] != runtime["metadata"]["name"]:
        pods.fail(f"the TrainJob refers to runtime {tspec['runtimeRef']['name']!r}, not {runtime['metadata']['name']!r}")
    trainer = tspec.get("trainer") or {}
    rspec = runtime["spec"]
    if "torch" not in (rspec.get("mlPolicy") or {}):
        pods.fail("the runtime has no mlPolicy.torch: the Trainer would inject no PET_* variables")
    jobs = {rj["name"]: rj for rj in rspec["template"]["spec"]["replicatedJobs"]}
    if "node" not in jobs:
        pods.fail(f"the runtime has no replicated job 'node' (has {sorted(jobs)})")
    node_job = jobs["node"]
    labels = (node_job["template"].get("metadata") or {}).get("labels") or {}
    if labels.get("trainer.kubeflow.org/trainjob-ancestor-step") != "trainer":
        pods.fail("replicated job 'node' lacks the label trainer.kubeflow.org/trainjob-ancestor-step: trainer")
    containers = {c["name"]: c for c in node_job["template"]["spec"]["template"]["spec"]["containers"]}
    if "node" not in containers:
        pods.fail(f"replicated job 'node' has no container 'node' (has {sorted(containers)})")
    base = containers["node"]
    bad = RESERVED & {e["name"] for e in trainer.get("env") or []}
    if bad:
        pods.fail(f"trainer.env sets {sorted(bad)}: the Trainer's webhook refuses reserved names")
    nodes = int(trainer.get("numNodes") or rspec["mlPolicy"].get("numNodes") or 1)
    nproc = trainer.get("numProcPerNode")
    if nproc is None:
        pods.fail("the TrainJob has no trainer.numProcPerNode (kft-manifest always sets it)")
    command = list(trainer.get("command") or base.get("command") or [])
    args = list(trainer.get("args") or base.get("args") or [])
    if not command:
        pods.fail("neither the TrainJob nor the runtime gives container 'node' a command")
    subdomain = (rspec["template"]["spec"].get("network") or {}).get("subdomain") or job
    out = []
    for i in range(nodes):
        merged = {"env": list(base.get("env") or [])}
        names = {e["name"] for e in trainer.get("env") or []}
        merged["env"] = [e for e in merged["env"] if e["name"] not in names] + list(trainer.get("env") or [])
        fields = {"metadata.annotations['batch.kubernetes.io/job-completion-index']": str(i)}
        env = pods.env_of(merged, secrets_by_name, fields)
        env.update({"PET_NNODES": str(nodes), "PET_NPROC_PER_NODE": str(nproc), "PET_NODE_RANK": str(i),
                    "PET_MASTER_ADDR": f"{job}-node-0-0.{job}", "PET_MASTER_PORT": "29500",
                    "JOB_COMPLETION_INDEX": str(i)})
        host = f"{job}-node-0-{i}"
        out.append((host, [host, f"{host}.{subdomain}"], env, command + args))
    return out


def summary_of(text):
    m = re.search(r"summary: (\d+) steps, .*final test accuracy (0\.\d+), (\d+) samples/s", text)
    return (int(m.group(1)), float(m.group(2)), int(m.group(3))) if m else None


def run_local(kftrun, exe, nodes, nproc, data_args):
    """The same job as `nodes` kftrun agents on this host, no containers: its samples/s."""
    env = dict(os.environ, KFT_RDZV_TOKEN=pods.random_token())
    port = 29500 + os.getpid() % 1000
    procs = []
    for i in range(nodes):
        procs.append(subprocess.Popen(
            [kftrun, "--nnodes", str(nodes), "--node-rank", str(i), "--nproc-per-node", str(nproc),
             "--master-addr", "127.0.0.1", "--master-port", str(port), "--", exe, *data_args],
            env=dict(env, KFT_HOST_ID=f"local-{i}"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=600)[0] for p in procs]
    if any(p.returncode != 0 for p in procs):
        pods.log(outs[0])
        pods.fail(f"the run without containers failed: {[p.returncode for p in procs]}")
    return summary_of(outs[0])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kft_manifest")
    ap.add_argument("image")
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--nproc-per-node", type=int, required=True)
    ap.add_argument("--name", default="fmnist")
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--repeat-local", nargs=2, metavar=("KFTRUN", "EXE"))
    a = ap.parse_args()

    pm = pods.Podman(a.image, f"trainjob-{a.nodes}x{a.nproc_per_node}")
    pm.skip_unless_usable()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            runtime_text = emit(a.kft_manifest, os.path.join(tmp, "runtime.yaml"), "runtime", "--image", a.image)
            tj_text = emit(a.kft_manifest, os.path.join(tmp, "trainjob.yaml"), "trainjob", "--name", a.name,
                           "--image", a.image, "--nodes", str(a.nodes), "--nproc-per-node", str(a.nproc_per_node),
                           "--cpus", "1", "--memory", "2Gi", "--env", "KFT_LOG_LEVEL=info", "--", *DEMO)
        runtime = next(d for d in pods.load_yaml_documents(runtime_text) if d["kind"] == "ClusterTrainingRuntime")
        trainjob = next(d for d in pods.load_yaml_documents(tj_text) if d["kind"] == "TrainJob")
        # The Secret the docs tell the user to create (kubectl create secret generic <job>-kft-rdzv).
        secrets_by_name = {f"{a.name}-kft-rdzv": {"token": pods.random_token()}}
        specs = trainer_pods(runtime, trainjob, secrets_by_name)
        if len(specs) != a.nodes:
            pods.fail(f"{len(specs)} pods from a TrainJob with numNodes {a.nodes}")

        net = pm.network("net")
        ips = [pm.address(net) for _ in specs]
        hosts = {alias: ip for (_, aliases, _, _), ip in zip(specs, ips) for alias in aliases}
        t0 = time.time()
        names = [pm.start(host, network=net, hostname=host, aliases=aliases, env=env, command=cmd, ip=ip, hosts=hosts)
                 for (host, aliases, env, cmd), ip in zip(specs, ips)]
        codes = pm.wait_all(names, a.timeout)
        wall = time.time() - t0
        if any(codes.values()):
            pm.dump(names)
            pods.fail(f"pods exited {codes}")
        out0 = pm.logs(names[0])
        world = a.nodes * a.nproc_per_node
        joined = rf"kft\[rank 0\] INFO: joined as rank 0 of {world}; .*: {a.nodes} nodes? x {a.nproc_per_node} ranks?"
        if not re.search(joined, out0):
            pm.dump(names[:1])
            pods.fail(f"rank 0 did not report joining a world of {world} ranks over {a.nodes} nodes")
        if not re.search(rf"\[0\]: kft ddp: .*{world} rank\(s\)", out0):
            pm.dump(names[:1])
            pods.fail(f"rank 0 did not train over {world} ranks")
        s = summary_of(out0)
        if s is None:
            pm.dump(names[:1])
            pods.fail("rank 0 printed no summary")
        steps, acc, rate = s
        if acc < 0.87:
            pods.fail(f"final test accuracy {acc} < 0.87")
        rdzv = pm.first_line_time(names[0], joined)
        first = f"{rdzv - t0:.2f} s" if rdzv else "(no timestamp)"
        pods.log(f"trainjob: {a.nodes} pod(s) x {a.nproc_per_node} process(es) = {world} ranks: all exited 0 in {wall:.1f} s; "
                 f"first podman run -> rendezvous {first}; {steps} steps, final test accuracy {acc:.4f}, {rate} samples/s")
        if a.repeat_local:
            ls = run_local(*a.repeat_local, a.nodes, a.nproc_per_node,
                           ["--data", "/usr/share/datasets/fashion-mnist", *DEMO[1:]])
            if ls:
                pods.log(f"trainjob: the same job as {a.nodes} kftrun agents on this host without containers: "
                         f"{ls[0]} steps, final test accuracy {ls[1]:.4f}, {ls[2]} samples/s "
                         f"(containers/host: {rate / ls[2]:.2f})")
    finally:
        pm.cleanup()


if __name__ == "__main__":
    main()

# SPDX-License-Identifier: Apache-2.0
"""Failures of a TrainJob's pods, as containers: one pod's container killed, one stopped
(SIGSTOP past the heartbeat deadline), one sent SIGTERM (what a preemption or an eviction does),
and the exit status every other pod's kftrun ends with, fed through the failure rules
kft-manifest's runtime carries (Kubernetes' podFailurePolicy, then JobSet's failurePolicy).

    failures.py KFT_MANIFEST IMAGE [--scenario kill|stop|term ...]

Each scenario: a TrainJob of 3 pods x 1 process training the demo (long enough not to end by
itself), pods as in trainjob.py; once rank 0 has joined, pod 1 is hit. Expected:
- kill: pods 0 and 2 exit 4 (node lost: pod 1's agent and its store connection are gone), which
  the rules send to RestartJobSetAndIgnoreMaxRestarts; pod 1 itself ends 137 (a SIGKILL, as an
  OOM kill would), which counts (RestartJobSet);
- stop: pods 0 and 2 exit 5 (hang: pod 1's agent is silent but still connected), counted;
- term: every pod exits 143 (pod 1 was signalled, the others were told), not counted.
"""
import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "manifest"))
import pods  # noqa: E402
from k8s_failure import exit_classes, job_failure, jobset_action  # noqa: E402
from trainjob import emit, trainer_pods  # noqa: E402

X = exit_classes()
SCENARIOS = {
    # signal to pod 1, {pod index: expected status} for the others, the JobSet action for those
    "kill": ("KILL", {0: X["node_lost"], 2: X["node_lost"]}, "RestartJobSetAndIgnoreMaxRestarts"),
    "stop": ("STOP", {0: X["hang"], 2: X["hang"]}, "RestartJobSet"),
    "term": ("TERM", {0: X["preempted"], 1: X["preempted"], 2: X["preempted"]}, "RestartJobSetAndIgnoreMaxRestarts"),
}
PROGRAM = ["/opt/kft/examples/05-fashion-mnist", "--threads", "1", "--epochs", "50", "--evals-per-epoch", "1"]


def scenario(pm, net, tool, image, name, runtime, node_job):
    sig, expected, action = SCENARIOS[name]
    job = f"fail-{name}"
    with tempfile.TemporaryDirectory() as tmp:
        text = emit(tool, os.path.join(tmp, "tj.yaml"), "trainjob", "--name", job, "--image", image, "--nodes", "3",
                    "--nproc-per-node", "1", "--env", "KFT_LOG_LEVEL=info", "--", *PROGRAM)
    tj = next(d for d in pods.load_yaml_documents(text) if d["kind"] == "TrainJob")
    specs = trainer_pods(runtime, tj, {f"{job}-kft-rdzv": {"token": pods.random_token()}})
    started = time.monotonic()
    ips = [pm.address(net) for _ in specs]
    hosts = {alias: ip for (_, aliases, _, _), ip in zip(specs, ips) for alias in aliases}
    names = [pm.start(f"{name}-{host}", network=net, hostname=host, aliases=aliases, env=env, command=cmd,
                      ip=ip, hosts=hosts) for (host, aliases, env, cmd), ip in zip(specs, ips)]
    until = time.monotonic() + 60
    while "INFO: joined as rank 0 of 3" not in pm.logs(names[0]):
        if time.monotonic() > until:
            pm.dump(names)
            pods.fail(f"{name}: rank 0 did not join within 60 s")
        time.sleep(0.3)
    joined = time.monotonic() - started
    time.sleep(1.0)
    t0 = time.monotonic()
    pm("kill", "--signal", sig, names[1])
    codes = pm.wait_all([names[i] for i in expected], 90)
    took = time.monotonic() - t0
    got = {i: codes[names[i]] for i in expected}
    if got != expected:
        pm.dump(names)
        pods.fail(f"{name}: SIG{sig} to pod 1: the pods exited {got}, expected {expected}")
    # What the cluster would do: the first of these pods to fail fails the node Job.
    status = expected[0]
    reason, message = job_failure(node_job, exit_code=status, pod=f"default/{job}-node-0-0-abcde")
    did = jobset_action(runtime, reason, message)
    if did != action:
        pods.fail(f"{name}: exit {status}: the rules give Job {reason} ({message}) -> {did}, expected {action}")
    pods.log(f"failures: {name}: rank 0 joined {joined:.1f} s after the first podman run; SIG{sig} to pod 1 -> pods {sorted(expected)} exited {status} within {took:.1f} s -> "
             f"Job {reason} -> JobSet {did}")
    if name == "kill":
        own = pm.exit_code(names[1], 10)
        r, m = job_failure(node_job, exit_code=own, pod=f"default/{job}-node-0-1-abcde")
        pods.log(f"failures: kill: pod 1 itself ended {own} -> Job {r} -> JobSet {jobset_action(runtime, r, m)} "
                 "(counted, as an OOM kill is)")
        if own != 137 or jobset_action(runtime, r, m) != "RestartJobSet":
            pods.fail(f"kill: pod 1 ended {own}; a SIGKILLed container ends 137 and counts")
    for n in names:  # pod 1 stopped or still stopping: end it before the next scenario
        pm("rm", "--force", "--time", "0", n, check=False)
    pm.containers = [c for c in pm.containers if c not in names]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kft_manifest")
    ap.add_argument("image")
    ap.add_argument("--scenario", action="append", choices=sorted(SCENARIOS))
    a = ap.parse_args()
    pm = pods.Podman(a.image, "failures")
    pm.skip_unless_usable()
    with tempfile.TemporaryDirectory() as tmp:
        rt_text = emit(a.kft_manifest, os.path.join(tmp, "rt.yaml"), "runtime", "--image", a.image)
    runtime = next(d for d in pods.load_yaml_documents(rt_text) if d["kind"] == "ClusterTrainingRuntime")
    node_job = next(rj for rj in runtime["spec"]["template"]["spec"]["replicatedJobs"]
                    if rj["name"] == "node")["template"]["spec"]
    if node_job.get("backoffLimit") != 0 or "podFailurePolicy" not in node_job:
        pods.fail("the runtime's node Job has no podFailurePolicy with backoffLimit 0: no failure rules to check")
    try:
        net = pm.network("net")  # one network (and its DNS) for every scenario
        for name in a.scenario or ["kill", "stop", "term"]:
            scenario(pm, net, a.kft_manifest, a.image, name, runtime, node_job)
    finally:
        pm.cleanup()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Start-to-first-rendezvous: kftrun vs torchrun on the same trivial program, in one run.

    /usr/bin/python3 bench/workloads/launch_latency.py BUILD_DIR [--nproc 2] [--runs 15]

The program is examples/02-rendezvous: every rank connects to the job's store, publishes its
host, waits for everyone and passes a barrier; rank 0 then prints the wall-clock time. We
measure from just before starting the launcher to that moment ("rendezvous"), and to the
launcher's exit ("total"). torchrun gets the same program: rank 0 hosts the kft store at the
MASTER_ADDR:MASTER_PORT torchrun gives its workers. Prints medians, min and max in ms. The
launchers are started by subprocess.run itself, not kftbench.run: the call is what is timed.
"""
import argparse
import os
import secrets
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("--nproc", type=int, default=2)
ap.add_argument("--runs", type=int, default=15)
ap.add_argument("--torchrun", default="/usr/bin/torchrun")
a = ap.parse_args()
probe = kftbench.example(a.build, "02-rendezvous")
kftrun = kftbench.kftrun(a.build)

launchers = {
    "kftrun": [kftrun, "--nproc-per-node", str(a.nproc), "--", probe, "--timestamp"],
    "torchrun": [a.torchrun, "--standalone", "--nproc_per_node", str(a.nproc), "--no_python",
                 "--redirects", "9:0", "--tee", "9:0", "--monitor_interval", "0.1", probe, "--timestamp"],
}
if not os.path.exists(a.torchrun):
    print(f"torchrun not found at {a.torchrun}: measuring kftrun only", file=sys.stderr)
    del launchers["torchrun"]

results = {name: {"rendezvous": [], "total": []} for name in launchers}
env = dict(os.environ, KFT_RDZV_TOKEN=secrets.token_hex(16))
for i in range(a.runs + 1):  # run 0 warms the page cache and is not counted
    for name, cmd in launchers.items():
        t0 = time.time_ns()
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        t1 = time.time_ns()
        stamp = [l for l in p.stdout.splitlines() if "rendezvous-complete-ns" in l]
        if p.returncode != 0 or not stamp:
            sys.exit(f"{name} failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        if i == 0:
            continue
        results[name]["rendezvous"].append((int(stamp[0].split()[-1]) - t0) / 1e6)
        results[name]["total"].append((t1 - t0) / 1e6)

print(f"# start-to-first-rendezvous, {a.nproc} workers, {a.runs} runs each, {os.cpu_count()} CPUs")
print(f"# {'launcher':<10} {'rendezvous ms (median  min  max)':>34} {'total ms (median  min  max)':>30}")
for name, r in results.items():
    rv, tt = r["rendezvous"], r["total"]
    print(f"  {name:<10} {statistics.median(rv):>14.1f} {min(rv):>8.1f} {max(rv):>8.1f}"
          f" {statistics.median(tt):>14.1f} {min(tt):>8.1f} {max(tt):>8.1f}")
if len(results) == 2:
    k = statistics.median(results["kftrun"]["rendezvous"])
    t = statistics.median(results["torchrun"]["rendezvous"])
    print(f"# kftrun reaches the first rendezvous {t / k:.1f}x sooner than torchrun (median)")

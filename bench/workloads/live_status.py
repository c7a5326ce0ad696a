#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kftrun's live status at 4, 64 and 256 ranks on this machine (issue 47 item 6: <= 1 s for 256).

    python3 bench/workloads/live_status.py BUILD_DIR [--ranks 4,64,256] [--asks 5]

For each size, one kftrun runs N status_workers (tests/integration/status_worker: a step counter
and a 1024-float allreduce every --pause-ms, 200 by default so 256 processes fit on 2 vCPUs),
then gets SIGUSR1 --asks times, 0.5 s apart. Measured: from the signal to the status line on
kftrun's standard output (what a user waits), and the agent's own time (`took_s`: asking every
worker's socket and gathering). Each line is checked: N ranks, every one running at a step with
its newest allreduce. Prints median, min and max in ms, and the CPU.
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("build")
ap.add_argument("--ranks", default="4,64,256")
ap.add_argument("--asks", type=int, default=5)
ap.add_argument("--pause-ms", type=int, default=200)
a = ap.parse_args()
kftrun = kftbench.kftrun(a.build)
worker = os.path.join(a.build, "tests", "integration", "status_worker")
if not os.path.exists(worker):
    sys.exit(f"live_status: {worker} is not built (ninja status_worker)")

print(f"kftrun live status, {kftbench.cpu_description()}", flush=True)
print(f"{'ranks':>6} {'signal to line ms (median, min, max)':>38} {'agent ms (median)':>18} {'start s':>8}")
for n in [int(x) for x in a.ranks.split(",")]:
    pids = tempfile.mkdtemp(prefix="kft-status-bench-")
    t_start = time.monotonic()
    p = subprocess.Popen([kftrun, "--nproc-per-node", str(n), "--", worker, pids, "600", str(a.pause_ms)],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    threading.Thread(target=lambda: [lines.append(l.rstrip("\n")) for l in p.stdout], daemon=True).start()
    end = time.monotonic() + 600
    while time.monotonic() < end and sum("ready rank" in l for l in lines) < n and p.poll() is None:
        time.sleep(0.1)
    ready = sum("ready rank" in l for l in lines)
    started = time.monotonic() - t_start
    if ready < n:
        print(f"{n:>6} only {ready} ranks became ready; last lines: {lines[-5:]}", flush=True)
        os.killpg(p.pid, signal.SIGKILL)
        continue
    time.sleep(1.0)
    waits, agent = [], []
    for i in range(a.asks):
        before = sum(l.startswith('{"kftrun_status"') for l in lines)
        t0 = time.monotonic()
        p.send_signal(signal.SIGUSR1)
        while time.monotonic() < t0 + 30 and sum(l.startswith('{"kftrun_status"') for l in lines) <= before:
            time.sleep(0.002)
        waits.append(time.monotonic() - t0)
        st = json.loads([l for l in lines if l.startswith('{"kftrun_status"')][before])
        agent.append(st["took_s"])
        running = [r for r in st["ranks"] if r["state"] == "running" and r["step"] >= 1 and r["calls"]]
        if len(st["ranks"]) != n or len(running) != n:
            print(f"   ask {i}: {len(st['ranks'])} ranks, {len(running)} running with a step and a call (want {n})")
        time.sleep(0.5)
    ms = [w * 1000 for w in waits]
    print(f"{n:>6} {statistics.median(ms):>20.1f}, {min(ms):.1f}, {max(ms):.1f} {statistics.median(agent) * 1000:>18.1f} "
          f"{started:>8.1f}", flush=True)
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The straggler detection's soak (trainer_options::stragglers; issue 47 item 5): the trainer
runs for --minutes with no slowed rank and the script reports how many stragglers were named
(it must be none) and the largest verdicts the windows gave (a rank's work per step against the
others' median: in one window, and in two windows in a row, which is what the default sustain
of 2 compares with the threshold); with --slowed K, K more runs where one rank is slowed by 20%
from step 101 (a CPU quota through a cgroup as root, else a busy process on its CPU) and the step
at which it was named.

    python3 bench/ddp/straggler_soak.py --build build-tests --minutes 10 --slowed 5

The worker is tests/integration/straggler_worker (BUILD/tests/integration/straggler_worker, the
test's own program): a linear regression whose step is about --work-ms of CPU loops, each rank
pinned to a CPU of its own, under kftrun. As root each run's session is given the scheduler
autogroup nice -20, so that another session's processes on the machine (a build) do not take an
equal share of a rank's CPU; the script says whether it could. It also times a window's exchange
alone (an allgather of two f64 per rank), and first (--reference seconds) the machine alone: plain
arithmetic on each pinned CPU, no kft, judged per wall-clock window by the detector's own rule, so
a noisy machine (one CPU slower than the other for seconds: other work, a busy host) is told
apart from the detection.
"""
import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402

LINE = re.compile(r"straggler_worker: rank (\d+) of (\d+) steps (\d+) windows (\d+) max_excess ([0-9.]+) "
                  r"max_sustained ([0-9.]+) named (\d+) slowed_at (\d+)")
PERIOD_US = 10000


def in_front(cmd):
    """`cmd` with its session's autogroup at nice -20 first (root; otherwise it runs as it is)."""
    code = ("import os, sys\ntry:\n    open('/proc/self/autogroup', 'w').write('-20')\nexcept OSError:\n    pass\n"
            "os.execvp(sys.argv[1], sys.argv[1:])")
    return [sys.executable, "-c", code] + cmd


def autogroup_allowed():
    try:
        with open("/proc/self/autogroup") as f:
            now = f.read().split()[-1]
        with open("/proc/self/autogroup", "w") as f:
            f.write(now)
        return True
    except (OSError, IndexError):
        return False


def make_cgroup():
    """A CPU cgroup with a quota of 1/1.2 CPU: (its directory, cgroup.procs) or (None, None)."""
    name = f"kft-straggler-soak-{os.getpid()}"
    quota = int(PERIOD_US / 1.2)
    try:
        if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            with open("/sys/fs/cgroup/cgroup.subtree_control") as f:
                if "cpu" not in f.read().split():
                    with open("/sys/fs/cgroup/cgroup.subtree_control", "w") as g:
                        g.write("+cpu")
            d = f"/sys/fs/cgroup/{name}"
            os.mkdir(d)
            with open(f"{d}/cpu.max", "w") as f:
                f.write(f"{quota} {PERIOD_US}")
            return d, f"{d}/cgroup.procs"
        d = f"/sys/fs/cgroup/cpu/{name}"
        os.mkdir(d)
        with open(f"{d}/cpu.cfs_period_us", "w") as f:
            f.write(str(PERIOD_US))
        with open(f"{d}/cpu.cfs_quota_us", "w") as f:
            f.write(str(quota))
        with open(f"{d}/cpu.shares", "w") as f:
            f.write("262144")
        return d, f"{d}/cgroup.procs"
    except OSError:
        return None, None


PROBE = """
import json, os, sys, time
os.sched_setaffinity(0, {int(sys.argv[1])})
try:
    open('/proc/self/autogroup', 'w').write('-20')
except OSError:
    pass
start, end, x, ends = float(sys.argv[2]), float(sys.argv[3]), 0, []
while time.time() < start:
    pass
while time.time() < end:
    for i in range(15000):
        x += i * i
    ends.append(time.time())
print(json.dumps(ends))
"""


def machine_reference(cpus, seconds, window_s, threshold=0.10, sustain=2):
    """The machine alone, no kft: one process per CPU (pinned, the same autogroup nice) runs the same
    chunks of arithmetic for `seconds`; per wall-clock window of `window_s`, each CPU's chunks
    give its speed, and the detector's rule (the others' median, `threshold`, `sustain` windows
    in a row) is applied to them. Returns (windows, the namings the rule would make, the largest
    verdict of one window, of `sustain` in a row)."""
    import subprocess
    start = time.time() + 1.0
    procs = [subprocess.Popen(in_front([sys.executable, "-c", PROBE, str(c), str(start), str(start + seconds)]),
                              stdout=subprocess.PIPE, text=True, start_new_session=True) for c in cpus]
    ends = [json.loads(p.communicate(timeout=seconds + 60)[0]) for p in procs]
    n = int(seconds / window_s)
    counts = [[0] * n for _ in cpus]
    for k, e in enumerate(ends):
        for t in e:
            w = int((t - start) / window_s)
            if 0 <= w < n:
                counts[k][w] += 1
    named, slow, big, big_run, runs = 0, [0] * len(cpus), 0.0, 0.0, [[] for _ in cpus]
    for w in range(n):
        for k in range(len(cpus)):
            others = sorted(counts[j][w] for j in range(len(cpus)) if j != k)
            mid = len(others) // 2
            med = others[mid] if len(others) % 2 else (others[mid - 1] + others[mid]) / 2
            if counts[k][w] == 0 or med == 0:
                continue
            x = med / counts[k][w] - 1  # (time per chunk against the others': speed inverted)
            big = max(big, x)
            runs[k] = (runs[k] + [x])[-sustain:]
            if len(runs[k]) == sustain:
                big_run = max(big_run, min(runs[k]))
            slow[k] = slow[k] + 1 if x >= threshold else 0
            if slow[k] == sustain:
                named += 1
    return n, named, big, big_run


def run(a, worker, extra, limit):
    log = tempfile.mktemp(prefix="kft-straggler-soak-", suffix=".jsonl")
    cmd = in_front([kftbench.kftrun(a.build), "--nproc-per-node", str(a.ranks), "--", worker, "--work-ms",
                    str(a.work_ms), "--pin", "--log", log, *extra])
    out = kftbench.run(cmd, limit=limit, attempts=1, merge_stderr=True)
    records = []
    if os.path.exists(log):
        with open(log) as f:
            records = [json.loads(line) for line in f if line.strip()]
        os.unlink(log)
    ranks = {int(m.group(1)): m for m in LINE.finditer(out)}
    if len(ranks) != a.ranks:
        sys.exit(f"{kftbench.who()}: not every rank printed its line:\n{out}")
    return out, records, ranks


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build-tests")
    ap.add_argument("--minutes", type=float, default=10.0, help="the soak's length (no slowed rank)")
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--work-ms", type=float, default=10.0, help="a step's work")
    ap.add_argument("--slowed", type=int, default=0, help="runs with one rank slowed by 20%% after the soak")
    ap.add_argument("--reference", type=float, default=60.0,
                    help="seconds of the machine alone first (plain arithmetic on the pinned CPUs, no kft; 0: none)")
    ap.add_argument("--sleep", action="store_true",
                    help="the work is a sleep (the trainer's own noise, without the CPUs'); no slowed runs then")
    ap.add_argument("--busy", action="store_true", help="slow with a busy process even where a cgroup can be made")
    a = ap.parse_args()
    worker = os.path.join(a.build, "tests", "integration", "straggler_worker")
    if not os.access(worker, os.X_OK):
        sys.exit(f"{kftbench.who()}: {worker} is not built (cmake --build {a.build} --target straggler_worker kftrun)")
    print(f"# {kftbench.cpu_description()}, {os.cpu_count()} CPUs; {a.ranks} ranks pinned, steps of ~{a.work_ms} ms "
          f"of work; autogroup nice -20: {'yes' if autogroup_allowed() else 'no (not allowed)'}", flush=True)

    if a.reference > 0:
        n, named, big, big_run = machine_reference(list(range(a.ranks)), a.reference, a.work_ms * 10 / 1e3)
        print(f"machine alone ({a.reference:g} s of plain arithmetic on each of {a.ranks} pinned CPUs, no kft, windows of "
              f"{a.work_ms * 10:g} ms): {n} windows, the detector's rule would name {named}; largest verdict in one window "
              f"+{big * 100:.1f}%, in two windows in a row +{big_run * 100:.1f}%", flush=True)

    if a.minutes > 0:
        out, records, ranks = run(a, worker, ["--seconds", str(a.minutes * 60), "--exchange-cost", "20000",
                                              *(["--sleep"] if a.sleep else [])],
                                  limit=a.minutes * 60 * 2 + 120)
        named = [r for r in records if r.get("event") == "straggler"]
        r0 = ranks[0]
        cost = re.search(r"exchange ([0-9.]+) us", out)
        summary = [r for r in records if r.get("event") == "summary"]
        wall = summary[0]["wall_seconds"] if summary else 0.0
        print(f"soak{' (work: a sleep)' if a.sleep else ''}: {a.minutes:g} min, {r0.group(3)} steps ({wall:.0f} s, {wall / max(int(r0.group(3)), 1) * 1e3:.2f} ms a "
              f"step), {r0.group(4)} windows: stragglers named {len(named)}"
              + (" (" + ", ".join(f"rank {n['rank']} at step {n['step']} +{n['excess'] * 100:.1f}%" for n in named[:8])
                 + (f", ... {len(named) - 8} more" if len(named) > 8 else "") + ")" if named else "")
              + f"; largest verdict in one window +{float(r0.group(5)) * 100:.1f}%, in two windows in a row "
              f"+{float(r0.group(6)) * 100:.1f}%", flush=True)
        if cost:
            print(f"exchange: {cost.group(1)} us a window (allgather of 2 f64 per rank, {a.ranks} ranks), "
                  f"{float(cost.group(1)) / (wall / max(int(r0.group(3)), 1) * 1e6 * 10) * 100:.4f}% of a window's "
                  "10 steps", flush=True)

    if a.slowed and not a.sleep:
        d, procs = (None, None) if a.busy else make_cgroup()
        how = ["--cgroup-procs", procs] if d else ["--busy-share", "0.1667"]
        what = f"a CPU quota of {int(PERIOD_US / 1.2)}/{PERIOD_US} us" if d else "a busy process 1/6 of its CPU"
        steps, late, wrong = [], 0, 0
        try:
            for k in range(a.slowed):
                _, records, _ = run(a, worker, ["--steps", "300", "--slow-rank", "1", "--slow-step", "101", *how],
                                    limit=120)
                named = [r for r in records if r.get("event") == "straggler"]
                first = next((r["step"] for r in named if r["rank"] == 1 and r["step"] >= 101), None)
                others = [r for r in named if r["rank"] != 1 or r["step"] < 101]
                wrong += len(others)
                late += first is None or first > 130
                steps.append(first)
                print(f"slowed run {k + 1}: rank 1 slowed by {what} from step 101, named at step {first}"
                      + (f"; also named: {[(r['rank'], r['step']) for r in others]}" if others else ""), flush=True)
        finally:
            if d:
                os.rmdir(d)
        found = [s - 101 + 1 for s in steps if s is not None]
        print(f"slowed: {len(found)} of {a.slowed} named, within 30 steps {a.slowed - late} of {a.slowed}"
              + (f", steps after the slowdown began: median {statistics.median(found):g} (max {max(found)})" if found else "")
              + f"; other namings {wrong}", flush=True)


if __name__ == "__main__":
    main()

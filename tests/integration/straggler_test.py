#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Naming a slow rank (trainer_options::stragglers; issue 47 item 5), with a rank really slowed.

    straggler_test.py KFTRUN WORKER

2 ranks under kftrun, each pinned to a CPU of its own, train 300 steps of about 10 ms of work.
Rank 1 joins a CPU cgroup whose quota is 1/1.2 of one CPU (CFS period 10 ms: it gets 8.33 ms of
every 10) just before step 101, so from there its work takes about 20% longer. Checked:
  - rank 1 is named within 30 steps of step 101, on the console (stderr, "kft: step S: rank 1
    (host) is a straggler: ...") and in the JSON log (one "straggler" record, rank 1), and
    rank 0 never is;
  - every rank's observer saw exactly one naming (the worker's line "named 1");
  - a control run, the same without the cgroup, names nobody (console, log, observers).
The cgroup is cgroup v2's (/sys/fs/cgroup/<name>/cpu.max, the cpu controller enabled in the root's
subtree_control) or v1's (/sys/fs/cgroup/cpu/<name>/cpu.cfs_quota_us), removed at the end; where
neither can be made (not root, a read-only cgroup file system) rank 1 is slowed instead by a
process on its CPU that spins 1/6 of every 6 ms (the reason is printed). A machine shared with
other work can slow a rank for seconds, which the run rightly names: each scenario passes when
one of 3 attempts does, and each failed attempt is printed.
"""
import json
import os
import re
import subprocess
import sys
import tempfile

KFTRUN, WORKER = sys.argv[1:3]
SLOW_STEP = 101
STEPS = 300
PERIOD_US = 10000
QUOTA_US = int(PERIOD_US / 1.2)  # 20% slower on a CPU of its own


def make_cgroup():
    """A CPU cgroup with the quota: (its directory, its cgroup.procs), or (None, reason)."""
    name = f"kft-straggler-test-{os.getpid()}"
    reasons = []
    v2 = "/sys/fs/cgroup"
    if os.path.exists(os.path.join(v2, "cgroup.controllers")):
        try:
            with open(os.path.join(v2, "cgroup.controllers")) as f:
                if "cpu" not in f.read().split():
                    raise OSError("the cpu controller is not available in cgroup v2's root")
            with open(os.path.join(v2, "cgroup.subtree_control")) as f:
                enabled = f.read().split()
            if "cpu" not in enabled:
                with open(os.path.join(v2, "cgroup.subtree_control"), "w") as f:
                    f.write("+cpu")
            d = os.path.join(v2, name)
            os.mkdir(d)
            try:
                with open(os.path.join(d, "cpu.max"), "w") as f:
                    f.write(f"{QUOTA_US} {PERIOD_US}")
                with open(os.path.join(d, "cpu.weight"), "w") as f:  # (the quota alone slows it)
                    f.write("10000")
            except OSError:
                os.rmdir(d)
                raise
            return d, os.path.join(d, "cgroup.procs")
        except OSError as e:
            reasons.append(f"cgroup v2 at {v2}: {e}")
    v1 = "/sys/fs/cgroup/cpu"
    if os.path.exists(os.path.join(v1, "cpu.cfs_quota_us")):
        try:
            d = os.path.join(v1, name)
            os.mkdir(d)
            try:
                with open(os.path.join(d, "cpu.cfs_period_us"), "w") as f:
                    f.write(str(PERIOD_US))
                with open(os.path.join(d, "cpu.cfs_quota_us"), "w") as f:
                    f.write(str(QUOTA_US))
                with open(os.path.join(d, "cpu.shares"), "w") as f:  # (the quota alone slows it)
                    f.write("262144")
            except OSError:
                os.rmdir(d)
                raise
            return d, os.path.join(d, "cgroup.procs")
        except OSError as e:
            reasons.append(f"cgroup v1 at {v1}: {e}")
    if not reasons:
        reasons.append("no CPU cgroup controller is mounted (neither /sys/fs/cgroup/cgroup.controllers nor "
                       "/sys/fs/cgroup/cpu/cpu.cfs_quota_us)")
    return None, "; ".join(reasons)


def own_session():
    """The job in a session of its own with its scheduler autogroup at nice -20 where allowed
    (root): with autogroups on, another session's processes (a build beside the test) take an
    equal share of a CPU whatever their own nice value, which would slow a rank as much as the
    quota does. (Without the privilege the job runs at the default weight.)"""
    os.setsid()
    try:
        with open("/proc/self/autogroup", "w") as f:
            f.write("-20")
    except OSError:
        pass


def run(log, slowing=()):
    cmd = [KFTRUN, "--nproc-per-node", "2", "--", WORKER, "--steps", str(STEPS), "--work-ms", "10", "--pin",
           "--log", log]
    if slowing:
        cmd += ["--slow-rank", "1", "--slow-step", str(SLOW_STEP), *slowing]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90, preexec_fn=own_session)
    if p.returncode != 0:
        sys.exit(f"straggler_test: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}\n{p.stderr}")
    records = []
    with open(log) as f:
        records = [json.loads(line) for line in f if line.strip()]
    os.unlink(log)
    workers = {int(m.group(1)): m for m in re.finditer(
        r"straggler_worker: rank (\d+) of 2 steps (\d+) windows (\d+) max_excess ([0-9.]+) max_sustained ([0-9.]+) "
        r"named (\d+) slowed_at (\d+)", p.stdout)}
    if sorted(workers) != [0, 1]:
        sys.exit(f"straggler_test: not every rank printed its line:\n{p.stdout}\n{p.stderr}")
    return p, records, workers


def slowed(tmp, slowing, how):
    """One slowed run: the list of what went wrong ([] : right)."""
    p, records, workers = run(os.path.join(tmp, "slow.jsonl"), slowing)
    wrong = []
    named = [r for r in records if r.get("event") == "straggler"]
    lines = re.findall(r"kft: step (\d+): rank (\d+)(?: \(([^)]*)\))? is a straggler: .*\(\+([0-9.]+)%\)", p.stderr)
    print(f"straggler_test: rank 1 slowed ({how}) from step {SLOW_STEP}; named: "
          + (", ".join(f"rank {r} at step {s} (+{x}%)" for s, r, _, x in lines) or "nobody")
          + f"; largest window verdict {float(workers[0].group(4)) * 100:.1f}%", flush=True)
    if int(workers[1].group(7)) != SLOW_STEP:
        wrong.append(f"rank 1 was not slowed before step {SLOW_STEP}")
    if len(named) != 1 or named[0]["rank"] != 1:
        wrong.append(f"the JSON log names {named}, not rank 1 once")
    elif not SLOW_STEP <= named[0]["step"] <= SLOW_STEP + 29:
        wrong.append(f"rank 1 was named at step {named[0]['step']}, not within 30 steps of {SLOW_STEP}")
    elif named[0]["excess"] < 0.10:
        wrong.append(f"the logged excess {named[0]['excess']} is under the threshold")
    if len(lines) != 1 or lines[0][1] != "1":
        wrong.append(f"the console names {lines}, not rank 1 once")
    if not all(int(w.group(6)) == 1 for w in workers.values()):
        wrong.append("an observer did not see exactly one naming")
    summary = [r for r in records if r.get("event") == "summary"]
    if not summary or summary[0].get("stragglers") != 1:
        wrong.append(f"the summary record says {summary}")
    return [f"{w}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}" for w in wrong[:1]] + wrong[1:]


def control(tmp):
    p, records, workers = run(os.path.join(tmp, "control.jsonl"))
    wrong = []
    named = [r for r in records if r.get("event", "").startswith("straggler")]
    print(f"straggler_test: control run: named {len(named)}; largest window verdict "
          f"{float(workers[0].group(4)) * 100:.1f}%, two windows in a row {float(workers[0].group(5)) * 100:.1f}%", flush=True)
    if named:
        wrong.append(f"the control run's log names {named}")
    if "straggler:" in p.stderr:
        wrong.append("the control run's console names a straggler")
    if not all(int(w.group(6)) == 0 for w in workers.values()):
        wrong.append("an observer saw a naming in the control run")
    return [f"{w}\n--- stdout\n{p.stdout}\n--- stderr\n{p.stderr}" for w in wrong[:1]] + wrong[1:]


def attempts(what, f, n=3):
    """A scenario passes when one of `n` attempts does: a machine shared with other work can
    slow one rank for seconds (a real straggler, which the run then rightly names). Each failed
    attempt is printed."""
    for k in range(n):
        wrong = f()
        if not wrong:
            return []
        print(f"straggler_test: {what}, attempt {k + 1} of {n}: " + "; ".join(w.splitlines()[0] for w in wrong),
              flush=True)
    return [f"{what}: " + w for w in wrong]


def main():
    tmp = tempfile.mkdtemp(prefix="kft-straggler-")
    d, procs = make_cgroup()
    failures = []
    try:
        if d is None:
            # No CPU cgroup here (not root, a read-only cgroup file system): a busy process on
            # rank 1's CPU, spinning 1/6 of every 6 ms, slows it instead.
            print(f"straggler_test: no CPU cgroup ({procs}); rank 1 is slowed by a busy process on its CPU instead")
            failures += attempts("slowed by a busy process", lambda: slowed(tmp, ["--busy-share", "0.1667"],
                                                                           "a busy process 1/6 of its CPU"))
        else:
            failures += attempts("slowed by a CPU quota", lambda: slowed(tmp, ["--cgroup-procs", procs],
                                                                        f"a CPU quota of {QUOTA_US}/{PERIOD_US} us"))
        failures += attempts("control", lambda: control(tmp))
    finally:
        os.rmdir(tmp)
        if d is not None:
            try:
                os.rmdir(d)
            except OSError as e:
                print(f"straggler_test: the cgroup {d} was not removed: {e}")
    if failures:
        sys.exit("straggler_test: FAILED\n" + "\n\n".join(failures))
    print("straggler_test: OK")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What losing a rank costs (issue 46 items 3 and 5): the same model and the same failure, got
over three ways, beside the run without it.

    python3 bench/fault/failure_cost.py [--build BUILD] [--state-mb 256] [--steps 40] [--kill-step 16]
                                        [--checkpoint-every 10] [--repeats 3] [--json FILE]

`failure_worker` (bench/fault/failure_worker.cpp: --state-mb MiB of parameters and SGD momentum, a
cheap synthetic step) runs as 4 ranks under kftrun, one epoch of --steps steps. Job rank 2 kills
itself (SIGKILL) as step --kill-step starts. The modes, alternated in every repeat:

  a        no failure, no checkpoints: the reference
  a+ckpt   no failure, a checkpoint every --checkpoint-every steps (what (b) pays without a failure)
  b        today's way: kftrun --on-failure stop --max-restarts 1, checkpoints as a+ckpt; the whole
           job restarts and resumes from the newest checkpoint (the steps since it are done again)
  c        kftrun --on-failure continue, trainer_options::shrink_store: the 3 survivors redo the
           interrupted step and go on with 3 ranks
  d        kftrun --on-failure heal --max-restarts 1, shrink_store: as (c), and kftrun starts a
           replacement rank 2 that joins at a step boundary and gets the state from a survivor

Printed per mode: the job's wall time (kftrun's start to its exit: median, min-max), the time
lost against (a) (medians' difference; (b) also against a+ckpt), and where the time went:
(b) the kill to the restarted workers' start, their set-up (kft::init, the checkpoint's load and
broadcast) and the steps done again; (d) the kill to the replacement's start, its kft::init (it
returns once the members admit it at a step boundary), the state's transfer as the trainer
reports it ("state sent in", rank 0) and as the replacement sees it (its trainer's constructor),
and the kill to the replacement holding the state. Every run is checked (kftrun exits 0, the
ranks' steps and parameter hashes agree, the replacement joined); a run that fails stops the
script (kftbench.run). Nothing is left behind: the checkpoint directories are removed, and at the
end the script says whether any failure_worker process or /dev/shm or /tmp entry named kft* is
left from the runs. A benchmark: it prints numbers, it never passes or fails on them.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402

RANKS = 4

RANK_LINE = re.compile(r"failure_worker: rank (\d+) of (\d+) steps (\d+) wall ([\d.]+) setup ([\d.]+) hash (\d+) "
                       r"restart (\d+) join (\d+) resumed_from (\d+) start ([\d.]+) end ([\d.]+)")
KILL_LINE = re.compile(r"failure_worker: rank (\d+) killed at step (\d+) t ([\d.]+)")
JOINER_LINE = re.compile(r"failure_worker: joiner rank (\d+): init ([\d.]+) s, state ([\d.]+) s, init \+ state "
                         r"([\d.]+) s, at step (\d+) t ([\d.]+)")
SENT_LINE = re.compile(r"kft: step (\d+): rank\(s\) [\d,]+ joined; going on with \d+ rank\(s\) .*state sent in "
                       r"([\d.]+) s")
LOST_LINE = re.compile(r"kft: step (\d+): lost rank\(s\) (\d+) of \d+ ")
STEP_LINE = re.compile(r"failure_worker: rank 0 step (\d+) end t ([\d.]+)")

MODES = {
    "a": "no failure",
    "a+ckpt": "no failure, checkpoints",
    "b": "stop + restart from checkpoint",
    "c": "continue: shrink to 3",
    "d": "heal: shrink, replacement joins",
}


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(kftbench.REPO, "build-tests"))
    ap.add_argument("--state-mb", type=float, default=256, help="parameters + SGD momentum, MiB (8 bytes a parameter)")
    ap.add_argument("--steps", type=int, default=40, help="steps of the run (one epoch)")
    ap.add_argument("--kill-step", type=int, default=16, help="rank 2 dies as this step starts")
    ap.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints in a+ckpt and b")
    ap.add_argument("--repeats", type=int, default=3, help="runs of each mode, alternated")
    ap.add_argument("--modes", nargs="+", default=list(MODES), choices=list(MODES))
    ap.add_argument("--json", help="write every run's numbers to this file")
    a = ap.parse_args()
    if not 2 < a.kill_step <= a.steps:
        ap.error(f"--kill-step must be in 3..--steps ({a.steps}): the steps before it give the normal step")
    if a.checkpoint_every < 1 or a.repeats < 1:
        ap.error("--checkpoint-every and --repeats must be >= 1")
    return a


def shm_entries():
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith("kft")}
    except OSError:
        return set()


def tmp_entries():
    return {n for n in os.listdir(tempfile.gettempdir()) if n.startswith("kft")}


def worker_pids(worker):
    """The live processes running the worker binary (a leftover after a run)."""
    pids = []
    real = os.path.realpath(worker)
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                if os.path.realpath(f"/proc/{p}/exe") == real:
                    pids.append(int(p))
            except OSError:
                pass
    return pids


def run_mode(a, mode, kftrun, worker):
    """One run of `mode`: its wall time and what its output says."""
    cmd = [kftrun, "--nproc-per-node", str(RANKS)]
    if mode == "b":
        cmd += ["--on-failure", "stop", "--max-restarts", "1"]
    elif mode == "c":
        cmd += ["--on-failure", "continue"]
    elif mode == "d":
        cmd += ["--on-failure", "heal", "--max-restarts", "1"]
    cmd += ["--", worker, "--state-mb", str(a.state_mb), "--steps", str(a.steps)]
    if mode in ("b", "c", "d"):
        cmd += ["--kill-rank", "2", "--kill-step", str(a.kill_step)]
    if mode in ("c", "d"):
        cmd += ["--shrink"]
    ckpt = None
    if mode in ("a+ckpt", "b"):
        ckpt = tempfile.mkdtemp(prefix="kft-failure-cost-")
        cmd += ["--checkpoint-dir", ckpt, "--checkpoint-every", str(a.checkpoint_every)]
    try:
        t0 = time.monotonic()
        out = kftbench.run(cmd, limit=max(300, 10 * a.steps), merge_stderr=True)
        wall, t1_rt = time.monotonic() - t0, time.time()
    finally:
        if ckpt:
            shutil.rmtree(ckpt, ignore_errors=True)
    r = examine(a, mode, wall, out, cmd)
    r["tail"] = t1_rt - max(x["end"] for x in r["ranks"])  # (the last worker's end to kftrun's exit)
    return r


def examine(a, mode, wall, out, cmd):
    ranks = [dict(zip(("rank", "size", "steps", "wall", "setup", "hash", "restart", "join", "resumed_from", "start",
                       "end"), (float(x) if "." in x else int(x) for x in m.groups())))
             for m in RANK_LINE.finditer(out)]
    kills = [float(m.group(3)) for m in KILL_LINE.finditer(out)]
    joiner = JOINER_LINE.search(out)
    sent = SENT_LINE.search(out)
    lost = LOST_LINE.search(out)
    r = {"mode": mode, "wall": wall, "ranks": ranks}

    def bad(why):
        sys.stderr.write(out)
        sys.exit(f"failure_cost: mode {mode}: {why} ({' '.join(cmd)})")

    expected = {"a": [0, 1, 2, 3], "a+ckpt": [0, 1, 2, 3], "b": [0, 1, 2, 3], "c": [0, 1, 3], "d": [0, 1, 2, 3]}[mode]
    if sorted(x["rank"] for x in ranks) != expected:
        bad(f"ranks {sorted(x['rank'] for x in ranks)} finished, expected {expected}")
    if any(x["steps"] != a.steps for x in ranks) or len({x["hash"] for x in ranks}) != 1:
        bad("the ranks disagree on the steps or the parameters")
    r["hash"] = ranks[0]["hash"]
    r0 = next(x for x in ranks if x["rank"] == 0)
    r["step_s"] = (r0["wall"] - r0["setup"]) / (a.steps - r0["resumed_from"])
    r["setup"] = r0["setup"]
    if mode in ("b", "c", "d"):
        if len(kills) != 1:
            bad(f"{len(kills)} kill lines, expected 1")
        r["kill_t"] = kills[0]
    if mode == "b":
        if any(x["restart"] != 1 for x in ranks):
            bad("not every rank is a restarted one")
        r["resumed_from"] = r0["resumed_from"]
        r["redone"] = a.kill_step - 1 - r0["resumed_from"]
        r["relaunch"] = min(x["start"] for x in ranks) - r["kill_t"]
        r["restart_setup"] = max(x["setup"] for x in ranks)
    if mode in ("c", "d") and not lost:
        bad("no 'lost rank(s)' line from the trainer")
    if mode == "d":
        if "joined too late" in out:
            bad("the replacement came after the last step (raise --steps)")
        if not joiner or not sent:
            bad("no join: the replacement's or the trainer's line is missing")
        new = next(x for x in ranks if x["join"])
        r["joined_at"] = int(sent.group(1))
        r["sent"] = float(sent.group(2))
        r["replacement_start"] = new["start"] - r["kill_t"]
        r["join_init"] = float(joiner.group(2))
        r["join_state"] = float(joiner.group(3))
        r["healed"] = float(joiner.group(6)) - r["kill_t"]
    timeline(a, mode, out, r)
    return r


def timeline(a, mode, out, r):
    """From rank 0's step ends (each incarnation's: a restarted job starts again at its
    checkpoint): the normal step (the median of steps 2 .. kill-step - 1, none just after a
    checkpoint), the stall at the failure (the end of step kill-step - 1 to the end of step
    kill-step, or of the step after the replacement joined if later, less the normal steps in
    between; a run without a failure gets the same window: the noise), the steps after it against
    the normal one, and what a checkpoint adds to its step."""
    segments = []
    for m in STEP_LINE.finditer(out):
        step, t = int(m.group(1)), float(m.group(2))
        if not segments or step <= max(segments[-1]):
            segments.append({})
        segments[-1][step] = t
    if not segments:
        sys.exit(f"failure_cost: mode {mode}: no step lines from rank 0")
    ckpt = a.checkpoint_every if mode in ("a+ckpt", "b") else 0
    first = segments[0]

    def durations(seg, lo, hi):
        return [seg[s] - seg[s - 1] for s in range(lo, hi + 1)
                if s in seg and s - 1 in seg and not (ckpt and (s - 1) % ckpt == 0)]

    normal = med(durations(first, 2, a.kill_step - 1))
    k = a.kill_step
    end = max(k, r.get("joined_at", 0) + 1) if mode == "d" else k
    if k - 1 not in first or not any(end in seg for seg in segments):
        sys.exit(f"failure_cost: mode {mode}: rank 0's steps {k - 1} and {end} are not in its timeline")
    after = next(seg for seg in reversed(segments) if end in seg)
    r["normal_step"] = normal
    r["stall"] = after[end] - first[k - 1] - (end - k + 1) * normal
    r["step_after_before"] = med(durations(after, end + 2, a.steps)) / normal
    if mode == "a+ckpt":
        r["checkpoint"] = med([first[c + 1] - first[c] - normal for c in range(ckpt, a.steps, ckpt)
                               if c in first and c + 1 in first])


def spread(v, fmt="{:.2f}"):
    """'median (min to max)': the values may be negative."""
    return f"{fmt.format(med(v))} ({fmt.format(min(v))} to {fmt.format(max(v))})"


def med(v):
    return statistics.median(v) if v else float("nan")


def main():
    a = parse()
    kftrun = kftbench.kftrun(a.build)
    worker = kftbench.bench_program(a.build, "failure_worker")
    for p in (kftrun, worker):
        if not os.access(p, os.X_OK):
            sys.exit(f"failure_cost: {p} not found (build the targets kftrun and failure_worker)")
    shm0, tmp0 = shm_entries(), tmp_entries()
    params = int(a.state_mb * 1024 * 1024 / 8)
    print(f"# failure_cost: {RANKS} ranks under kftrun, state {a.state_mb:g} MiB ({params / (1 << 20):.4g} Mi f32 parameters "
          f"+ SGD momentum), {a.steps} steps, rank 2 SIGKILLed as step {a.kill_step} starts; checkpoints every "
          f"{a.checkpoint_every} steps in a+ckpt and b; {a.repeats} repeat(s), modes alternated")
    print(f"# CPU: {kftbench.cpu_description()}, {os.cpu_count()} CPUs; "
          f"{datetime.datetime.now().astimezone().strftime('%Y-%m-%d %H:%M %Z')}; load average at the start "
          f"{os.getloadavg()[0]:.2f}", flush=True)
    runs = {m: [] for m in a.modes}
    for rep in range(a.repeats):
        order = a.modes[rep % len(a.modes):] + a.modes[:rep % len(a.modes)]  # each mode leads a repeat in turn
        for mode in order:
            r = run_mode(a, mode, kftrun, worker)
            runs[mode].append(r)
            extra = ""
            if mode == "b":
                extra = f", resumed from step {r['resumed_from']}"
            if mode == "d":
                extra = f", joined after step {r['joined_at']}, state sent in {r['sent']:.3f} s"
            print(f"#   repeat {rep + 1}: {mode:6s} {r['wall']:7.2f} s{extra}", flush=True)

    walls = {m: med([r["wall"] for r in v]) for m, v in runs.items()}
    base = walls.get("a")
    print()
    step_s = med([r["step_s"] for r in runs["a"]]) if "a" in runs else float("nan")
    if "a" in runs:
        print(f"Reference (a): a step {step_s:.3f} s, set-up (init, state broadcast, replica check) "
              f"{med([r['setup'] for r in runs['a']]):.2f} s (medians).")
        print()
    print("| mode | what kftrun and the trainer do | wall, s: median (min-max) | lost vs (a), s: wall medians "
          f"| stall at step {a.kill_step}, s: median (min-max) | steps after / before |")
    print("| --- | --- | --- | --- | --- | --- |")
    for m in a.modes:
        v = [r["wall"] for r in runs[m]]
        lost = "-" if m == "a" or base is None else f"{walls[m] - base:+.2f}"
        if m == "b" and "a+ckpt" in walls:
            lost += f" ({walls[m] - walls['a+ckpt']:+.2f} vs a+ckpt)"
        print(f"| {m} | {MODES[m]} | {spread(v)} | {lost} | {spread([r['stall'] for r in runs[m]])} "
              f"| {med([r['step_after_before'] for r in runs[m]]):.2f} |")
    print()
    print(f"Stall: rank 0's end of step {a.kill_step - 1} to its end of step {a.kill_step} (in (d) of the step after "
          f"the join, if later), less the normal steps in that window (each run's median step before the "
          f"failure); in (a) the same window measures the noise. Steps after / before: the median step after "
          f"that window against the one before.")
    if "a+ckpt" in runs:
        print(f"(a+ckpt) a checkpoint ({a.state_mb:g} MiB, rank 0 writes it and fsyncs) adds "
              f"{med([r['checkpoint'] for r in runs['a+ckpt']]):.2f} s to its step (median).")
    if "b" in runs:
        b = runs["b"]
        print(f"(b) restart: kill to the restarted workers' start {med([r['relaunch'] for r in b]):.2f} s; their "
              f"set-up (init, checkpoint load, broadcast) {med([r['restart_setup'] for r in b]):.2f} s; resumed "
              f"from step {b[0]['resumed_from']}: {b[0]['redone']} finished step(s) and the interrupted one done "
              f"again (x {step_s:.3f} s = {(b[0]['redone'] + 1) * step_s:.2f} s).")
    if "d" in runs:
        d = runs["d"]
        print(f"(d) heal: kill to the replacement's start {med([r['replacement_start'] for r in d]):.2f} s; its "
              f"kft::init (admitted at a step boundary) {med([r['join_init'] for r in d]):.2f} s; state "
              f"({a.state_mb:g} MiB) sent in {spread([r['sent'] for r in d], '{:.3f}')} s (trainer, rank 0), "
              f"received in {med([r['join_state'] for r in d]):.3f} s (the replacement's trainer); kill to the "
              f"replacement holding the state {med([r['healed'] for r in d]):.2f} s; joined after step(s) "
              f"{sorted({r['joined_at'] for r in d})}.")
    hashes = {m: {r["hash"] for r in v} for m, v in runs.items()}
    if "a" in hashes:
        same = [m for m in ("a+ckpt", "b") if m in hashes and hashes[m] == hashes["a"]]
        differ = [m for m in ("a+ckpt", "b") if m in hashes and hashes[m] != hashes["a"]]
        if same or differ:
            print(f"Parameters at the end: {', '.join(same) or 'none'} on (a)'s bits"
                  + (f"; {', '.join(differ)} not" if differ else "")
                  + " ((c) and (d) train steps on 3 ranks: other sums, other bits).")

    # What the runs left behind.
    time.sleep(0.5)
    left_pids = worker_pids(worker)
    shm_new, tmp_new = shm_entries() - shm0, tmp_entries() - tmp0
    print(f"Left behind: failure_worker processes {left_pids or 'none'}; /dev/shm entries kft* "
          f"{sorted(shm_new) or 'none'}; {tempfile.gettempdir()} entries kft* {sorted(tmp_new) or 'none'}. "
          f"Load average at the end {os.getloadavg()[0]:.2f}.")
    if kftbench.hangs:
        print(f"Runs that hung and were run again: {kftbench.hangs}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"args": vars(a), "cpu": kftbench.cpu_description(), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A chaos run (issue 46 item 5): example 05's training under `kftrun --on-failure heal`, a
random worker killed (SIGKILL) every --every seconds for --minutes.

    python3 bench/fault/chaos.py [--build BUILD] [--minutes 10] [--every 15] [--ranks 4] [--hosts H]
                                 [--epochs N] [--seed S]

--hosts 1 (the default): --ranks workers under one kftrun. --hosts 2 or more: network-namespace
hosts on this machine (tests/netns/netns-cluster.sh; root), one kftrun agent each with
--ranks / --hosts workers, shared memory inside a host and Gloo between them; the victim is
drawn from every host's workers, and its own agent starts the replacement.

Every kill is survived without a restart: the survivors shrink and redo what they were in (a
step, an evaluation, the epoch's statistics), kftrun starts a replacement, and it joins at a
step boundary with the state of a survivor (docs/reliability.md). The kills stop after
--minutes; the training (--epochs, by default about --minutes of it) then finishes. Checked and
printed: kftrun's exit (0), the trainer's final test accuracy (--require-target: 87%), one
"lost" line per kill and one "joined" line per replacement, every rank's parameters hash equal
at the end (the trainer also compared the replicas after every shrink and join), and nothing
left behind: no example process, no kft* entry in /dev/shm or the run's temporary directory.
A benchmark: it reports what happened; the numbers are not pass/fail, the checks are.
"""
import argparse
import datetime
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402


def children(pid):
    """The live worker processes kftrun started (its direct children)."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout.split()
    return [int(p) for p in out]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default="build-tests")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--every", type=float, default=15.0, help="seconds between kills")
    ap.add_argument("--ranks", type=int, default=4, help="workers in all")
    ap.add_argument("--hosts", type=int, default=1, help="network-namespace hosts (1: none, this machine)")
    ap.add_argument("--epochs", type=int, default=0,
                    help="0: about --minutes of training (1.6 s an epoch on one host, 2.5 s on namespace hosts)")
    ap.add_argument("--seed", type=int, default=46)
    ap.add_argument("--verbose", action="store_true", help="print the job's lines about losses and joins")
    a = ap.parse_args()
    kftrun = kftbench.kftrun(a.build)
    example = kftbench.example(a.build, "05-fashion-mnist")
    for f in (kftrun, example):
        if not os.access(f, os.X_OK):
            sys.exit(f"chaos: {f} is not built (--build names the build directory)")
    if a.hosts < 1 or a.ranks % a.hosts:
        sys.exit(f"chaos: --ranks {a.ranks} does not divide among --hosts {a.hosts}")
    # (several hosts share this machine's CPUs: an epoch takes longer)
    epochs = a.epochs or max(5, int(a.minutes * 60 / (1.6 if a.hosts == 1 else 2.5)))
    rng = random.Random(a.seed)
    tmp = tempfile.mkdtemp(prefix="kft-chaos-")
    env = dict(os.environ, TMPDIR=tmp)
    program = [example, "--threads", "1", "--epochs", str(epochs), "--require-target"]
    heal = ["--on-failure", "heal", "--max-restarts", "10000", "--exit-grace", "0"]
    cluster = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                           "tests", "netns", "netns-cluster.sh")
    name = f"kfc{os.getpid() % 100000}"
    if a.hosts == 1:
        cmds = [[kftrun, "--nproc-per-node", str(a.ranks), *heal, "--", *program]]
    else:
        up = subprocess.run(["bash", cluster, "up", name, str(a.hosts)], capture_output=True, text=True)
        if up.returncode != 0:
            sys.exit(f"chaos: cannot make {a.hosts} namespace hosts (root?): {up.stderr.strip()}")
        master = subprocess.run(["bash", cluster, "addr", name, "0"], capture_output=True, text=True).stdout.strip()
        env["KFT_RDZV_TOKEN"] = f"chaos-{os.getpid()}"
        cmds = [["bash", cluster, "exec", name, str(i), kftrun, "--nnodes", str(a.hosts), "--node-rank", str(i),
                 "--master-addr", master, "--master-port", "29650", "--nproc-per-node", str(a.ranks // a.hosts),
                 "--run-id", name, *heal, "--", *program] for i in range(a.hosts)]
    print(f"# chaos: {kftbench.cpu_description()}, {os.cpu_count()} CPUs, {datetime.date.today()}")
    for cmd in cmds:
        print(f"# {' '.join(cmd)}")
    print(f"# a random worker killed every {a.every:g} s for {a.minutes:g} min (seed {a.seed})"
          + (f", {a.hosts} namespace hosts x {a.ranks // a.hosts} ranks" if a.hosts > 1 else ""), flush=True)
    logs = [open(os.path.join(tmp, f"agent{i}.log"), "w+") for i in range(len(cmds))]
    t0 = time.monotonic()
    # (the namespace wrapper execs into kftrun: the process started is the agent, its children the workers)
    jobs = [subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env) for cmd, log in zip(cmds, logs)]
    kills = []
    next_kill = t0 + a.every
    try:
        while any(j.poll() is None for j in jobs):
            now = time.monotonic()
            if now - t0 < a.minutes * 60 and now >= next_kill:
                pids = [p for j in jobs if j.poll() is None for p in children(j.pid)]
                if pids:
                    victim = rng.choice(pids)
                    try:
                        os.kill(victim, signal.SIGKILL)
                        kills.append((now - t0, victim))
                        print(f"  {now - t0:7.1f} s: killed pid {victim} (of {len(pids)} workers)", flush=True)
                    except ProcessLookupError:
                        pass
                next_kill = now + a.every
            time.sleep(0.2)
    finally:
        for j in jobs:
            if j.poll() is None:
                j.kill()
        if a.hosts > 1:
            subprocess.run(["bash", cluster, "down", name], capture_output=True)
    wall = time.monotonic() - t0
    out = ""
    for log in logs:
        log.seek(0)
        out += log.read()
        log.close()
    job_codes = [j.returncode for j in jobs]
    lost = re.findall(r"kft: step (\d+): lost rank\(s\) ([\d,]+) of (\d+)", out)
    joined = re.findall(r"kft: step (\d+): rank\(s\) ([\d,]+) joined; .*state sent in ([\d.]+) s", out)
    summary = re.search(r"summary: (\d+) steps, .*final test accuracy ([0-9.]+)", out)
    ended = re.findall(r"05-fashion-mnist: rank (\d+) ended as rank \d+ of (\d+) \(generation (\d+)\) after (\d+) steps, "
                       r"parameters hash ([0-9a-f]+)", out)
    hashes = {h for *_, h in ended}
    time.sleep(0.5)
    left_procs = subprocess.run(["pgrep", "-f", example], capture_output=True, text=True).stdout.split()
    left_shm = [f for f in os.listdir("/dev/shm") if f.startswith("kft")]
    left_tmp = [f for f in os.listdir(tmp) if not re.fullmatch(r"agent\d+\.log", f)]
    if a.verbose:
        for line in out.splitlines():
            if re.search(r"lost rank|joined;|ended as|replacement|was killed", line):
                print("    " + line[:220])
    sent = [float(s) for *_, s in joined]
    joins = sum(len(r.split(",")) for _, r, _ in joined)  # (replacements that came together join in one grow)
    print(f"| kills | shrinks | ranks joined (grows) | state sent (s, median) | wall (s) | steps | final accuracy | ranks at the end | hashes |")
    print(f"| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    print(f"| {len(kills)} | {len(lost)} | {joins} ({len(joined)}) | {sorted(sent)[len(sent) // 2] if sent else 0:.3f} | {wall:.0f} | "
          f"{summary.group(1) if summary else '-'} | {summary.group(2) if summary else '-'} | {len(ended)} | {len(hashes)} |")
    problems = []
    if any(job_codes):
        problems.append(f"kftrun exited {job_codes}")
    if not summary or float(summary.group(2)) < 0.87:
        problems.append("no summary with a final accuracy >= 0.87")
    if len(hashes) > 1:
        problems.append(f"the ranks ended on different parameters: {ended}")
    if kills and len(ended) != a.ranks:
        problems.append(f"{len(ended)} of {a.ranks} ranks said where they ended")
    if left_procs or left_shm or left_tmp:
        problems.append(f"left behind: processes {left_procs}, /dev/shm {left_shm}, {tmp}: {left_tmp}")
    if problems:
        print("chaos: " + "; ".join(problems))
        print("--- the job's last lines:\n" + "\n".join(out.splitlines()[-40:]))
        sys.exit(1)
    for i in range(len(logs)):
        os.unlink(os.path.join(tmp, f"agent{i}.log"))
    os.rmdir(tmp)
    print(f"chaos: every kill survived; {len(kills)} kills, the job exited 0 at {summary.group(2)} accuracy, "
          f"all {len(ended)} ranks on one parameters hash, nothing left behind")


if __name__ == "__main__":
    main()

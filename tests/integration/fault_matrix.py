#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The fault matrix: real 3-rank jobs under kftrun, one fault each, and what a user is owed.

    fault_matrix.py KFTRUN FAULT_WORKER PHASE      one phase's cases (startup, rendezvous, first,
                                                   small, large)
    fault_matrix.py KFTRUN TRAINER_WORKER PHASE    the trainer's phases: backward (mid backward
                                                   pass, buckets in flight), checkpoint (mid
                                                   checkpoint write; rank 0 writes)
    fault_matrix.py KFTRUN FAULT_WORKER soak N     4 ranks, N random collectives, verified

Each case runs `kftrun --timeout 5 --nproc-per-node 3 -- fault_worker fault PHASE RANK ACTION`
(see fault_worker.cpp) for RANK 0, 1, 2 and ACTION kill (SIGKILL) and stop (SIGSTOP); in the
collective phases also rank 1 skipping a call and rank 1 calling with a different count. The
trainer's phases run `trainer_worker ... --fault PHASE:RANK:ACTION` (example 05's model under
kft::ddp::trainer, checkpointing every 10 steps); a checkpoint cut short must leave no final file.
Every case asserts:
  - the job ends within the timeout + 5 s, with kftrun's failure class (tools/kftrun/exit_codes.hpp):
    3 (rank lost) for a killed rank, 1 (worker failed) otherwise: a stopped rank is found by the
    other ranks' timeouts (the agent's own check for a stopped worker, which would exit 5, waits
    --heartbeat-timeout, set here above the job's timeout);
  - the culprit is named: kftrun names a killed rank and its signal; for a stopped, skipping
    or mismatching rank, another rank's error names it and the operation it was in;
  - nothing is left: no process of the job, no new /dev/shm entry, nothing listening on the
    store's port, no temporary file (each case gets its own TMPDIR and XDG_RUNTIME_DIR, where
    kft writes its temporary files, and they must stay empty).
"""
import functools
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time

import procs
from procs import files_under, free_port, kft_shm, listening, marked_processes

KFTRUN, WORKER, PHASE = sys.argv[1], sys.argv[2], sys.argv[3]
MARK = "fault-" + str(random.randint(10**8, 10**9))
TIMEOUT = 5
TRAINER_PHASES = ("backward", "checkpoint")
# Not fatal: every case of the phase runs, and the phase fails by procs.failures at the end.
expect = functools.partial(procs.expect, fatal=False)


def job_processes():
    return marked_processes(MARK)


def env(private=None):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "KFT_", "RANK", "WORLD_SIZE", "TORCHELASTIC",
                                                                   "OMPI_", "PMIX", "SLURM_"))}
    e["KFT_RDZV_TOKEN"] = "t" + MARK
    if private:  # temporary files of the job go here, and nowhere else another test could write
        e["TMPDIR"] = e["XDG_RUNTIME_DIR"] = private
    return e


def survivor_lines(err, culprit):
    """What the other ranks printed (kftrun prefixes each line with [rank])."""
    return [l for l in err.splitlines() if re.match(r"\[(\d+)\]: ", l) and not l.startswith(f"[{culprit}]: ")]


def names(text, rank):
    return re.search(rf"\brank(\(s\))? {rank}\b|\blocal rank {rank}\b|\branks? [\d, ]*\b{rank}\b", text) is not None


def case(phase, rank, action):
    title = f"{phase}: rank {rank} {action}"
    shm0 = kft_shm()
    private = tempfile.mkdtemp(prefix="fault-tmp-")
    port = free_port()
    cmd = [KFTRUN, "--timeout", str(TIMEOUT), "--heartbeat-timeout", str(2 * TIMEOUT), "--term-grace", "2",
           "--master-port", str(port), "--nproc-per-node", "3", "--", WORKER]
    ckpt = None
    if phase in TRAINER_PHASES:
        ckpt = tempfile.mkdtemp(prefix="fault-ckpt-")
        cmd += ["--ckpt", ckpt, "--steps", "40", "--every", "10", "--global-batch", "96", "--shards", "6",
                "--fault", f"{phase}:{rank}:{action}", MARK]
    else:
        cmd += ["fault", phase, str(rank), action, MARK]
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env(private), capture_output=True, text=True, timeout=TIMEOUT + 60)
    except subprocess.TimeoutExpired as e:
        expect(False, f"{title}: the job ends", e.stderr)
        return
    took = time.monotonic() - t0
    err = p.stderr
    want = 3 if action == "kill" else 1  # rank lost; worker failed
    expect(p.returncode == want, f"{title}: the job fails with {want} (status {p.returncode})", err)
    expect(took < TIMEOUT + 5, f"{title}: within the timeout + 5 s ({took:.1f} s)", err)
    if action == "kill":
        expect(f"rank {rank} (local rank {rank}, node 0)" in err and "killed by signal 9 (SIGKILL)" in err,
               f"{title}: kftrun names rank {rank} and SIGKILL", err)
    else:
        others = "\n".join(survivor_lines(err, rank))
        expect(names(others, rank), f"{title}: another rank's error names rank {rank}", err)
        op = {"startup": r"shared segment|topology|set-up", "rendezvous": r"shared segment|set-up|topology",
              "first": r"allreduce", "small": r"allreduce", "large": r"allreduce",
              "backward": r"allreduce", "checkpoint": r"allreduce|broadcast|barrier"}[phase]
        if action in ("skip", "mismatch"):
            op = r"allreduce"
        expect(re.search(op, others) is not None, f"{title}: and the operation ({op})", others)
    deadline = time.monotonic() + 3
    while job_processes() and time.monotonic() < deadline:
        time.sleep(0.05)
    expect(not job_processes(), f"{title}: no process of the job is left", *job_processes())
    new_shm = [f for f in kft_shm() if f not in shm0]
    expect(not new_shm, f"{title}: nothing left in /dev/shm", new_shm)
    expect(not listening(port), f"{title}: nothing listens on the store's port {port}")
    if ckpt:
        said = {"backward": "in the middle of backward", "checkpoint": "while writing step 10's checkpoint"}[phase]
        expect(f"fault: {action} {said}" in p.stdout, f"{title}: the fault happened ({said})", p.stdout[-2000:])
        if phase == "checkpoint":
            final = [n for n in os.listdir(ckpt) if n == "ckpt-000000000010.kft"]
            expect(not final, f"{title}: the checkpoint cut short left no final file", sorted(os.listdir(ckpt)))
        shutil.rmtree(ckpt, ignore_errors=True)
    left = files_under(private)
    expect(not left, f"{title}: no temporary file left (in its TMPDIR and XDG_RUNTIME_DIR)", left)
    if not left:
        os.rmdir(private)


def soak(iterations):
    cmd = [KFTRUN, "--timeout", "60", "--nproc-per-node", "4", "--", WORKER, "soak", str(iterations), MARK]
    t0 = time.monotonic()
    p = subprocess.run(cmd, env=env(), capture_output=True, text=True, timeout=3600)
    took = time.monotonic() - t0
    print("\n".join(l for l in p.stdout.splitlines() if l.startswith("[0]: soak:")))
    expect(p.returncode == 0, f"soak: {iterations} collectives on 4 ranks, zero errors ({took:.1f} s)",
           p.stdout[-3000:], p.stderr[-3000:])
    for r in range(4):
        rows = [l for l in p.stdout.splitlines() if l.startswith(f"[{r}]: soak:")]
        vals = [(int(re.search(r"rss_kib=(\d+)", l).group(1)), int(re.search(r"fds=(\d+)", l).group(1))) for l in rows]
        if len(vals) < 3:
            expect(False, f"soak: rank {r} reported its RSS and descriptors", rows)
            continue
        warm, last = vals[1], vals[-1]  # after the first tenth: pools and caches are built
        expect(last[0] - warm[0] < 8 * 1024, f"soak: rank {r}'s RSS is flat ({warm[0]} -> {last[0]} KiB)")
        expect(last[1] == warm[1], f"soak: rank {r}'s open descriptors are flat ({warm[1]} -> {last[1]})")
    expect(not job_processes(), "soak: no process of the job is left", *job_processes())


if __name__ == "__main__":
    if PHASE == "soak":
        soak(int(sys.argv[4]))
    else:
        cases = [(r, a) for a in ("kill", "stop") for r in ((0,) if PHASE == "checkpoint" else (0, 1, 2))]
        if PHASE in ("small", "large"):
            cases += [(1, "skip"), (1, "mismatch")]
        for rank, action in cases:
            case(PHASE, rank, action)
    for line in job_processes():  # never leave anything behind, even on failure
        try:
            os.kill(int(line.split(":")[0]), 9)
        except (ProcessLookupError, ValueError):
            pass
    print(f"fault_matrix {PHASE}: {procs.failures} failure(s)")
    sys.exit(1 if procs.failures else 0)

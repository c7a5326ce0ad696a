#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The DDP trainer across real processes under kftrun.

    trainer_process_test.py TRAINER_WORKER KFTRUN SCENARIO

kill_resume: 2 ranks, deterministic, a checkpoint every 10 steps; rank 1 is SIGKILLed after
    step 25 under `kftrun --max-restarts 1`: the job restarts, resumes from step 20's
    checkpoint, and its final parameters are the bits of an unbroken run.
kill_in_checkpoint: rank 0 is SIGKILLed half-way through writing step 30's checkpoint: the
    restarted job never loads that file (it resumes from step 20), removes the dead writer's
    temporary file, and again ends on the unbroken run's bits.
uneven: 3 ranks where rank 1 trains 0%, 10% or 50% fewer batches: every run finishes (no
    hang), rank 1 shadows the missing steps, and the replicas end identical.
"""
import os
import re
import subprocess
import sys
import tempfile

from procs import expect  # (this folder is on the path when run as a script)

WORKER, KFTRUN, SCENARIO = sys.argv[1:4]


def clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_COMM", "PMI", "SLURM_", "KFT_STORE", "RANK", "WORLD_SIZE", "LOCAL_",
                                 "TORCHELASTIC"))}


def run(args, ranks=2, restarts=0):
    cmd = [KFTRUN, "--nproc-per-node", str(ranks), "--max-restarts", str(restarts), "--", WORKER] + args
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=clean_env())
    return p, p.stdout + p.stderr


HASH = re.compile(r"rank (\d+): steps (\d+) resumed_from (\d+) hash (\d+)")


def finals(out, ranks=2):
    got = {int(m.group(1)): (int(m.group(2)), int(m.group(3)), m.group(4)) for m in HASH.finditer(out)}
    expect(sorted(got) == list(range(ranks)), f"all {ranks} ranks reported their final parameters", out[-3000:])
    expect(len({v[2] for v in got.values()}) == 1, "the replicas are bit-identical", got)
    return got


def main():
    tmp = tempfile.mkdtemp(prefix="kft-trainer-proc-")
    if SCENARIO in ("kill_resume", "kill_in_checkpoint"):
        p, out = run(["--ckpt", os.path.join(tmp, "unbroken"), "--steps", "40", "--every", "10"])
        expect(p.returncode == 0, "the unbroken run finishes", out[-3000:])
        ref = finals(out)[0]
        expect(ref[0] == 40 and ref[1] == 0, "the unbroken run took 40 steps from scratch", ref)
        d = os.path.join(tmp, "broken")
        if SCENARIO == "kill_resume":
            fault = ["--kill-rank", "1", "--kill-step", "25"]
            said, resumed = "SIGKILL after step 25", 20
        else:
            fault = ["--kill-in-checkpoint", "30"]
            said, resumed = "SIGKILL while writing step 30's checkpoint", 20
        p, out = run(["--ckpt", d, "--steps", "40", "--every", "10"] + fault, restarts=1)
        expect(said in out, f"the fault happened ({said})", out[-3000:])
        expect(p.returncode == 0, "kftrun restarted the job and it finished", out[-3000:])
        got = finals(out)
        expect(all(v[1] == resumed for v in got.values()), f"every rank resumed from step {resumed}'s checkpoint", got, out[-2000:])
        expect(got[0][2] == ref[2], "the final parameters are the unbroken run's bits", got, ref)
        if SCENARIO == "kill_in_checkpoint":
            left = sorted(os.listdir(d))
            expect(not any(".tmp-" in n for n in left), "the dead writer's temporary file was removed at resume", left)
            expect(left == ["ckpt-000000000030.kft", "ckpt-000000000040.kft"],
                   "the resumed run wrote steps 30 and 40 itself (the newest 2 are kept)", left)
    elif SCENARIO == "uneven":
        for fewer in ("0", "0.1", "0.5"):
            p, out = run(["--steps", "30", "--uneven", fewer], ranks=3)
            expect(p.returncode == 0, f"rank 1 with {fewer} fewer batches: the job finishes", out[-3000:])
            rows = {int(m.group(1)): (int(m.group(2)), int(m.group(3)), m.group(4))
                    for m in re.finditer(r"rank (\d+): steps (\d+) shadowed (\d+) hash (\d+)", out)}
            expect(sorted(rows) == [0, 1, 2], "all 3 ranks reported", out[-2000:])
            expect(len({v[2] for v in rows.values()}) == 1, "the replicas are bit-identical", rows)
            expect(rows[1][1] == 30 - int(30 * (1 - float(fewer))), "rank 1 shadowed exactly the steps it lacked", rows)
    else:
        sys.exit(f"unknown scenario {SCENARIO}")


if __name__ == "__main__":
    main()

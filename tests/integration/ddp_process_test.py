#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The DDP reducer across real processes.

    ddp_process_test.py DDP_WORKER KFTRUN MPIRUN SCENARIO

equivalence_kftrun: 3 ranks under kftrun (shared memory): every rank's results equal the
    rank-order reference, bit-identical across ranks; deterministic mode gives the same bits
    under bucket caps 64 KiB, 1 MiB and 25 MiB.
equivalence_group: 2 "nodes" x 2 ranks under mpirun (KFT_HOST_ID): the same model over shared
    memory per node + MPI between nodes; results right and bit-identical across ranks.
kill: 3 ranks started by hand; rank 1 dies (SIGKILL) in the middle of step 3's backward; the
    others' finish() must raise an error naming it, within seconds (the deadline is 30 s).
"""
import os
import re
import socket
import subprocess
import sys
import time

from procs import expect  # (this folder is on the path when run as a script)

WORKER, KFTRUN, MPIRUN, SCENARIO = sys.argv[1:5]


def clean_env():
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("OMPI_COMM", "PMI", "SLURM_", "KFT_STORE", "RANK", "WORLD_SIZE", "LOCAL_"))}


OK = re.compile(r'rank (\d+) of (\d+) OK layout=(\d+) det=([\d,]+) group="([^"]*)"')


def results(stdout, n):
    got = {}
    for m in OK.finditer(stdout):
        got[int(m.group(1))] = (m.group(3), m.group(4).split(","), m.group(5))
    expect(sorted(got) == list(range(n)), f"every one of the {n} ranks reported OK", stdout[-3000:])
    return got


def same_across_ranks(got):
    layouts = {v[0] for v in got.values()}
    expect(len(layouts) == 1, "results are bit-identical on every rank", got)
    for c in range(3):
        dets = {v[1][c] for v in got.values()}
        expect(len(dets) == 1, f"deterministic results under cap #{c + 1} are bit-identical on every rank", got)


def main():
    if SCENARIO == "equivalence_kftrun":
        p = subprocess.run([KFTRUN, "--nproc-per-node", "3", "--", WORKER, "equivalence"],
                           capture_output=True, text=True, timeout=600, env=clean_env())
        expect(p.returncode == 0, "3 ranks under kftrun: every element equals the reference", p.stdout[-3000:], p.stderr[-3000:])
        got = results(p.stdout, 3)
        same_across_ranks(got)
        expect(len(set(got[0][1])) == 1, "deterministic mode: the same bits under caps 64 KiB, 1 MiB, 25 MiB", got[0])
        expect("shared memory" in got[0][2], "the group was the shared-memory one", got[0][2])
    elif SCENARIO == "equivalence_group":
        env = clean_env()
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
        cmd = [MPIRUN, "--oversubscribe", "-np", "2", "env", "KFT_HOST_ID=a", WORKER, "equivalence", ":",
               "-np", "2", "env", "KFT_HOST_ID=b", WORKER, "equivalence"]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
        expect(p.returncode == 0, "2 nodes x 2 ranks under mpirun: every element equals the reference",
               p.stdout[-3000:], p.stderr[-3000:])
        got = results(p.stdout, 4)
        same_across_ranks(got)
        expect("MPI between nodes" in got[0][2], "the group was shared memory per node + MPI", got[0][2])
    elif SCENARIO == "kill":
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        procs = []
        for r in range(3):
            env = clean_env()
            env.update(RANK=str(r), WORLD_SIZE="3", LOCAL_RANK=str(r), LOCAL_WORLD_SIZE="3",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), KFT_RDZV_TOKEN="ddp-test")
            procs.append(subprocess.Popen([WORKER, "kill"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                          text=True))
        out = [p.communicate(timeout=120) for p in procs]
        died = time.monotonic()
        expect(procs[1].returncode == -9, "rank 1 died by SIGKILL", procs[1].returncode, out[1][1])
        for r in (0, 2):
            err = out[r][1]
            expect(procs[r].returncode == 3, f"rank {r}'s finish() raised instead of hanging", procs[r].returncode, err)
            expect("ddp finish" in err and "of step 3" in err and "rank 1 (pid" in err and "died" in err,
                   f"rank {r}'s error names the step, the bucket's call and the dead rank", err)
        # Both survivors were done within seconds of being started (rank 1 died ~0.5 s in);
        # the group's deadline is 30 s, so this is detection, not the timeout.
        took = died - start_time
        expect(took < 15, f"the survivors gave up within seconds ({took:.1f} s from the start; deadline 30 s)")
    else:
        sys.exit(f"unknown scenario {SCENARIO}")
    print(f"ddp_process_test {SCENARIO}: 1 passed, 0 failed")


start_time = time.monotonic()
main()

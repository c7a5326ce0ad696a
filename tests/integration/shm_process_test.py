#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Shared-memory collectives across real processes.

    shm_process_test.py SHM_WORKER KFTRUN MPIRUN SCENARIO

sweep_kftrun / sweep_mpirun: the correctness sweep under each launcher.
kill: 3 ranks started by hand, rank 1 kills itself during an allreduce; the others must fail
      with an error naming it within seconds, and /dev/shm must hold nothing of the job.
mismatch: rank 0 broadcasts while rank 1 allreduces; both must report the mismatch.
shrink: 4 ranks by hand, rank 2 kills itself; the other three shrink the group and go on.
shrink_kftrun: the same under kftrun --on-failure continue, rank 0 lost (the store is kftrun's);
      then a process group shrunk in place.
"""
import os
import socket
import subprocess
import sys
import time

from procs import expect  # (this folder is on the path when run as a script)

WORKER, KFTRUN, MPIRUN, SCENARIO = sys.argv[1:5]


def shm_entries():
    return [f for f in os.listdir("/dev/shm") if f.startswith("kft-shm-worker")]


def by_hand(n, mode):
    """Starts n ranks directly (no launcher to kill the others): rank 0 hosts the store."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(n):
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMI", "SLURM_", "KFT_STORE"))}
        env.update(RANK=str(r), WORLD_SIZE=str(n), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(n),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), KFT_RDZV_TOKEN="shm-test")
        procs.append(subprocess.Popen([WORKER, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def sweep(cmd, n):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    expect(p.returncode == 0, f"{n} ranks pass the sweep", p.stdout[-3000:], p.stderr[-3000:])
    expect(p.stdout.count(" OK") == n, "every rank reported OK", p.stdout[-2000:])
    expect(not shm_entries(), "/dev/shm holds nothing of the job afterwards", shm_entries())


def all_kft_entries():
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("kft-"))


def die_at_startup(cmd, launcher):
    """Rank 1 of 3 is killed after meeting the store, before the shared segment: nothing may stay."""
    before = all_kft_entries()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    expect(p.returncode != 0, f"under {launcher}, the job fails", p.returncode, p.stderr[-2000:])
    if launcher == "kftrun":
        expect("rank 1 (local rank 1, node 0)" in p.stderr and "signal 9" in p.stderr,
               "naming rank 1 and SIGKILL", p.stderr[-2000:])
    left = [f for f in all_kft_entries() if f not in before]
    expect(not left, f"under {launcher}, no shared-memory segment is left in /dev/shm", left)


def stall(cmd, how, timeout_s):
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    expect(p.returncode != 0, f"{how}: a rank stuck outside kft fails the job", p.returncode, p.stderr[-2000:])
    expect(f"timed out after {timeout_s} s" in p.stderr and "waiting for rank(s) 1" in p.stderr,
           f"{how}: the others' allreduce times out after {timeout_s} s naming rank 1", p.stderr[-3000:])
    expect(took < timeout_s + 5, f"{how}: within the timeout + 5 s ({took:.1f} s)")


def main():
    if SCENARIO == "die_at_startup":
        die_at_startup([KFTRUN, "--nproc-per-node", "3", "--", WORKER, "die_at_startup"], "kftrun")
        die_at_startup([MPIRUN, "-np", "3", "--oversubscribe", WORKER, "die_at_startup"], "mpirun")
        return
    if SCENARIO == "timeout":
        stall([KFTRUN, "--timeout", "3", "--nproc-per-node", "2", "--", WORKER, "stall"], "kftrun --timeout 3", 3)
        env = dict(os.environ, KFT_TIMEOUT="4")
        t0 = time.monotonic()
        p = subprocess.run([MPIRUN, "-np", "2", "--oversubscribe", "-x", "KFT_TIMEOUT", WORKER, "stall"], env=env,
                           capture_output=True, text=True, timeout=120)
        expect(p.returncode != 0 and "timed out after 4 s" in p.stderr,
               "mpirun -x KFT_TIMEOUT=4: the same, from the environment", p.returncode, p.stderr[-3000:])
        expect(time.monotonic() - t0 < 4 + 5, "within the timeout + 5 s")
        return
    before = shm_entries()
    expect(not before, "no leftover segments before the test", before)
    if SCENARIO == "sweep_kftrun":
        sweep([KFTRUN, "--nproc-per-node", "3", "--", WORKER, "sweep"], 3)
    elif SCENARIO == "sweep_mpirun":
        sweep([MPIRUN, "-np", "4", "--oversubscribe", WORKER, "sweep"], 4)
    elif SCENARIO == "kill":
        procs = by_hand(3, "kill")
        time.sleep(1.0)
        during = shm_entries()
        t0 = time.monotonic()
        results = [p.communicate(timeout=60) for p in procs]
        took = time.monotonic() - t0
        expect(procs[1].returncode == -9, "rank 1 died by SIGKILL", procs[1].returncode)
        for r in (0, 2):
            err = results[r][1]
            expect(procs[r].returncode == 3, f"rank {r} failed with a kft error instead of hanging", procs[r].returncode, err)
            expect("rank 1 (pid" in err and "died during #" in err and "allreduce" in err,
                   f"rank {r}'s error names the dead rank and the operation", err)
        expect(took < 10, f"the survivors gave up within seconds ({took:.1f} s)")
        expect(not during, "/dev/shm held no segment while the job ran (unlinked once mapped)", during)
        expect(not shm_entries(), "and none afterwards", shm_entries())
    elif SCENARIO == "kill_mid_call":
        # The survivors' first wait of the call is slow (rank 1 comes 300 ms late), so a later
        # phase of the same call must still look for dead peers.
        procs = by_hand(3, "kill_mid_call")
        t0 = time.monotonic()
        results = [p.communicate(timeout=120) for p in procs]
        took = time.monotonic() - t0
        expect(procs[1].returncode == -9, "rank 1 died by SIGKILL", procs[1].returncode, results[1][1])
        for r in (0, 2):
            err = results[r][1]
            expect(procs[r].returncode == 3, f"rank {r} failed with a kft error", procs[r].returncode, err)
            expect("rank 1 (pid" in err and "died during #" in err,
                   f"rank {r}'s error names the dead rank (seen by liveness, not the 60 s deadline)", err)
        expect(took < 15, f"the survivors gave up within seconds ({took:.1f} s; deadline 60 s)")
        expect(not shm_entries(), "no segment left", shm_entries())
    elif SCENARIO == "shrink":
        # 4 ranks by hand (rank 0 hosts the store); rank 2 dies: the other three agree on
        # ranks 0,1,3 and go on as ranks 0,1,2 of a 3-rank group, no process restarted.
        procs = by_hand(4, "shrink")
        results = [p.communicate(timeout=120) for p in procs]
        expect(procs[2].returncode == -9, "rank 2 died by SIGKILL", procs[2].returncode, results[2][1])
        lines = []
        for r, new in ((0, 0), (1, 1), (3, 2)):
            out, err = results[r]
            expect(procs[r].returncode == 0, f"rank {r} went on in the smaller group", procs[r].returncode, err[-3000:])
            expect("rank 2 (pid" in err and "died during #" in err, f"rank {r} first saw the death named", err[-2000:])
            line = [x for x in out.splitlines() if x.startswith("shm_worker shrink:")]
            expect(len(line) == 1 and f"rank {r} -> {new} of 3 (members 0,1,3, lost 2, generation 1)" in line[0],
                   f"rank {r} is rank {new} of the survivors 0,1,3", out)
            lines.append(line[0])
        for x in lines:
            print(x)  # the measured times: error and new group after the death
        expect(not shm_entries(), "no segment left", shm_entries())
    elif SCENARIO == "shrink_kftrun":
        # Under kftrun --on-failure continue the store lives in kftrun, so rank 0 may die: ranks
        # 1,2,3 become 0,1,2 of 3, and kftrun exits 0 naming the lost rank.
        p = subprocess.run([KFTRUN, "--nproc-per-node", "4", "--on-failure", "continue", "--", WORKER, "shrink", "0"],
                           capture_output=True, text=True, timeout=120)
        expect(p.returncode == 0, "kftrun exits 0: every worker left finished", p.returncode, p.stderr[-3000:])
        expect("rank 0 (local rank 0) was killed by signal 9" in p.stderr and "the other workers go on" in p.stderr,
               "kftrun says rank 0 was lost and the others go on", p.stderr[-3000:])
        expect("lost on the way: rank(s) 0" in p.stderr, "and names it again at the end", p.stderr[-3000:])
        lines = [x for x in p.stdout.splitlines() if "shm_worker shrink:" in x]
        for r, new in ((1, 0), (2, 1), (3, 2)):
            expect(any(f"rank {r} -> {new} of 3 (members 1,2,3, lost 0, generation 1)" in x for x in lines),
                   f"rank {r} is rank {new} of the survivors 1,2,3", p.stdout[-3000:])
        for x in lines:
            print(x)
        # Through a process group shrunk in place (as the trainer holds one), rank 3 lost.
        p = subprocess.run([KFTRUN, "--nproc-per-node", "3", "--on-failure", "continue", "--", WORKER, "shrink_group",
                            "2"], capture_output=True, text=True, timeout=120)
        expect(p.returncode == 0, "a process group shrinks in place", p.returncode, p.stderr[-3000:])
        for r, new in ((0, 0), (1, 1)):
            expect(f"shrink_group: rank {r} -> {new} of 2 (members 0,1); shared memory: 1 node x 3 ranks (shrunk to 2 "
                   f"of 3 ranks: 0,1, generation 1)" in p.stdout, f"rank {r} holds the shrunk group", p.stdout[-3000:])
        # Without --on-failure continue, the same loss stops the job (the default is unchanged).
        p = subprocess.run([KFTRUN, "--nproc-per-node", "3", "--", WORKER, "shrink", "1"],
                           capture_output=True, text=True, timeout=120)
        expect(p.returncode == 3, "by default a lost worker stops the job (rank lost: 3)", p.returncode, p.stderr[-3000:])
        expect(not shm_entries(), "no segment left", shm_entries())
    elif SCENARIO == "mismatch":
        procs = by_hand(2, "mismatch")
        results = [p.communicate(timeout=60) for p in procs]
        for r in (0, 1):
            err = results[r][1]
            expect(procs[r].returncode == 4, f"rank {r} raised mismatch_error", procs[r].returncode, err)
            other = 1 - r
            expect(f"rank {other} is at #2 " in err and "#2 allreduce f32 x 1048576 (sum)" in err
                   and "#2 broadcast f32 x 4096 (root 0)" in err,
                   f"rank {r}'s message names both sides", err)
    else:
        sys.exit(f"unknown scenario {SCENARIO}")
    print(f"shm_process_test {SCENARIO}: 1 passed, 0 failed")


main()

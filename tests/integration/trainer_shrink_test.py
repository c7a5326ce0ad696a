#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The DDP trainer going on without a lost rank (trainer_options::shrink_store; issue 46).

    trainer_shrink_test.py KFTRUN WORKER

4 ranks under kftrun --on-failure continue; rank 2 kills itself as step 5's backward pass
starts. The survivors shrink to 3 ranks, redo step 5 with the global batch of 24 shared by
three (8 each: divisible, so no share is padded), and finish 2 epochs (20 steps). Checked:
  - kftrun exits 0, naming the lost rank; each survivor prints the same parameters hash;
  - every sample is seen exactly once per epoch over all ranks' finished steps (the lost rank's
    steps 1-4 included, the interrupted attempt of step 5 not);
  - deterministic mode (12 fixed shards per global batch): the run that lost a rank ends on the
    bits of an uninterrupted 4-rank run (the same hash), and so does one that loses a second
    rank (job rank 1 in step 13: generation 2, 2 ranks left).
"""
import collections
import os
import subprocess
import sys
import tempfile

from procs import expect  # (this folder is on the path when run as a script)

KFTRUN, WORKER = sys.argv[1:3]


def run(victim, kill_step, *extra):
    out = tempfile.mkdtemp(prefix="kft-trainer-shrink-")
    p = subprocess.run([KFTRUN, "--nproc-per-node", "4", "--on-failure", "continue", "--exit-grace", "0", "--",
                        WORKER, out, str(victim), str(kill_step), *extra], capture_output=True, text=True, timeout=300)
    seen = collections.defaultdict(list)  # (epoch, sample) -> [(rank, step)]
    for name in os.listdir(out):
        rank = int(name.split(".")[1])
        with open(os.path.join(out, name)) as f:
            for line in f:
                e, step, i = map(int, line.split())
                seen[(e, i)].append((rank, step))
        os.unlink(os.path.join(out, name))
    os.rmdir(out)
    hashes = {}
    for line in p.stdout.splitlines():
        if "trainer_shrink: rank" in line:
            parts = line.split("trainer_shrink: ")[1].split()
            hashes[int(parts[1])] = (parts[5], int(parts[7]), int(parts[3]))
    return p, seen, hashes


def main():
    for mode in ([], ["deterministic"]):
        label = mode[0] if mode else "normal"
        p, seen, hashes = run(2, 5, *mode)
        expect(p.returncode == 0, f"{label}: kftrun exits 0 without rank 2", p.returncode, p.stderr[-4000:])
        expect("rank 2 (local rank 2) was killed by signal 9" in p.stderr and "lost on the way: rank(s) 2" in p.stderr,
               f"{label}: kftrun names the lost rank", p.stderr[-3000:])
        expect("step 5: lost rank(s) 2 of 4" in p.stderr and "going on with 3 rank(s) (members 0,1,3" in p.stderr
               and "redoing the step" in p.stderr, f"{label}: the trainer says what it did", p.stderr[-3000:])
        expect(sorted(hashes) == [0, 1, 3], f"{label}: ranks 0, 1 and 3 finished", hashes, p.stdout[-2000:])
        expect(len({h for h, _, _ in hashes.values()}) == 1, f"{label}: the survivors end on the same parameters",
               hashes)
        expect(all(steps == 20 and size == 3 for _, steps, size in hashes.values()),
               f"{label}: 20 steps, 3 ranks at the end", hashes)
        twice = {k: v for k, v in seen.items() if len(v) != 1}
        expect(not twice, f"{label}: no sample seen twice in an epoch", list(twice.items())[:5])
        for e in (0, 1):
            got = sorted(i for (ep, i) in seen if ep == e)
            expect(got == list(range(240)), f"{label}: epoch {e}: every sample seen exactly once",
                   [i for i in range(240) if i not in got][:10])
        lost_steps = sorted({s for v in seen.values() for r, s in v if r == 2})
        expect(lost_steps == [1, 2, 3, 4], f"{label}: rank 2 finished steps 1-4, then was gone", lost_steps)
        if mode:
            q, _, ref = run(-1, 0, *mode)
            expect(q.returncode == 0 and sorted(ref) == [0, 1, 2, 3], "deterministic: the uninterrupted run",
                   q.returncode, q.stderr[-2000:])
            expect({h for h, _, _ in ref.values()} == {h for h, _, _ in hashes.values()},
                   "deterministic: the run that lost a rank ends on the uninterrupted run's bits", ref, hashes)
            # Two losses: job rank 1 also dies in step 13, after the first shrink (generation 2,
            # 2 ranks left); still every sample once an epoch, and still the same bits.
            r, seen2, two = run(2, 5, *mode, "1", "13")
            expect(r.returncode == 0 and sorted(two) == [0, 3], "two losses: ranks 0 and 3 finish", r.returncode,
                   two, r.stderr[-3000:])
            expect("step 13: lost rank(s) 1 of 3" in r.stderr and "generation 2" in r.stderr,
                   "two losses: the second shrink is generation 2", r.stderr[-3000:])
            expect(all(len(v) == 1 for v in seen2.values()) and len(seen2) == 480,
                   "two losses: every sample exactly once in each of the 2 epochs", len(seen2))
            expect({h for h, _, _ in two.values()} == {h for h, _, _ in ref.values()},
                   "two losses: the uninterrupted run's bits again", two, ref)
    print("trainer_shrink_test: 1 passed, 0 failed")


if __name__ == "__main__":
    main()

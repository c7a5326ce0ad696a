#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Example 05 goes on without a lost rank (--on-lost-rank shrink; issue 46).

    example05_lost_rank.py KFTRUN EXAMPLE05 heal|continue

The README's training run (5 epochs, 1565 steps, --require-target 0.87) on 3 ranks under
`kftrun --on-failure heal --max-restarts 1` (or `continue`), without --on-lost-rank: the example
picks shrink from KFT_ON_FAILURE. Its fault drill kills rank 1 (heal) or rank 0 (continue: the
rank that reports) with SIGKILL as step 200 of epoch 1 starts. Checked:
  - kftrun exits 0 and names the lost rank; the trainer says it lost it in step 200 and redoes
    that step with the other two (generation 1);
  - heal: kftrun starts a replacement for rank 1 and the trainer admits it at a step boundary
    (3 ranks again, generation 2); continue: the two survivors finish alone;
  - the summary is reached (continue: printed by job rank 1, the new rank 0): 1565 steps (the redone step counted once), the accuracy target
    met (--require-target: exit 3 below it, which kftrun would report);
  - every rank left says where it ended, all on the same parameters hash (the trainer also
    compared the replicas at the end and after the shrink and the join);
  - nothing is left in /dev/shm.
"""
import re
import subprocess
import sys

from procs import expect, kft_shm  # (this folder is on the path when run as a script)

KFTRUN, EXAMPLE, POLICY = sys.argv[1:4]
VICTIM = 1 if POLICY == "heal" else 0
LEFT = [r for r in range(3) if r != VICTIM]
REPORTER = LEFT[0]  # the new rank 0 while the victim is gone (kftrun prefixes lines with the job rank)
STEPS = 1565  # 5 epochs of ceil(60000 / 192) steps


def main():
    expect(POLICY in ("heal", "continue"), f"policy {POLICY!r} is heal or continue")
    cmd = [KFTRUN, "--nproc-per-node", "3", "--on-failure", POLICY,
           *(["--max-restarts", "1"] if POLICY == "heal" else []), "--",
           EXAMPLE, "--threads", "1", "--require-target", "--kill-rank", str(VICTIM), "--kill-at-step", "200"]
    print(" ".join(cmd), flush=True)
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=150)
    out = p.stdout
    print(out, flush=True)
    expect(p.returncode == 0, f"kftrun --on-failure {POLICY} exits 0 without rank {VICTIM}", p.returncode)
    expect(f"rank {VICTIM} (local rank {VICTIM}) was killed by signal 9 (SIGKILL)" in out,
           f"kftrun says rank {VICTIM} was killed")
    expect(re.search(rf"\[{REPORTER}\]: kft: step 200: lost rank\(s\) {VICTIM} of 3 \([^\n]*\); going on with 2 "
                     rf"rank\(s\) \(members {LEFT[0]},{LEFT[1]}, generation 1\), redoing the step\n", out) is not None,
           f"the trainer lost rank {VICTIM} in step 200 and redoes it with ranks {LEFT}")
    joined = re.search(r"\[0\]: kft: step (\d+): rank\(s\) 1 joined; going on with 3 rank\(s\) \(was 2; members "
                       r"0,1,2, generation 2; state sent in [0-9.]+ s\)\n", out)
    if POLICY == "heal":
        expect("replacement 1 of at most 1" in out and "lost on the way: rank(s) 1 (--on-failure heal: 1 replacement(s)"
               in out, "kftrun started one replacement for rank 1")
        expect(joined is not None and 200 <= int(joined.group(1)) <= STEPS,
               "the replacement joined at a step boundary, for step 200 (the redo) or a later one")
    else:
        expect(joined is None and f"lost on the way: rank(s) {VICTIM} (--on-failure continue)" in out,
               f"no replacement: ranks {LEFT} finish alone")
    summary = re.search(rf"\[{REPORTER}\]: summary: {STEPS} steps, [^\n]*final test accuracy ([0-9.]+)[^\n]*"
                        r"time to accuracy 0\.87: [0-9.]+ s", out)
    expect(summary is not None and float(summary.group(1)) >= 0.87,
           f"the summary: {STEPS} steps, final test accuracy >= 0.87", summary and summary.group(0))
    ended = re.findall(r"\[(\d+)\]: 05-fashion-mnist: rank (\d+) ended as rank (\d+) of (\d+) \(generation (\d+)\) "
                       r"after (\d+) steps, parameters hash ([0-9a-f]{16})\n", out)
    ranks = sorted(int(job) for _, job, _, _, _, _, _ in ended)
    size, generation = (3, 2) if POLICY == "heal" else (2, 1)
    expect(ranks == ([0, 1, 2] if POLICY == "heal" else LEFT), "every rank left says where it ended", ranks)
    expect(all(int(n) == size and int(g) == generation and int(s) == STEPS for _, _, _, n, g, s, _ in ended),
           f"each ended in a group of {size} (generation {generation}) after {STEPS} steps", ended)
    expect(len({h for *_, h in ended}) == 1, "all of them on the same parameters", ended)
    expect(not kft_shm(), "nothing left in /dev/shm", kft_shm())
    print(f"example05_lost_rank ({POLICY}): 1 passed, 0 failed")


if __name__ == "__main__":
    main()

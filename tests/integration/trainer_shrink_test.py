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
    rank (job rank 1 in step 13: generation 2, 2 ranks left);
  - under kftrun --on-failure heal, a replacement for rank 2 joins at a step boundary (before
    the redo of step 5 when it starts fast; the survivors wait for it after step 7) and gets the survivors' state over the group: all 4 ranks end on the same parameters after
    20 steps, every sample is still seen once per epoch (the replacement's steps counted),
    and deterministic mode ends on the uninterrupted run's bits (lost and regained);
  - a streaming model (records read from a file): a replacement for rank 2 joins, takes the
    records' position with the state when its fit() starts, and all 4 ranks end on an
    uninterrupted streamed run's bits (deterministic mode), every record once per epoch;
  - deterministic heal, a rank lost during the join itself (a member, or the replacement, once
    the group has grown and before the state is sent): the others shrink, redo the join, and
    end on the uninterrupted run's bits, every sample once per epoch;
  - a replacement that arrives after the last step (a slow restart) finds the job finished and
    leaves, exit 0;
  - deterministic mode, a rank lost around a checkpoint (before its replica check, or rank 0
    while writing it) or as the run ends: the survivors go on (or redo the summary) and end on
    the uninterrupted run's bits, and no temporary checkpoint file is left.
"""
import collections
import os
import re
import subprocess
import sys
import tempfile

from procs import expect  # (this folder is on the path when run as a script)

KFTRUN, WORKER = sys.argv[1:3]


def run(victim, kill_step, *extra, policy="continue", join_delay_ms=None, kill_in_eval=None, kill_in=None,
        records=None, joiner_records=None, kill_in_join=None, restarts=1):
    out = tempfile.mkdtemp(prefix="kft-trainer-shrink-")
    p = subprocess.run([KFTRUN, "--nproc-per-node", "4", "--on-failure", policy,
                        *(["--max-restarts", str(restarts)] if policy == "heal" else []), "--exit-grace", "0", "--", WORKER, out, str(victim), str(kill_step), *extra],
                       capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, **({"TRAINER_SHRINK_JOIN_DELAY_MS": str(join_delay_ms)} if join_delay_ms else {}),
                                **({"TRAINER_SHRINK_KILL_IN_EVAL": str(kill_in_eval)} if kill_in_eval else {}),
                                **({"TRAINER_SHRINK_KILL_IN": kill_in} if kill_in else {}),
                                **({"TRAINER_SHRINK_KILL_IN_JOIN": kill_in_join} if kill_in_join else {}),
                                **({"TRAINER_SHRINK_RECORDS": records} if records else {}),
                                **({"TRAINER_SHRINK_JOINER_RECORDS": joiner_records} if joiner_records else {})))
    seen = collections.defaultdict(list)  # (epoch, sample) -> [(rank, step)]
    if os.path.isdir(os.path.join(out, "ckpt")):
        for name in os.listdir(os.path.join(out, "ckpt")):
            os.unlink(os.path.join(out, "ckpt", name))
        os.rmdir(os.path.join(out, "ckpt"))
    for name in os.listdir(out):
        rank = int(name.split(".")[1]) + 100 * int(name.split(".")[2])  # (a replacement: 100 + its rank)
        with open(os.path.join(out, name)) as f:
            for line in f:
                e, step, i = map(int, line.split())
                seen[(e, i)].append((rank, step))
        os.unlink(os.path.join(out, name))
    os.rmdir(out)
    hashes, evals = {}, {}
    for line in p.stdout.splitlines():
        if "trainer_shrink: rank" in line and "joined too late" not in line and " checkpoints " not in line:
            parts = line.split("trainer_shrink: ")[1].split()
            hashes[int(parts[1])] = (parts[5], int(parts[7]), int(parts[3]))
            if len(parts) > 11:
                evals[int(parts[1])] = (int(parts[9]), parts[11])
    p.evals = evals
    p.checkpoints = {int(r): files for r, files in re.findall(r"trainer_shrink: rank (\d+) checkpoints (\S*)", p.stdout)}
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
            # A rank lost around a checkpoint (every 3 steps, the newest 2 kept) or at the end:
            #   checkpoint  rank 2 dies before step 6's checkpoint: the others fail in its replica
            #               check and redo the checkpoint;
            #   write       rank 0 dies writing step 6's checkpoint: the others had finished it and
            #               fail in step 7; the new rank 0 says the file was not written, and its
            #               next write removes the temporary file the dead writer left;
            #   end         rank 2 dies as the last epoch ends: the others redo the run's summary.
            for where, victim, said in [("checkpoint", 2, "redoing the checkpoint"),
                                        ("write", 0, "the checkpoint of step 6 was not written: the rank writing it was lost"),
                                        ("end", 2, "redoing the run's summary")]:
                c, seen5, ck = run(victim, 6, *mode, kill_in=where)
                rest = sorted({0, 1, 2, 3} - {victim})
                expect(c.returncode == 0 and sorted(ck) == rest, f"loss in the {where}: ranks {rest} finish",
                       c.returncode, ck, c.stderr[-3000:])
                expect(f"lost rank(s) {victim} of 4" in c.stderr and said in c.stderr,
                       f"loss in the {where}: the trainer says '{said}'", c.stderr[-3000:])
                expect({h for h, _, _ in ck.values()} == {h for h, _, _ in ref.values()} and
                       all(st == 20 for _, st, _ in ck.values()),
                       f"loss in the {where}: 20 steps, the uninterrupted run's bits", ck, ref)
                expect(all(len(x) == 1 for x in seen5.values()) and len(seen5) == 480,
                       f"loss in the {where}: every sample exactly once in each of the 2 epochs", len(seen5))
                expect(set(c.checkpoints.values()) == {"15,18"},
                       f"loss in the {where}: the checkpoints of steps 15 and 18 and no temporary file are left",
                       c.checkpoints)
        # Healing: kftrun starts a replacement for rank 2; it joins at a boundary, by step 7's.
        h, seen3, healed = run(2, 5, *mode, policy="heal")
        expect(h.returncode == 0, f"{label} heal: kftrun exits 0", h.returncode, h.stderr[-4000:])
        expect("a replacement joins them at a step boundary (--on-failure heal" in h.stderr,
               f"{label} heal: kftrun says it started a replacement", h.stderr[-3000:])
        joined = re.search(r"step (\d+): rank\(s\) 2 joined; going on with 4 rank\(s\) \(was 3; members 0,1,2,3, "
                           r"generation 2; state sent in", h.stderr)
        expect(joined and 5 <= int(joined.group(1)) <= 8,
               f"{label} heal: the trainer says rank 2 joined for step 5 (the redo) to 8 (after the wait)",
               h.stderr[-3000:])
        at = int(joined.group(1))
        expect(sorted(healed) == [0, 1, 2, 3] and len({x for x, _, _ in healed.values()}) == 1,
               f"{label} heal: all 4 ranks, the replacement included, end on the same parameters", healed,
               h.stdout[-2000:])
        expect(all(steps == 20 and size == 4 for _, steps, size in healed.values()),
               f"{label} heal: 20 steps, 4 ranks at the end", healed)
        expect(all(len(v) == 1 for v in seen3.values()) and len(seen3) == 480,
               f"{label} heal: every sample exactly once in each of the 2 epochs",
               len(seen3), [kv for kv in seen3.items() if len(kv[1]) != 1][:5])
        by_rank = collections.defaultdict(set)
        for v in seen3.values():
            for r, s in v:
                by_rank[r].add(s)
        expect(sorted(by_rank[2]) == [1, 2, 3, 4] and sorted(by_rank[102]) == list(range(at, 21)),
               f"{label} heal: rank 2 finished steps 1-4, its replacement steps {at}-20",
               sorted(by_rank[2]), sorted(by_rank[102]))
        if mode:
            expect({x for x, _, _ in healed.values()} == {x for x, _, _ in ref.values()},
                   "deterministic heal: a run that lost and regained a rank ends on the uninterrupted run's bits",
                   healed, ref)
            # A rank lost during the join itself, once the group has grown to 4 again and before
            # the state is sent: a member (job rank 1), or the replacement. The others are in
            # the join's collectives: they shrink, send the state again (or to nobody), and a
            # second replacement joins later (or finds the job finished and leaves). And job
            # rank 1 lost at the boundary where the survivors (waiting after step 7 for the
            # replacement, which starts 0.7 s late) are about to admit it: they shrink first (or
            # give the grow up, or decide it without rank 1 after the window), then admit it.
            for who, said in [("member", r"lost rank\(s\) 1 of 4 \(.*\); going on with 3 rank\(s\).*redoing the join"),
                              ("joiner", r"lost rank\(s\) 2 of 4 \(.*\); going on with 3 rank\(s\).*redoing the join"),
                              ("boundary", r"lost rank\(s\) 1 of 3 |joined, rank\(s\) 1 lost;")]:
                j, seen7, jh = run(2, 5, *mode, policy="heal", kill_in_join=who, restarts=2,
                                   join_delay_ms=700 if who == "boundary" else None)
                expect(j.returncode == 0, f"loss in the join ({who}): kftrun exits 0", j.returncode, j.stderr[-4000:])
                expect(re.search(said, j.stderr) and re.search(r"rank\(s\) 2 joined", j.stderr),
                       f"loss in the join ({who}): the survivors say whom they lost, and rank 2 joined",
                       j.stderr[-4000:])
                finished = {r: v for r, v in jh.items()}
                expect(len(finished) >= 3 and len({x for x, _, _ in finished.values()}) == 1 and
                       all(st == 20 for _, st, _ in finished.values()),
                       f"loss in the join ({who}): every rank left runs 20 steps and ends on the same parameters",
                       jh, j.stdout[-2000:])
                expect({x for x, _, _ in finished.values()} == {x for x, _, _ in ref.values()},
                       f"loss in the join ({who}): the uninterrupted run's bits", jh, ref)
                expect(all(len(v) == 1 for v in seen7.values()) and len(seen7) == 480,
                       f"loss in the join ({who}): every sample exactly once in each of the 2 epochs", len(seen7),
                       [kv for kv in seen7.items() if len(kv[1]) != 1][:5])
        # A rank lost in an evaluation (its 2nd, after step 6; evaluations every 3 steps and at
        # each epoch's end): the survivors redo it (or take it from one that finished it) and go on.
        v, seen4, ev = run(2, 0, *mode, kill_in_eval=2)
        expect(v.returncode == 0 and sorted(ev) == [0, 1, 3], f"{label} eval loss: ranks 0, 1 and 3 finish",
               v.returncode, ev, v.stderr[-3000:])
        expect("lost rank(s) 2 of 4" in v.stderr and ("redoing the evaluation" in v.stderr or
                                                        "the evaluation was finished by a survivor" in v.stderr),
               f"{label} eval loss: the trainer says it lost rank 2 in an evaluation", v.stderr[-3000:])
        expect(len({x for x, _, _ in ev.values()}) == 1 and all(st == 20 for _, st, _ in ev.values()),
               f"{label} eval loss: 20 steps, the same parameters", ev)
        expect(len(set(v.evals.values())) == 1 and list(v.evals.values())[0][0] == 8,
               f"{label} eval loss: every survivor has the same 8 evaluations, the same last loss", v.evals)
        expect(all(len(x) == 1 for x in seen4.values()) and len(seen4) == 480,
               f"{label} eval loss: every sample exactly once in each of the 2 epochs", len(seen4))
        if mode:
            expect({x for x, _, _ in ev.values()} == {x for x, _, _ in ref.values()},
                   "deterministic eval loss: the uninterrupted run's bits", ev, ref)
    # A streaming model: the 240 samples as records of one u16 token each (the sample's number).
    # Rank 2 dies in step 5; its replacement opens the records alone, joins, and takes the
    # records' position with the state when its fit() starts.
    rec_dir = tempfile.mkdtemp(prefix="kft-trainer-shrink-records-")
    records = os.path.join(rec_dir, "samples.u16")
    with open(records, "wb") as f:
        f.write(b"".join(i.to_bytes(2, "little") for i in range(240)))
    try:
        q, _, sref = run(-1, 0, "deterministic", records=records)
        expect(q.returncode == 0 and sorted(sref) == [0, 1, 2, 3] and len({x for x, _, _ in sref.values()}) == 1,
               "streamed: the uninterrupted run", q.returncode, sref, q.stderr[-2000:])
        h, seen6, healed = run(2, 5, "deterministic", policy="heal", records=records)
        expect(h.returncode == 0, "streamed heal: kftrun exits 0", h.returncode, h.stderr[-4000:])
        expect(re.search(r"step \d+: rank\(s\) 2 joined; going on with 4 rank\(s\)", h.stderr),
               "streamed heal: the trainer says rank 2 joined", h.stderr[-3000:])
        expect(sorted(healed) == [0, 1, 2, 3] and all(st == 20 and n == 4 for _, st, n in healed.values()),
               "streamed heal: all 4 ranks, the replacement included, run 20 steps", healed, h.stdout[-2000:])
        expect(all(len(v) == 1 for v in seen6.values()) and len(seen6) == 480,
               "streamed heal: every record exactly once in each of the 2 epochs", len(seen6),
               [kv for kv in seen6.items() if len(kv[1]) != 1][:5])
        expect(any(r == 102 for v in seen6.values() for r, _ in v), "streamed heal: the replacement trained")
        expect({x for x, _, _ in healed.values()} == {x for x, _, _ in sref.values()},
               "streamed heal: lost and regained, the uninterrupted streamed run's bits", healed, sref)
        # A replacement with other records (one record fewer): the fit() of every rank fails,
        # naming the joiner's file, where the joiner would otherwise read other records than its
        # share (kftrun then restarts the job: --max-restarts 1).
        with open(records + ".short", "wb") as f:
            f.write(b"".join(i.to_bytes(2, "little") for i in range(239)))
        b, _, _ = run(2, 5, "deterministic", policy="heal", records=records, joiner_records=records + ".short")
        said = [line for line in b.stderr.splitlines() if "the record source of rank(s) 2 differs from rank 0's" in line
                and "samples.u16.short" in line]
        expect(len(said) == 4, "streamed heal, other records: every rank's fit() fails naming the joiner's file",
               b.stderr[-3000:])
    finally:
        if os.path.exists(records + ".short"):
            os.unlink(records + ".short")
        os.unlink(records)
        os.rmdir(rec_dir)
    # A replacement that comes after the last step (it starts 3 s late; the survivors redo step
    # 20 and finish in well under that): the job is done, it leaves (exit 0).
    late, _, done = run(2, 20, policy="heal", join_delay_ms=3000)
    expect(late.returncode == 0 and sorted(done) == [0, 1, 3], "late replacement: the survivors finish, exit 0",
           late.returncode, done, late.stderr[-3000:])
    expect("trainer_shrink: rank 2 joined too late" in late.stdout and "the group finished first" in late.stdout,
           "late replacement: it is told the job finished", late.stdout[-2000:])
    print("trainer_shrink_test: 1 passed, 0 failed")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two builds of kft, the same bench, alternating runs: did a change slow anything down?

  python3 bench/scripts/compare_builds.py --before /tmp/old/build --after build-tests --runs 5 \\
      [--ranks 2] [--nodes]  -- -b 8 -e 64M -f 4 -n 20 -w 5

Runs BUILD/bench/allreduce_perf from each build in turn (before, after, after, before, ...) and prints,
per size, the median out-of-place time (us) of each and after/before. --nodes runs the
across-nodes table instead (2 "nodes" of --ranks/2 ranks each through KFT_HOST_ID) and compares
its hierarchical and flat times. Arguments after -- go to the bench unchanged. Medians, because
one run on a shared VM can be off by 2x; alternation, because the VM's speed drifts.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402


def times_of(build, args, extra, out):
    """One run of BUILD's allreduce_perf: size -> its times (us)."""
    exe = kftbench.bench_program(build, "allreduce_perf")
    if args.nodes:
        half = args.ranks // 2
        cmd = ["mpirun", "--oversubscribe", "-np", str(half), "env", "KFT_HOST_ID=a", exe, *extra, "--json", out, ":",
               "-np", str(args.ranks - half), "env", "KFT_HOST_ID=b", exe, *extra, "--json", out]
    else:
        cmd = ["mpirun", "--oversubscribe", "-np", str(args.ranks), exe, "--no-peers", *extra, "--json", out]
    kftbench.run(cmd, limit=1800, env=kftbench.ROOT_ENV)
    with open(out) as f:
        doc = json.load(f)
    times = {}
    for row in doc["results"]:
        if args.nodes:
            times[row["size"]] = {"hierarchical": row["hierarchical_us"], "flat": row["flat_us"]}
        else:
            times[row["size"]] = {"time": row["out_of_place"]["time"]}
    return times


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--before", required=True)
    ap.add_argument("--after", required=True)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--nodes", action="store_true")
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    seen = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            # ABBA: neither build always runs first (a VM that speeds up or slows down over a
            # pair would otherwise favour one).
            for which in (("before", "after") if i % 2 == 0 else ("after", "before")):
                seen[which].append(times_of(getattr(args, which), args, extra, os.path.join(tmp, f"{which}{i}.json")))
                print(f"# run {i + 1}/{args.runs} {which} done", file=sys.stderr, flush=True)
    columns = ["hierarchical", "flat"] if args.nodes else ["time"]
    print(f"# allreduce_perf, {args.ranks} ranks{' on 2 nodes (KFT_HOST_ID)' if args.nodes else ''}, "
          f"medians of {args.runs} alternating runs, time in us, after/before (< 1 = faster)")
    head = "# %10s" % "size"
    for c in columns:
        head += "  %12s %12s %8s" % (c + " before", c + " after", "ratio")
    print(head)
    ratios = []
    for size in sorted(seen["before"][0]):
        line = "  %10d" % size
        for c in columns:
            b = statistics.median(r[size][c] for r in seen["before"])
            a = statistics.median(r[size][c] for r in seen["after"])
            ratios.append(a / b if b > 0 else 1.0)
            line += "  %12.2f %12.2f %8.3f" % (b, a, a / b if b > 0 else 0.0)
        print(line)
    print(f"# median ratio {statistics.median(ratios):.3f}, worst {max(ratios):.3f}")


if __name__ == "__main__":
    main()

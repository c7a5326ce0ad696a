#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Gantt chart of a DDP run from the per-rank timelines kft writes with KFT_TIMELINE=dir.

    KFT_TIMELINE=/tmp/tl kftrun --nproc-per-node 2 -- build-tests/bench/ddp_overlap --ratios 2 --steps 3
    /usr/bin/python3 bench/ddp/plot_timeline.py /tmp/tl docs/images/ddp_timeline.png [--steps 2]

One row pair per rank: compute spans (backward per layer, finish) and communication spans
(each bucket's allreduce, from when the progress engine started it to when it completed);
ticks mark when gradients became ready. Ranks on one host share the steady clock, so their
rows line up. Shows the last --steps steps (each ends with a "finish" span). Needs matplotlib
(Debian's python3-matplotlib, seen by /usr/bin/python3).
"""
import argparse
import glob
import json
import os
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("png")
    ap.add_argument("--steps", type=int, default=2)
    a = ap.parse_args()
    files = sorted(glob.glob(os.path.join(a.dir, "timeline-rank*.json")))
    if not files:
        sys.exit(f"plot_timeline: no timeline-rank*.json in {a.dir} (run with KFT_TIMELINE={a.dir})")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        sys.exit("plot_timeline: needs matplotlib (apt-get install python3-matplotlib; run with /usr/bin/python3)")
    ranks = {}
    for f in files:
        with open(f) as fh:
            doc = json.load(fh)
        t0 = doc["otherData"]["t0_ns"] / 1e3  # us, on the shared steady clock
        ranks[doc["otherData"]["rank"]] = [dict(e, abs_ts=e["ts"] + t0) for e in doc["traceEvents"]]
    finishes = [e for e in ranks[min(ranks)] if e["name"] == "finish" and e["ph"] == "X"]
    if len(finishes) < a.steps:
        sys.exit(f"plot_timeline: fewer than {a.steps} steps recorded (no 'finish' spans)")
    # From the first event after the step before the window (or the first event recorded).
    before = finishes[-a.steps - 1]["abs_ts"] + finishes[-a.steps - 1]["dur"] if len(finishes) > a.steps else -1
    start = min(e["abs_ts"] for rank in ranks.values() for e in rank if e["abs_ts"] > before)
    end = finishes[-1]["abs_ts"] + finishes[-1]["dur"]
    fig, ax = plt.subplots(figsize=(11, 1.2 + 1.1 * len(ranks)))
    yticks, ylabels = [], []
    for i, r in enumerate(sorted(ranks)):
        base = i * 3
        for e in ranks[r]:
            x = (e["abs_ts"] - start) / 1e3  # ms
            if e["abs_ts"] + e.get("dur", 0) < start or e["abs_ts"] > end:
                continue
            if e["ph"] == "X" and e["cat"] == "compute":
                color = "#9e9e9e" if e["name"] == "finish" else "#4c72b0"
                ax.broken_barh([(x, e["dur"] / 1e3)], (base + 1.6, 0.8), facecolors=color, edgecolor="white", linewidth=0.3)
            elif e["ph"] == "X" and e["cat"] == "comm":
                ax.broken_barh([(x, e["dur"] / 1e3)], (base + 0.6, 0.8), facecolors="#dd8452", edgecolor="white",
                               linewidth=0.3)
            elif e["cat"] == "ready":
                ax.plot([x, x], [base + 1.45, base + 1.6], color="black", linewidth=0.6)
        yticks += [base + 1.0, base + 2.0]
        ylabels += [f"rank {r} comm", f"rank {r} compute"]
    ax.set_yticks(yticks)
    ax.set_yticklabels(ylabels)
    ax.set_xlabel("ms")
    ax.set_xlim(0, (end - start) / 1e3)
    ax.set_title("DDP reducer: backward (blue), finish (grey), bucket allreduce (orange), gradient ready (ticks)")
    fig.tight_layout()
    fig.savefig(a.png, dpi=120)
    print(f"plot_timeline: wrote {a.png} ({len(ranks)} ranks, last {a.steps} steps, {(end - start) / 1e3:.1f} ms)")


if __name__ == "__main__":
    main()

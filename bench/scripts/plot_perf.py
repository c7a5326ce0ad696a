#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Plots the --json output of kft's *_perf benchmarks: busbw and time against message size.

    mpirun -np 2 build/bench/allreduce_perf -b 8 -e 256M -f 2 --json /tmp/ar2.json
    mpirun -np 2 build/bench/allreduce_perf -b 8 -e 256M -f 2 --algo two_shot --no-peers --json /tmp/ar2-2s.json
    /usr/bin/python3 bench/scripts/plot_perf.py /tmp/ar2.json /tmp/ar2-2s.json -o /tmp/ar2.png

Every file adds a kft line (labelled with the algorithm it was run with: auto or forced, and
zero-copy); the peers (Open MPI as configured, Open MPI with tuned malloc, Gloo, memcpy) come
from the first file that has them. Only rows of one type and op are plotted (float sum unless
--type/--op say otherwise). Needs matplotlib (Debian: python3-matplotlib, for /usr/bin/python3).
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

PEERS = [  # key in the row's "peers", label, style
    ("mpi_default", "Open MPI MPI_Allreduce", dict(color="tab:red", marker="s")),
    ("mpi_tuned", "Open MPI, malloc tuned", dict(color="tab:orange", marker="D")),
    ("gloo_ring", "Gloo ring (TCP loopback)", dict(color="tab:purple", marker="v")),
]
KFT_COLORS = ["tab:blue", "tab:green", "tab:cyan", "tab:olive", "tab:brown", "tab:pink"]


def size_label(b, _pos=None):
    for unit, div in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if b >= div:
            v = b / div
            return f"{v:g}{unit}"
    return f"{b:g}"


def load(path):
    with open(path) as f:
        doc = json.load(f)
    if "results" not in doc:
        sys.exit(f"plot_perf: {path} has no 'results' (not a *_perf --json file?)")
    return doc


def kft_label(doc, path, several_rank_counts):
    kcfg = doc.get("config", {}).get("kft", {})
    label = "kft " + kcfg.get("algorithm", "auto")
    if kcfg.get("zero_copy"):
        label += " zero-copy"
    if several_rank_counts:
        label += f" ({doc['config'].get('nranks')} ranks)"
    return label


def rows_of(doc, dtype, op):
    rows = [r for r in doc["results"] if r.get("type") == dtype and r.get("redop") in (op, "none")]
    return sorted(rows, key=lambda r: r["size"])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", nargs="+", help="--json files of *_perf runs")
    ap.add_argument("-o", "--output", help="PNG to write (default: the first JSON with .png)")
    ap.add_argument("--type", default="float", help="nccl-tests type name of the rows to plot (default float)")
    ap.add_argument("--op", default="sum", help="reduction of the rows to plot (default sum)")
    ap.add_argument("--in-place", action="store_true", help="plot kft's in-place numbers too (dashed)")
    ap.add_argument("--title", help="plot title")
    args = ap.parse_args()

    docs = [(p, load(p)) for p in args.json]
    several = len({d.get("config", {}).get("nranks") for _, d in docs}) > 1
    out = args.output or os.path.splitext(args.json[0])[0] + ".png"

    fig, (ax_bw, ax_t) = plt.subplots(1, 2, figsize=(15, 6.8))
    plotted = 0
    for i, (path, doc) in enumerate(docs):
        rows = [r for r in rows_of(doc, args.type, args.op) if r["size"] > 0]
        if not rows:
            print(f"plot_perf: {path}: no {args.type} {args.op} rows", file=sys.stderr)
            continue
        color = KFT_COLORS[i % len(KFT_COLORS)]
        label = kft_label(doc, path, several)
        xs = [r["size"] for r in rows]
        ax_bw.plot(xs, [r["out_of_place"]["bus_bw"] for r in rows], "-o", color=color, ms=4, label=label)
        ax_t.plot(xs, [r["out_of_place"]["time"] for r in rows], "-o", color=color, ms=4, label=label)
        if args.in_place:
            ax_bw.plot(xs, [r["in_place"]["bus_bw"] for r in rows], "--", color=color, label=label + " in-place")
            ax_t.plot(xs, [r["in_place"]["time"] for r in rows], "--", color=color, label=label + " in-place")
        plotted += 1

    # Peers and memcpy from the first file that measured them.
    peer_doc = next((d for _, d in docs if any(r.get("peers") for r in d["results"])), None)
    if peer_doc is not None:
        prow = [r for r in rows_of(peer_doc, args.type, args.op) if r.get("peers")]
        suffix = f" ({peer_doc['config'].get('nranks')} ranks)" if several else ""
        for key, label, style in PEERS:
            pts = [(r["size"], r["peers"][key]) for r in prow if r["peers"].get(key)]
            if not pts:
                continue
            ax_bw.plot([s for s, _ in pts], [p["bus_bw"] for _, p in pts], "-", ms=4, label=label + suffix, **style)
            ax_t.plot([s for s, _ in pts], [p["time"] for _, p in pts], "-", ms=4, label=label + suffix, **style)
        mc = [(r["size"], r["peers"]["memcpy"]) for r in prow if r["peers"].get("memcpy")]
        if mc:
            ax_bw.plot([s for s, _ in mc], [p["bw"] for _, p in mc], ":", color="black",
                       label="memcpy, 1 thread (GB/s, not busbw)")

    if not plotted:
        sys.exit("plot_perf: nothing to plot")
    first = docs[0][1]
    cfg = first.get("config", {})
    coll = cfg.get("collective", "allreduce")
    title = args.title or (f"kft shm {coll}, {cfg.get('nranks')} ranks, {args.type} {args.op}"
                           f" (busbw: nccl-tests definition; time: slowest rank's average call)")
    fig.suptitle(title)
    for ax in (ax_bw, ax_t):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(size_label))
        ax.set_xlabel("message size (bytes)")
        ax.grid(True, which="major", alpha=0.4)
        ax.grid(True, which="minor", alpha=0.1)
    ax_bw.set_ylabel("busbw (GB/s)")
    ax_bw.set_title("bus bandwidth (higher is better)")
    ax_t.set_ylabel("time per call (us)")
    ax_t.set_title("time (lower is better)")
    # One legend under both panels (the busbw panel's lines include memcpy).
    handles, labels = ax_bw.get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(4, len(labels)), fontsize=9, frameon=False)
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.savefig(out, dpi=110)
    print(f"plot_perf: wrote {out}")


if __name__ == "__main__":
    main()

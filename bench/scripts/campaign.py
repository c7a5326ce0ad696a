#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Repeat a collective bench with --algos and report, per size, the median busbw of every
forced algorithm, the one kft's automatic choice picks, and how close that choice is to the best;
with --peers also the medians of the peer columns (memcpy, Open MPI default and tuned, Gloo) and,
when the bench flags include --latency, of the latency table.

One run on a shared or virtual machine is noisy (neighbours, frequency changes); the medians of
several runs, alternated between rank counts, are what the choice in
include/kft/transport/shm/tuning.hpp (default_crossovers) was tuned with.

  python3 bench/scripts/campaign.py --build build --ranks 2 3 4 --runs 5 -- -b 8 -e 256M -f 2
  python3 bench/scripts/campaign.py --peers --runs 5 -- -b 8 -e 256M -f 2 -n 20 -w 5 --latency

Arguments after -- go to the bench program unchanged (nccl-tests flags). Prints one table per
rank count and, with --json FILE, writes the medians. Exit status 0 unless a run failed.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402


def run_once(args, nranks, extra, out_json):
    return kftbench.run_perf_json(args.mpirun, nranks, kftbench.bench_program(args.build, args.bench),
                                  ["--algos"] + ([] if args.peers else ["--no-peers"]) + extra, out_json, args.timeout)


def peer_medians(runs):
    """size -> medians of kft's out-of-place time/busbw and every peer's busbw (GB/s)."""
    acc = {}
    for run in runs:
        for row in run["results"]:
            e = acc.setdefault(row["size"], {})
            e.setdefault("algorithm", row["algorithm"])
            e.setdefault("kft_time_us", []).append(row["out_of_place"]["time"])
            e.setdefault("kft_busbw", []).append(row["out_of_place"]["bus_bw"])
            for peer, m in row.get("peers", {}).items():
                e.setdefault(peer, []).append(m["bw"] if peer == "memcpy" else m["bus_bw"])
            for peer, ratio in row.get("busbw_ratio_kft_over", {}).items():
                e.setdefault("x_" + peer, []).append(ratio)
    return {size: {k: (v if isinstance(v, str) else statistics.median(v)) for k, v in e.items()}
            for size, e in sorted(acc.items())}


def latency_medians(runs):
    acc = {}
    for run in runs:
        for row in run.get("latency", []):
            e = acc.setdefault(row["size"], {"algorithm": row["algorithm"]})
            for who in ("kft", "mpi"):
                for q in ("p50_us", "p99_us"):
                    if who in row:
                        e.setdefault(f"{who}_{q}", []).append(row[who][q])
            if "kft" in row and "mpi" in row and row["mpi"]["p50_us"] > 0:
                e.setdefault("p50_kft_over_mpi", []).append(row["kft"]["p50_us"] / row["mpi"]["p50_us"])
    return {size: {k: (v if isinstance(v, str) else statistics.median(v)) for k, v in e.items()}
            for size, e in sorted(acc.items())}


def print_peers(nranks, table, runs):
    if not table:
        return
    cols = [c for c in ("memcpy", "mpi_default", "mpi_tuned", "gloo_ring") if any(c in r for r in table.values())]
    print(f"# {nranks} ranks: kft and peers, medians over {runs} runs (busbw GB/s; memcpy: bytes/time; "
          f"x = median of each run's kft/peer ratio)")
    print(f"#{'size (B)':>11} {'algo':>9} {'time(us)':>10} {'kft':>7} " + " ".join(f"{c:>11}" for c in cols) +
          " " + " ".join(f"{'x ' + c:>13}" for c in cols))
    for size, r in table.items():
        print(f" {size:>11} {r['algorithm']:>9} {r['kft_time_us']:10.2f} {r['kft_busbw']:7.2f} " +
              " ".join(f"{r.get(c, float('nan')):11.2f}" for c in cols) + " " +
              " ".join(f"{r.get('x_' + c, float('nan')):13.2f}" for c in cols))
    print()


def print_latency(nranks, table, runs):
    if not table:
        return
    print(f"# {nranks} ranks: latency medians over {runs} runs (us; each run's p50/p99 of its calls)")
    print(f"#{'size (B)':>11} {'algo':>9} {'kft p50':>8} {'kft p99':>8} {'mpi p50':>8} {'mpi p99':>8} {'p50 kft/mpi':>12}")
    for size, r in table.items():
        print(f" {size:>11} {r['algorithm']:>9} {r.get('kft_p50_us', float('nan')):8.2f} "
              f"{r.get('kft_p99_us', float('nan')):8.2f} {r.get('mpi_p50_us', float('nan')):8.2f} "
              f"{r.get('mpi_p99_us', float('nan')):8.2f} {r.get('p50_kft_over_mpi', float('nan')):12.2f}")
    print()


def print_table(nranks, table, threshold, runs):
    algos = sorted({a for row in table.values() for a in row["forced_busbw"]})
    print(f"# {nranks} ranks: median busbw (GB/s) over {runs} runs; "
          f"choice/best = forced(auto's pick) / forced(best)")
    head = f"#{'size (B)':>11} {'auto picks':>10} {'auto':>8} " + " ".join(f"{a:>9}" for a in algos) + \
           f" {'best':>9} {'choice/best':>11}"
    print(head)
    worst = 1.0
    for size, row in table.items():
        cells = " ".join(f"{row['forced_busbw'].get(a, float('nan')):9.2f}" for a in algos)
        flag = "  <-- below " + f"{threshold:.2f}" if row["choice_over_best"] < threshold else ""
        print(f" {size:>11} {row['auto_algorithm']:>10} {row['auto_busbw']:8.2f} {cells} "
              f"{row['best_algorithm']:>9} {row['choice_over_best']:11.2f}{flag}")
        worst = min(worst, row["choice_over_best"])
    print(f"# worst choice/best: {worst:.2f}")
    print()
    return worst


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build tree holding bench/<program> (default: build)")
    ap.add_argument("--bench", default="allreduce_perf", help="bench program (default: allreduce_perf)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2], help="rank counts (default: 2)")
    ap.add_argument("--runs", type=int, default=5, help="runs per rank count, alternated (default: 5)")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run (default: 900)")
    ap.add_argument("--threshold", type=float, default=0.90, help="flag rows whose choice/best is below this")
    ap.add_argument("--peers", action="store_true",
                    help="also time the peers (memcpy, Open MPI, Gloo) and print their medians")
    ap.add_argument("--json", help="write the medians here")
    ap.add_argument("--keep", metavar="DIR", help="keep every run's bench JSON in DIR (for plot_perf.py)")
    ap.add_argument("extra", nargs="*", help="bench flags, after --")
    args = ap.parse_args()
    if args.runs < 1:
        ap.error("--runs must be at least 1")

    results = {n: [] for n in args.ranks}
    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kft-campaign-") as scratch:
        tmp = args.keep or scratch
        for i in range(args.runs):
            for n in args.ranks:  # alternate, so a slow phase of the machine hits every rank count
                print(f"# run {i + 1}/{args.runs}, {n} ranks", file=sys.stderr, flush=True)
                results[n].append(run_once(args, n, args.extra, os.path.join(tmp, f"r{n}-{i}.json")))

    summary = {}
    for n in args.ranks:
        table = kftbench.median_table(results[n])
        worst = print_table(n, table, args.threshold, args.runs)
        peers = peer_medians(results[n]) if args.peers else {}
        latency = latency_medians(results[n])
        print_peers(n, peers, args.runs)
        print_latency(n, latency, args.runs)
        summary[str(n)] = {"worst_choice_over_best": worst, "sizes": {str(s): r for s, r in table.items()},
                           "peers": {str(s): r for s, r in peers.items()},
                           "latency": {str(s): r for s, r in latency.items()}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": args.bench, "flags": args.extra, "runs": args.runs, "ranks": summary}, f, indent=1)


if __name__ == "__main__":
    main()

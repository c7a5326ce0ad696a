#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Measure this machine and write the shared-memory tuning file kft then uses:

  python3 bench/scripts/tune_shm.py --build build --out kft-shm-tuning.txt
  KFT_SHM_TUNING=$PWD/kft-shm-tuning.txt kftrun --nproc-per-node 4 ./train   (or mpirun -x KFT_SHM_TUNING ...)

What it measures (medians over --rounds runs, alternated so a slow phase hits every candidate):
  - the chunk size (staging_bytes): allreduce_perf over --staging-sizes at 16-256 MiB, 2 ranks,
    the user's own buffers; the candidate with the best geometric mean busbw wins;
  - where the copy path starts writing with streaming stores (copy_streaming_bytes): allreduce_perf
    over --copy-stream-range, 2 ranks, the user's own buffers, with --copy-streaming-bytes 0 (every
    size streamed) and off, alternated; the threshold kept loses least against the faster of the
    two summed over sizes (off above every size: 1024G);
  - the one-shot/two-shot crossover of every collective at every rank count in --ranks (rank
    counts above the CPU count are measured oversubscribed, as they run), and of the zero-copy
    allreduce: each *_perf --algos times both algorithms right after each other;
    the crossover kept is the one that loses least against the best algorithm summed over sizes
    (sizes up to the one-shot slot, 32 KiB by default: above it kft runs two-shot anyway).

The file holds `staging_bytes`, `copy_streaming_bytes` and one `crossover` row per measured (collective, rank count);
kft puts its rows before its default table (include/kft/transport/shm/tuning.hpp), so rank counts
not measured keep the defaults. It is written whole or not at all (a temporary file renamed).
A machine with more cores than ranks measured: pass the rank counts you run, e.g. --ranks 2 4 8.
"""
import argparse
import datetime
import math
import os
import shutil
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402
from kftbench import cpu_description, human, median_table, parse_size  # noqa: E402

PROGRAMS = {"allreduce": "allreduce_perf", "reduce_scatter": "reduce_scatter_perf",
            "broadcast": "broadcast_perf", "allgather": "allgather_perf"}


def run_bench(args, program, p, flags, out_json, iters=None):
    # KFT_SHM_TUNING dropped: measure kft's own algorithms, not an earlier file's choice.
    n = iters or args.iters
    w = max(args.warmup, n // 10)
    return kftbench.run_perf_json(args.mpirun, p, kftbench.bench_program(args.build, program),
                                  ["--no-peers", "-n", str(n), "-w", str(w), "-c", "0"] + flags, out_json,
                                  args.timeout, env={"KFT_SHM_TUNING": None})


def choice_bytes(coll, size, p):
    """The bench row's size -> the bytes kft's choice sees (the per-rank input): an allgather's row
    is its whole output, p inputs."""
    return size // p if coll == "allgather" else size


def best_crossover(table):
    """The one-shot limit (bytes) that loses least against the best algorithm, summed over sizes.
    table: bytes -> {'forced_busbw': {'one_shot': x, 'two_shot': y}}. Ties go to the smaller limit."""
    sizes = sorted(s for s, r in table.items() if {"one_shot", "two_shot"} <= set(r["forced_busbw"]))
    if not sizes:
        return None, 0.0
    best, best_loss = 0, None
    for limit in [0] + sizes:
        loss = 0.0
        for s in sizes:
            f = table[s]["forced_busbw"]
            chosen = f["one_shot"] if s <= limit else f["two_shot"]
            top = max(f["one_shot"], f["two_shot"])
            loss += 1 - chosen / top if top > 0 else 0
        if best_loss is None or loss < best_loss - 1e-9:
            best, best_loss = limit, loss
    return best, best_loss / len(sizes)


COPY_STREAM_OFF = 1 << 40  # the largest value a tuning file takes (1024G): never streamed


def best_threshold(table):
    """The size from which the streamed variant runs, losing least against the faster of the two,
    summed over sizes. table: bytes -> {'on': busbw, 'off': busbw}. Ties go to the larger threshold
    (the cached stores, kft's behaviour before the setting)."""
    sizes = sorted(table)
    best, best_loss = COPY_STREAM_OFF, None
    for limit in [COPY_STREAM_OFF] + sorted(sizes, reverse=True):
        loss = 0.0
        for s in sizes:
            on, off = table[s]["on"], table[s]["off"]
            top = max(on, off)
            loss += 1 - (on if s >= limit else off) / top if top > 0 else 0
        if best_loss is None or loss < best_loss - 1e-9:
            best, best_loss = limit, loss
    return best, (best_loss or 0.0) / max(1, len(sizes))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default="build", help="build tree holding bench/*_perf (default: build)")
    ap.add_argument("--out", default="kft-shm-tuning.txt", help="the tuning file to write (default: kft-shm-tuning.txt)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[2, 3, 4], help="rank counts to tune (default: 2 3 4)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per measurement, medians kept (default: 3)")
    ap.add_argument("--collectives", nargs="+", default=list(PROGRAMS), choices=list(PROGRAMS))
    ap.add_argument("--staging-sizes", type=parse_size, nargs="+",
                    default=[parse_size(s) for s in ("256K", "512K", "1M", "2M")],
                    help="chunk sizes to try (default: 256K 512K 1M 2M); one value skips the search")
    ap.add_argument("--crossover-range", nargs=2, type=parse_size, default=[512, 32 << 10], metavar=("MIN", "MAX"),
                    help="sizes searched for crossovers (default: 512 32K: above the one-shot slot, small_bytes, "
                         "kft runs two-shot whatever a row says)")
    ap.add_argument("--large-range", nargs=2, type=parse_size, default=[16 << 20, 256 << 20], metavar=("MIN", "MAX"),
                    help="sizes the chunk size is judged on (default: 16M 256M)")
    ap.add_argument("--copy-stream-range", nargs=2, type=parse_size, default=[8 << 10, 32 << 20], metavar=("MIN", "MAX"),
                    help="sizes (x4 steps) the copy path's streaming threshold is judged on (default: 8K 32M)")
    ap.add_argument("-n", "--iters", type=int, default=20, help="timed calls per size (default: 20)")
    ap.add_argument("-w", "--warmup", type=int, default=5, help="warm-up calls per size (default: 5)")
    ap.add_argument("--crossover-iters", type=int, default=500,
                    help="timed calls per size for the crossovers (microseconds each: few calls would time "
                         "first-call costs; a tenth of it warms up; default: 500)")
    ap.add_argument("--mpirun", default=shutil.which("mpirun.openmpi") or "mpirun")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run (default: 900)")
    args = ap.parse_args()
    if args.rounds < 1 or args.iters < 1 or args.crossover_iters < 1 or args.warmup < 0 or any(p < 2 for p in args.ranks):
        ap.error("--rounds, -n and --crossover-iters must be >= 1, -w >= 0, every rank count >= 2")
    if any(s < 4096 for s in args.staging_sizes):
        ap.error("--staging-sizes must be at least 4K each")
    for coll in args.collectives:
        prog = os.path.join(args.build, "bench", PROGRAMS[coll])
        if not os.access(prog, os.X_OK):
            ap.error(f"{prog} not found: build the bench first (cmake --build {args.build})")
    out_dir = os.path.dirname(os.path.abspath(args.out))
    if not os.path.isdir(out_dir):
        ap.error(f"--out {args.out}: directory {out_dir} does not exist")
    cpus = os.cpu_count() or 1
    lo, hi = args.crossover_range
    big_lo, big_hi = args.large_range

    with tempfile.TemporaryDirectory(prefix="kft-tune-") as tmp:
        # 1. The chunk size.
        staging = args.staging_sizes[0]
        staging_note = "one candidate given"
        if len(args.staging_sizes) > 1:
            runs = {s: [] for s in args.staging_sizes}
            for i in range(args.rounds):
                for s in args.staging_sizes:
                    print(f"# chunk size {human(s)}, round {i + 1}/{args.rounds}", file=sys.stderr, flush=True)
                    doc = run_bench(args, "allreduce_perf", 2, ["-b", str(big_lo), "-e", str(big_hi), "-f", "4",
                                                                 "--staging-bytes", str(s)], os.path.join(tmp, "s.json"))
                    runs[s].append({r["size"]: r["out_of_place"]["bus_bw"] for r in doc["results"]})
            score = {}
            for s, rs in runs.items():
                sizes = sorted(rs[0])
                med = [statistics.median(r[z] for r in rs) for z in sizes]
                score[s] = math.exp(sum(math.log(max(m, 1e-9)) for m in med) / len(med))
            staging = max(score, key=score.get)
            staging_note = ", ".join(f"{human(s)} {v:.2f}" for s, v in score.items()) + \
                f" GB/s (geometric mean busbw, 2 ranks, {human(big_lo)}-{human(big_hi)})"

        # 1b. Where the copy path streams (with the chosen chunk). Small sizes take microseconds:
        # --min-time gives each size at least 20 ms of calls.
        cs_lo, cs_hi = args.copy_stream_range
        stream_runs = {"on": [], "off": []}
        for i in range(args.rounds):
            for mode, value in (("on", 0), ("off", COPY_STREAM_OFF)):
                print(f"# copy path streaming {mode}, round {i + 1}/{args.rounds}", file=sys.stderr, flush=True)
                doc = run_bench(args, "allreduce_perf", 2, ["-b", str(cs_lo), "-e", str(cs_hi), "-f", "4",
                                                             "--staging-bytes", str(staging), "--min-time", "0.02",
                                                             "--copy-streaming-bytes", str(value)],
                                os.path.join(tmp, "cs.json"))
                stream_runs[mode].append({r["size"]: r["out_of_place"]["bus_bw"] for r in doc["results"]})
        stream_table = {z: {m: statistics.median(r[z] for r in stream_runs[m]) for m in stream_runs}
                        for z in sorted(stream_runs["on"][0])}
        copy_streaming, stream_loss = best_threshold(stream_table)
        stream_note = ", ".join(f"{human(z)} {v['on']:.2f}/{v['off']:.2f}" for z, v in stream_table.items()) + \
            f" GB/s streamed/cached (2 ranks); from {human(copy_streaming) if copy_streaming < COPY_STREAM_OFF else 'never'}" + \
            f" (mean loss {stream_loss * 100:.1f}%)"

        # 2. Crossovers, measured with the chosen chunk.
        rows, notes = [], []
        cases = [(c, p, None) for c in args.collectives for p in args.ranks]
        if "allreduce" in args.collectives:
            cases += [("allreduce", p, True) for p in args.ranks]
        results = {case: [] for case in cases}
        for i in range(args.rounds):
            for case in cases:
                coll, p, zc = case
                print(f"# {coll}{' zero-copy' if zc else ''}, {p} ranks, round {i + 1}/{args.rounds}",
                      file=sys.stderr, flush=True)
                flags = ["-b", str(lo), "-e", str(hi), "-f", "2", "--algos", "--staging-bytes", str(staging)]
                results[case].append(run_bench(args, PROGRAMS[coll], p, flags + (["--zero-copy"] if zc else []),
                                               os.path.join(tmp, "c.json"), args.crossover_iters))
        for case in cases:
            coll, p, zc = case
            table = {choice_bytes(coll, size, p): r for size, r in median_table(results[case]).items()}
            limit, loss = best_crossover(table)
            if limit is None:
                continue
            over = 1 if p > cpus else 0
            zero_copy = "1" if zc else ("0" if coll == "allreduce" else "any")
            rows.append(f"crossover {coll} ranks={p} oversubscribed={over} zero_copy={zero_copy} one_shot_max={limit}")
            notes.append(f"#   {coll}{' zero-copy' if zc else ''}, {p} ranks: one-shot up to {human(limit) if limit else 'never'}"
                         f" (mean loss against the best algorithm {loss * 100:.1f}%)")

    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        f"# kft shared-memory tuning for {cpu_description()} ({cpus} CPUs), measured {stamp} by",
        f"#   python3 bench/scripts/tune_shm.py --ranks {' '.join(map(str, args.ranks))} --rounds {args.rounds}",
        "# Use: KFT_SHM_TUNING=<this file> (every rank of a node must see the same file).",
        f"# chunk: {staging_note}",
        f"# copy path streaming: {stream_note}",
        "# crossovers:",
        *notes,
        f"staging_bytes {staging}",
        f"copy_streaming_bytes {copy_streaming if copy_streaming < COPY_STREAM_OFF else '1024G'}",
        *rows,
    ]) + "\n"
    tmp_out = args.out + ".tmp"
    with open(tmp_out, "w") as f:
        f.write(text)
    os.replace(tmp_out, args.out)
    sys.stdout.write(text)
    print(f"tune_shm: wrote {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The DDP reducer's numbers in one script, 2 ranks, rounds alternating every variant.

    /usr/bin/python3 bench/ddp/ddp_bench.py [--build build-tests] [--rounds 5] [--no-torch]

Each round runs, one after the other (so a slow phase of the machine touches every bench alike):
  ddp_overlap   sleep-based backward (a free core, as under a GPU): hidden fraction H at
                backward = 0.5-4x communication, overlap T vs allreduce-after-backward A
  ddp_perf compute   an OpenBLAS MLP backward: overlap vs allreduce-after-backward (A/T),
                deterministic mode's cost (D/T), H as measured
  bucketing     kft's buckets vs one allreduce per tensor over shared memory and over Gloo, and
                PyTorch 1.13 DDP's own on the same sizes (bench/ddp/ddp_bucketing.py's round)
then once: ddp_micro (mark_ready per parameter, Google Benchmark) and test_ddp_steady_state (heap
allocations and gradient bytes copied per step after warm-up, counted; a test, so it passes or
fails). Prints every round's key numbers and a Markdown table of medians (range) beside the
issue's targets. Numbers, not a pass/fail test.
"""
import argparse
import json
import os
import re
import subprocess
import sys

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "common"))
import kftbench  # noqa: E402
import ddp_bucketing  # noqa: E402  (its rounds: kft_round, torch_round; this folder is on the path)

# As ddp_bucketing runs its commands: 300 s each, one BLAS thread per rank, torchrun's workers
# ended after a hang.
RUN = dict(limit=300, env=kftbench.ONE_THREAD, leftovers="ddp_bucketing_torch.py")


def kftrun(build, *args):
    return kftbench.run([kftbench.kftrun(build), "--nproc-per-node", "2", "--", *args], **RUN)


def rows_of(out, checks=True):
    """The data rows of a ddp bench table (rank 0's lines that are numbers only); `checks`: the
    bench verifies its results and must have found none wrong."""
    rows = []
    for line in out.splitlines():
        m = re.match(r"^\[0\]:\s+([-0-9.\s]+)$", line)
        if m:
            rows.append([float(x) for x in m.group(1).split()])
    if checks and "wrong values: 0" not in out:
        sys.exit(f"ddp_bench: a bench reported wrong values:\n{out[-3000:]}")
    return rows


def overlap_round(build):
    out = kftrun(build, kftbench.bench_program(build, "ddp_overlap"), "--layers", "8", "--layer-bytes", "2M", "--cap", "4M",
                 "--steps", "9")
    # B/C, C, B, T, A, H, A/T
    return {r[0]: {"H": r[5], "A/T": r[6]} for r in rows_of(out, checks=False) if len(r) == 7}


def compute_round(build, reps):
    out = kftrun(build, kftbench.bench_program(build, "ddp_perf"), "--reps", str(reps), "compute")
    if "bit-identical: yes" not in out:
        sys.exit(f"ddp_bench: overlap and deterministic gradients differ:\n{out[-3000:]}")
    r = [x for x in rows_of(out) if len(x) == 8][0]  # T, A, D, B, C, H, A/T, D/T
    return {"T": r[0], "H": r[5], "A/T": r[6], "D/T": r[7]}


def micro(build):
    exe = kftbench.bench_program(build, "ddp_micro")
    if not os.access(exe, os.X_OK):
        return None
    out = kftbench.run([exe, "--benchmark_filter=mark_ready_shm", "--benchmark_format=json"], **RUN)
    doc = json.loads(out[out.index("{"):])
    return [b["s_per_parameter"] * 1e6 for b in doc["benchmarks"] if "s_per_parameter" in b]


def steady(build):
    exe = os.path.join(build, "tests", "test_ddp_steady_state")
    if not os.access(exe, os.X_OK):
        return "not built"
    p = subprocess.run([exe, "--log_level=error"], capture_output=True, text=True, timeout=300)
    return "0 / 0 (test_ddp_steady_state passed)" if p.returncode == 0 else \
        f"test_ddp_steady_state FAILED (exit {p.returncode}): {p.stdout[-500:]}{p.stderr[-500:]}"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(kftbench.REPO, "build-tests"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=21, help="repetitions per run of ddp_perf compute and bucketing")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch's bucketing (python3-torch not installed)")
    a = ap.parse_args()
    for exe in ("ddp_overlap", "ddp_perf"):
        if not os.access(kftbench.bench_program(a.build, exe), os.X_OK):
            sys.exit(f"ddp_bench: {a.build}/bench/{exe} not found: build the suite first (cmake --build {a.build})")
    sizes = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"kft-ddp-bench-sizes-{os.getpid()}.txt")
    with open(sizes, "w") as f:
        f.write(kftbench.run([kftbench.bench_program(a.build, "ddp_perf"), "bucketing", "--list-sizes"], **RUN))
    k = sum(1 for x in open(sizes) if x.strip() and not x.startswith("#"))
    print(f"# ddp_bench: 2 ranks (kftrun, shared memory), {a.rounds} rounds; {kftbench.cpu_name()}, {os.cpu_count()} CPUs",
          flush=True)
    ov, co, bu = [], [], {}
    for r in range(a.rounds):
        ov.append(overlap_round(a.build))
        co.append(compute_round(a.build, a.reps))
        rows = ddp_bucketing.kft_round(a.build, a.reps)
        for key, v in rows.items():
            bu.setdefault(key, []).append(v)
        line = (f"#   round {r + 1}: H at B=2C {ov[-1].get(2.0, {}).get('H', float('nan')):.2f}, at B=4C "
                f"{ov[-1].get(4.0, {}).get('H', float('nan')):.2f}; compute A/T {co[-1]['A/T']:.3f} D/T {co[-1]['D/T']:.3f}; "
                f"buckets vs per-tensor: shm {rows[('group', '200 tensors')][2]:.2f}x, gloo {rows[('gloo', '200 tensors')][2]:.2f}x")
        if not a.no_torch:
            t = ddp_bucketing.torch_round(sizes, a.reps)
            bu.setdefault(("pytorch", "200 tensors"), []).append((t["ddp_ms"], t["per_tensor_ms"], t["ratio"]))
            line += f", PyTorch DDP {t['ratio']:.2f}x"
        print(line, flush=True)
    os.unlink(sizes)
    mr = micro(a.build)
    st = steady(a.build)

    def col(vals, fmt="{:.2f}"):
        return kftbench.spread(vals, fmt)

    print()
    print("| what | measured, median (range) over rounds | target |")
    print("| --- | --- | --- |")
    for rho in (2.0, 4.0):
        hs = [o[rho]["H"] for o in ov if rho in o]
        ats = [o[rho]["A/T"] for o in ov if rho in o]
        if hs:
            print(f"| hidden fraction H, sleep-based backward = {rho:g}x communication (ddp_overlap) | H {col(hs)}; "
                  f"overlap {col(ats)}x faster than allreduce-after-backward | H >= 0.8 |")
    print(f"| OpenBLAS MLP backward: allreduce-after-backward / overlap (ddp_perf compute) | {col([c['A/T'] for c in co], '{:.3f}')}x "
          f"(H {col([c['H'] for c in co])}: the 2 cores are busy with the BLAS) | >= 0.98x |")
    print(f"| deterministic mode / default mode, same step | {col([c['D/T'] for c in co], '{:.3f}')}x | <= 1.10x |")
    names = {"group": "shared memory", "gloo": "Gloo (TCP, loopback)", "pytorch": "PyTorch 1.13 DDP (gloo), for reference"}
    for t in ("group", "gloo", "pytorch"):
        v = bu.get((t, "200 tensors"))
        if v:
            extra = [(x[1] - x[0]) * 1e3 / (k - 1) for x in v]
            print(f"| {k} tensors 1 KiB-1 MiB, one allreduce each / buckets, {names[t]} | {col([x[2] for x in v])}x "
                  f"(each extra call {col(extra, '{:.1f}')} us) | >= 3x |")
    for t in ("group", "gloo"):
        v = bu[(t, "one 4 MiB tensor")]
        print(f"| one 4 MiB tensor: plain allreduce / reducer, {names[t]} | {col([x[2] for x in v])}x | >= 0.95x |")
    if mr:
        print(f"| `mark_ready` per parameter, 1-rank shared-memory group (ddp_micro, 16 / 200 / 2000 parameters) | "
              f"{' / '.join(f'{x:.2f}' for x in mr)} us | <= 2 us |")
    print(f"| heap allocations / gradient bytes copied per step after warm-up | {st} | 0 / 0 |")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Bucketing, measured beside its anchor: what fusing 200 gradients into buckets saves over one
allreduce per tensor, on 2 ranks, over kft's shared memory, over Gloo, and in PyTorch 1.13's DDP.

    /usr/bin/python3 bench/ddp/ddp_bucketing.py [--build build-tests] [--rounds 5] [--reps 21]

Each round runs, one after the other (a round is one of each, so slow phases of the machine
touch every variant alike):
  kftrun --nproc-per-node 2 -- ddp_perf --reps R bucketing --gloo
      kft's reducer (2 buckets) against one async allreduce per tensor on the same memory, over
      the job's shared-memory group and over a kft::gloo::communicator between the same ranks
      (TCP on loopback), and one 4 MiB tensor: the reducer against a plain allreduce;
  torchrun --nproc_per_node 2 bench/ddp/ddp_bucketing_torch.py
      PyTorch's DDP (gloo, bucket_cap_mb 25) against one async all_reduce per gradient, same sizes.
Prints the median and range over rounds of each ratio (per-tensor time / bucketed time) and of
the per-call cost the buckets save. Numbers, not a pass/fail test.
"""
import argparse
import json
import os
import re
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "common"))
import kftbench  # noqa: E402
from kftbench import cpu_name, spread  # noqa: E402


# How kftbench.run runs this bench's commands: 300 s each, one BLAS thread per rank; after a hang,
# torchrun's workers (outside its process group) are ended too.
RUN = dict(limit=300, env=kftbench.ONE_THREAD, leftovers="ddp_bucketing_torch.py")


ROW = re.compile(r"^\[0\]:\s+(group|gloo)\s+(200 tensors: buckets vs per-tensor|one 4 MiB tensor: reducer vs plain)"
                 r"\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)\s*$")


def kft_round(build, reps):
    out = kftbench.run([kftbench.kftrun(build), "--nproc-per-node", "2", "--",
               kftbench.bench_program(build, "ddp_perf"), "--reps", str(reps), "bucketing", "--gloo"], **RUN)
    rows = {}
    for line in out.splitlines():
        m = ROW.match(line)
        if m:
            rows[(m.group(1), m.group(2).split(":")[0])] = (float(m.group(3)), float(m.group(4)), float(m.group(5)))
        if "wrong values:" in line and not line.rstrip().endswith(" 0"):
            sys.exit(f"ddp_bucketing: ddp_perf reported wrong values:\n{out}")
    want = [("group", "200 tensors"), ("gloo", "200 tensors"), ("group", "one 4 MiB tensor"), ("gloo", "one 4 MiB tensor")]
    if any(k not in rows for k in want):
        sys.exit(f"ddp_bucketing: ddp_perf printed no rows for {[k for k in want if k not in rows]}:\n{out}")
    return rows


def torch_round(sizes, reps):
    out = kftbench.run(["/usr/bin/python3", "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               "--redirects", "9:0", "--tee", "9:0", "--monitor_interval", "0.2",
               os.path.join(here, "ddp_bucketing_torch.py"), "--sizes", sizes, "--reps", str(reps)], **RUN)
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"ddp_bucketing: the PyTorch side printed no result:\n{out[-3000:]}")
    r = json.loads(lines[-1])
    if r["wrong"]:
        sys.exit(f"ddp_bucketing: PyTorch's gradients were wrong ({r['wrong']} values)")
    return r


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(kftbench.REPO, "build-tests"))
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=21, help="repetitions per run (each run reports medians)")
    ap.add_argument("--no-torch", action="store_true", help="skip PyTorch (python3-torch not installed)")
    a = ap.parse_args()
    exe = kftbench.bench_program(a.build, "ddp_perf")
    if not os.access(exe, os.X_OK):
        sys.exit(f"ddp_bucketing: {exe} not found: build the suite first (cmake --build {a.build})")
    sizes = tempfile.NamedTemporaryFile("w", prefix="kft-sizes-", suffix=".txt", delete=False)
    sizes.write(kftbench.run([exe, "bucketing", "--list-sizes"], **RUN))
    sizes.close()
    counts = [int(x) for x in open(sizes.name) if x.strip() and not x.startswith("#")]
    k = len(counts)
    print(f"# bucketing, 2 ranks: {k} f32 gradients of 1 KiB-1 MiB ({sum(counts) * 4 / 2**20:.1f} MiB), "
          f"{a.rounds} rounds x {a.reps} repetitions; {cpu_name()}, {os.cpu_count()} CPUs", flush=True)
    res = {}
    for r in range(a.rounds):
        rows = kft_round(a.build, a.reps)
        for key, (b, p, ratio) in rows.items():
            res.setdefault(key, []).append((b, p, ratio))
        line = f"#   round {r + 1}: kft shm {rows[('group', '200 tensors')][2]:.2f}x, kft gloo {rows[('gloo', '200 tensors')][2]:.2f}x"
        if not a.no_torch:
            t = torch_round(sizes.name, a.reps)
            res.setdefault(("pytorch", "200 tensors"), []).append((t["ddp_ms"], t["per_tensor_ms"], t["ratio"]))
            res.setdefault(("pytorch", "backward"), []).append((t["backward_ms"], 0, 0))
            res["torch_version"] = t["torch"]
            line += f", PyTorch DDP {t['ratio']:.2f}x"
        print(line, flush=True)
    os.unlink(sizes.name)

    print()
    print("| transport | bucketed (ms) | one allreduce per tensor (ms) | per-tensor / bucketed | each extra call (us) |")
    print("| --- | ---: | ---: | ---: | ---: |")
    names = {"group": "kft reducer, shared memory", "gloo": "kft reducer, Gloo (TCP, loopback)",
             "pytorch": f"PyTorch {res.get('torch_version', '?')} DDP, gloo (torchrun)"}
    for t in ("group", "gloo", "pytorch"):
        v = res.get((t, "200 tensors"))
        if not v:
            continue
        b = [x[0] for x in v]
        p = [x[1] for x in v]
        extra = [(x[1] - x[0]) * 1e3 / (k - 1) for x in v]
        print(f"| {names[t]} | {spread(b)} | {spread(p)} | {spread([x[2] for x in v])}x | {spread(extra, '{:.1f}')} |")
    if ("pytorch", "backward") in res:
        print(f"\n(PyTorch's times include its backward pass, {spread([x[0] for x in res[('pytorch', 'backward')]])} ms "
              "alone; kft's start at the first mark_ready.)")
    print("\n| one 4 MiB tensor | reducer (ms) | plain allreduce (ms) | plain / reducer |")
    print("| --- | ---: | ---: | ---: |")
    for t in ("group", "gloo"):
        v = res[(t, "one 4 MiB tensor")]
        print(f"| {names[t]} | {spread([x[0] for x in v], '{:.3f}')} | {spread([x[1] for x in v], '{:.3f}')} | "
              f"{spread([x[2] for x in v])} |")


if __name__ == "__main__":
    main()

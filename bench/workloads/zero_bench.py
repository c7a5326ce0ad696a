#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""ZeRO stage 1 beside the replicated optimizer, in one script: example 05 (the DDP trainer on
Fashion-MNIST) with AdamW on 2 ranks under kftrun, the optimizer state replicated (--zero 0) and
sharded (--zero 1), 1 BLAS thread per rank, runs interleaved, each row the median of 3 by the
optimizer's time. Also the wide MLP (4 x 1024 hidden, 4.0 M parameters), where the optimizer's
share of a step is larger.

    /usr/bin/python3 bench/workloads/zero_bench.py [--build build-tests] [--steps 400]

Prints, per model: the optimizer's time per step on rank 0 (its update loops: the whole model
replicated, this rank's shard with ZeRO-1), the optimizer state rank 0 holds, the training
time per step, and the final parameters' hash (ZeRO-1 ends on the same bits as the replicated
run). The bytes moved are counted by tests/unit/test_trainer.cpp (zero1_* cases). Nothing here
passes or fails.
"""
import argparse
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402
from kftbench import cpu_name  # noqa: E402


def summary_of(build, zero, extra):
    """One 2-rank run of example 05 with AdamW (--zero 0 or 1): its summary event."""
    log = tempfile.mktemp(prefix="kft-zero-", suffix=".jsonl")
    cmd = [kftbench.kftrun(build), "--nproc-per-node", "2", "--",
           kftbench.example(build, "05-fashion-mnist"), "--threads", "1", "--quiet", "--optimizer", "adamw",
           "--lr", "0.001", "--zero", str(zero), "--log-json", log, "--epochs", "1", "--evals-per-epoch", "1"] + extra
    kftbench.run(cmd, limit=600, env=kftbench.ONE_THREAD)
    with open(log) as f:
        events = [json.loads(line) for line in f]
    os.unlink(log)
    s = [e for e in events if e["event"] == "summary"][-1]
    return s


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(kftbench.REPO, "build-tests"))
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    if not os.path.exists(os.path.join(a.build, "examples", "05-fashion-mnist")):
        sys.exit(f"zero_bench: no {a.build}/examples/05-fashion-mnist: build it first (bash tests/run-all.sh)")
    models = [("Fashion-MNIST MLP 784-256-128-10 (235 K parameters)", []),
              ("wide MLP 784-4x1024-10 (4.0 M parameters)", ["--hidden", "1024,1024,1024,1024"])]
    print(f"# ZeRO-1 vs replicated AdamW, 2 ranks (kftrun, shared memory), {a.steps} steps, batch 64/rank, "
          f"1 BLAS thread per rank; {cpu_name()}, {os.cpu_count()} CPUs; medians of {a.repeats} interleaved runs")
    print()
    print("| model | optimizer state | state on rank 0 (KiB) | optimizer ms/step | training ms/step | params hash |")
    print("| --- | --- | ---: | ---: | ---: | --- |")
    for name, extra in models:
        runs = {0: [], 1: []}
        for _ in range(a.repeats):
            for z in (0, 1):
                runs[z].append(summary_of(a.build, z, ["--max-steps", str(a.steps)] + extra))
        med = {}
        for z in (0, 1):
            r = sorted(runs[z], key=lambda s: s["optimizer_seconds"])[len(runs[z]) // 2]
            med[z] = r
            print(f"| {name} | {'ZeRO-1 (sharded)' if z else 'replicated'} | {r['optimizer_state_bytes'] / 1024:.0f} | "
                  f"{1000 * r['optimizer_seconds'] / r['steps']:.3f} | {1000 * r['train_seconds'] / r['steps']:.3f} | "
                  f"{r['parameters_hash']} |")
        ratio = med[1]["optimizer_seconds"] / med[0]["optimizer_seconds"]
        print(f"| {name} | ZeRO-1 / replicated | {med[1]['optimizer_state_bytes'] / med[0]['optimizer_state_bytes']:.3f} | "
              f"{ratio:.2f} (target <= 0.55) | {med[1]['train_seconds'] / med[0]['train_seconds']:.2f} | "
              f"{'same bits' if med[0]['parameters_hash'] == med[1]['parameters_hash'] else 'DIFFERENT'} |")


if __name__ == "__main__":
    main()

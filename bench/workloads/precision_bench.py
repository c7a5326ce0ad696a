#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Mixed precision against f32 on both training workloads: steps and time to the target, over seeds.

    /usr/bin/python3 bench/workloads/precision_bench.py [--build build-tests] [--seeds 3]
        [--workloads fmnist charlm] [--precisions f32 bf16 f16]

Issue 45 item 2 asks that bf16 reach the same target as f32 within 1.1x the steps. Each
workload runs on 2 ranks under kftrun (one BLAS thread per rank), once per precision and seed
(seeds 1..N: sample order and initial weights), precisions interleaved within a seed:

  - fmnist: example 05 (MLP 784-256-128-10, SGD lr 0.05 momentum 0.9, batch 64 per rank,
    5 epochs), the test accuracy 20 times an epoch, target 87%;
  - charlm: example 09 (the 4 x 256 char GPT of char_lm_peers.py, AdamW lr 2e-3 after a 50-step
    warm-up), the validation loss on 128 windows every 10 steps, target 2.7, 225 steps.

`--precision bf16` gives the model's weights (and example 09's embeddings) bf16 storage with
f32 master weights in the trainer and bf16 gradient buckets (kft/ddp/mixed.hpp's half_params;
example 09 keeps its LayerNorm gains and biases f32); f16 the same with loss scaling. The
models compute in f32 on the 16-bit values (Debian's OpenBLAS has no bf16 GEMM). A cell is the
step of the first evaluation at or past the target (its training seconds); the ratios are of the
medians over seeds. Prints Markdown; nothing here passes or fails.
"""
import argparse
import json
import os
import statistics
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "common"))
import kftbench  # noqa: E402

WORKLOADS = {
    "fmnist": dict(example="05-fashion-mnist", target=0.87, metric="test_accuracy", at_most=False, limit=300,
                   args=["--evals-per-epoch", "20", "--epochs", "5"],
                   what="Fashion-MNIST MLP 784-256-128-10, SGD, batch 64/rank, test accuracy 20x an epoch, target 0.87"),
    "charlm": dict(example="09-char-transformer", target=2.7, metric="test_loss", at_most=True, limit=900,
                   args=["--sample", "0", "--max-steps", "225", "--eval-every", "10", "--eval-windows", "128",
                         "--target", "2.7"],
                   what="char GPT 4 x 256 (3.25 M parameters), AdamW, batch 8 windows/rank, validation loss "
                        "every 10 steps, target 2.7"),
}


def run(build, w, precision, seed):
    log = tempfile.mktemp(prefix="kft-precision-", suffix=".jsonl")
    exe = kftbench.example(build, w["example"])
    cmd = [kftbench.kftrun(build), "--nproc-per-node", "2", "--", exe, "--threads", "1", "--quiet",
           "--log-json", log, "--seed", str(seed), "--precision", precision] + w["args"]
    kftbench.run(cmd, limit=w["limit"], env=kftbench.ONE_THREAD)
    with open(log) as f:
        events = [json.loads(line) for line in f]
    os.unlink(log)
    s = [e for e in events if e["event"] == "summary"][-1]
    crossed = None
    for e in events:
        if e["event"] != "eval":
            continue
        v = e[w["metric"]]
        if (v <= w["target"]) if w["at_most"] else (v >= w["target"]):
            crossed = e
            break
    return {"step": crossed["step"] if crossed else None,
            "seconds": s["seconds_to_target"],
            "seconds_per_step": s["train_seconds"] / s["steps"],
            "final": s["final_loss"] if w["at_most"] else s["final_accuracy"],
            "skipped": s.get("skipped_steps", 0)}


def median_or_none(v):
    """The median, a run that never reached the target counting as later than any that did."""
    m = statistics.median([float("inf") if x is None else x for x in v])
    return None if m == float("inf") else m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(kftbench.REPO, "build-tests"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--workloads", nargs="+", default=["fmnist", "charlm"], choices=sorted(WORKLOADS))
    ap.add_argument("--precisions", nargs="+", default=["f32", "bf16", "f16"], choices=["f32", "bf16", "f16"])
    a = ap.parse_args()
    if a.seeds < 1:
        sys.exit(f"precision_bench: --seeds must be >= 1 (got {a.seeds})")
    if "f32" not in a.precisions:
        sys.exit("precision_bench: --precisions must include f32 (the ratios are against it)")
    for name in a.workloads:
        if not os.path.exists(kftbench.example(a.build, WORKLOADS[name]["example"])):
            sys.exit(f"precision_bench: no {a.build}/examples/{WORKLOADS[name]['example']}: build it first")
    if "charlm" in a.workloads and not os.path.isdir("/usr/share/games/fortunes"):
        sys.exit("precision_bench: /usr/share/games/fortunes is missing: apt-get install fortunes")
    load0 = os.getloadavg()
    results = {}
    for name in a.workloads:
        w = WORKLOADS[name]
        for seed in range(1, a.seeds + 1):
            for p in a.precisions:
                results.setdefault((name, p), []).append(run(a.build, w, p, seed))
    load1 = os.getloadavg()
    print(f"# 2 ranks under kftrun, 1 BLAS thread per rank; {kftbench.cpu_description()}, {os.cpu_count()} CPUs; "
          f"load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end")
    for name in a.workloads:
        w = WORKLOADS[name]
        print()
        print(f"{w['what']}; seeds 1..{a.seeds}; each cell: the step of the first evaluation at the target "
              f"(its training seconds):")
        print()
        print("| precision | " + " | ".join(f"seed {i}" for i in range(1, a.seeds + 1)) +
              " | median step | steps / f32 | median s | s/step | skipped steps | final " +
              ("loss" if w["at_most"] else "accuracy") + " |")
        print("| --- | " + " | ".join("---:" for _ in range(a.seeds)) + " | ---: | ---: | ---: | ---: | ---: | ---: |")
        base = median_or_none([r["step"] for r in results[(name, "f32")]])
        for p in a.precisions:
            runs = results[(name, p)]
            cells = ["not reached" if r["step"] is None else f"{r['step']} ({r['seconds']:.1f} s)" for r in runs]
            m = median_or_none([r["step"] for r in runs])
            ratio = "-" if m is None or base is None else f"{m / base:.2f}"
            ms = median_or_none([r["seconds"] for r in runs])
            print(f"| {p} | " + " | ".join(cells) + f" | {'-' if m is None else m:} | {ratio} | "
                  f"{'-' if ms is None else f'{ms:.1f}'} | {statistics.median(r['seconds_per_step'] for r in runs):.4f} | "
                  f"{sum(r['skipped'] for r in runs)} | {statistics.median(r['final'] for r in runs):.4f} |")
    for h in kftbench.hangs:
        print(f"note: a run hung (no progress within the limit) and was repeated: {h}")


if __name__ == "__main__":
    main()

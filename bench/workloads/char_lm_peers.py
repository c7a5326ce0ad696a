#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""kft's DDP trainer beside PyTorch 1.13 DDP on a character-level GPT, in one script.

    /usr/bin/python3 bench/workloads/char_lm_peers.py [--build build-tests] [--seeds 3] [--repeats 1]

The workload is examples/09-char-transformer: a 4-block GPT of width 256 (8 heads, 128
characters of context; 3.25 M parameters, 13 MB of f32 gradients in 2 buckets of <= 25 MiB)
trained with AdamW (lr 2e-3 after a 50-step linear warm-up, betas (0.9, 0.95), weight decay
0.01) on the text of Debian's `fortunes` package (/usr/share/games/fortunes, 2.6 MB; the last
10% for validation), 8 windows per rank per step, the validation loss on 128 windows every 25
steps. The PyTorch side (bench/workloads/char_lm_torch.py) is the same model
(examples/09-char-transformer/char_gpt.py, initialised from the same seed to the same values),
the same windows in the same order (kft's sampler, reproduced), the same optimizer, schedule
and evaluations, DDP over gloo under torchrun (gradient_as_bucket_view, 25 MB buckets); both
on OpenBLAS with one thread per rank (the script prints the BLAS torch loaded), f32.

Two parts:
  - throughput (--repeats pairs of --pair-steps steps, for each of --batches windows per rank):
    1 rank and 2 ranks of each peer, one after the other, for seconds per step, windows/s, the weak-scaling efficiency (2-rank
    rate / 2 x the 1-rank rate, per pair) and the communication left exposed after the
    backward pass (kft: the trainer's `exposed_comm_seconds`, its time waiting in the reducer's
    finish(), from its JSON summary; PyTorch: DDP's own logging data, backward communication
    time minus its overlap with backward compute, sampled on iterations 1-10 and every 100th);
  - time to the target validation loss (issue 45 item 7): 2 ranks of each peer with seeds
    1..N (sample order and initial weights), each seed's training time to the first
    evaluation at or below --target (evaluations excluded, as the trainer counts it) with that
    evaluation's fractional epoch beside it, the medians and their ratio.
  - bf16 (--precisions f32 bf16, the default): kft's runs to the target again with
    `--precision bf16` (weights and embeddings in bf16 with f32 master weights in the trainer,
    bf16 gradient buckets: half the bytes; the model computes in f32 on the bf16 values, as
    Debian's OpenBLAS has no bf16 GEMM). PyTorch 1.13 has no bf16 peer here: its gloo backend
    refuses a bf16 allreduce (RuntimeError: Invalid scalar type), so DDP cannot reduce bf16
    gradients on CPU (bf16_compress_hook's allreduce fails the same way), and autocast would leave OpenBLAS for
    ATen's own bf16 matmul; the table says so instead of timing another BLAS.
Prints Markdown tables of the measured numbers; nothing here passes or fails.
"""
import argparse
import json
import math
import os
import statistics
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "common"))
import kftbench  # noqa: E402

# One BLAS/OpenMP thread per rank; a run that hangs is killed after 600 s (and torchrun's workers too).
RUN = dict(limit=600, env=kftbench.ONE_THREAD, leftovers="char_lm_torch.py")


def kft(build, ranks, args):
    log = tempfile.mktemp(prefix="kft-charlm-", suffix=".jsonl")
    exe = kftbench.example(build, "09-char-transformer")
    cmd = [exe, "--threads", "1", "--quiet", "--sample", "0", "--log-json", log] + args
    if ranks > 1:
        cmd = [kftbench.kftrun(build), "--nproc-per-node", str(ranks), "--"] + cmd
    kftbench.run(cmd, **RUN)
    with open(log) as f:
        events = [json.loads(line) for line in f]
    os.unlink(log)
    s = [e for e in events if e["event"] == "summary"][-1]
    return {"seconds_per_step": s["train_seconds"] / s["steps"], "samples_per_s": s["samples_per_s"],
            "seconds_to_target": s["seconds_to_target"], "epoch_to_target": s["epoch_to_target"],
            "final_loss": s["final_loss"], "exposed_per_step": s["exposed_comm_seconds"] / s["steps"]}


def torch(ranks, args):
    r = kftbench.torch_peer(os.path.join(here, "char_lm_torch.py"), ranks, args, **RUN)
    r["exposed_per_step"] = r.pop("exposed_comm_seconds_per_step")
    return r


def cell(v, fmt="{:.3f}"):
    return "-" if v is None else fmt.format(v)


def median_to_target(runs):
    """The median time to target; a run that did not reach it counts as slower than any that did."""
    m = statistics.median([math.inf if r["seconds_to_target"] is None else r["seconds_to_target"] for r in runs])
    return None if math.isinf(m) else m


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(kftbench.REPO, "build-tests"))
    ap.add_argument("--seeds", type=int, default=3, help="seeds 1..N for the time to target (0: leave it out)")
    ap.add_argument("--repeats", type=int, default=1, help="pairs (1 rank, 2 ranks) of each peer for the throughput")
    ap.add_argument("--pair-steps", type=int, default=30, help="steps of each throughput run")
    ap.add_argument("--batches", type=int, nargs="+", default=[8],
                    help="windows per rank of the throughput runs, one row group each (the time to target uses 8)")
    ap.add_argument("--target", type=float, default=2.7, help="validation loss (nats per character)")
    ap.add_argument("--max-steps", type=int, default=225, help="steps of each time-to-target run")
    ap.add_argument("--precisions", nargs="+", default=["f32", "bf16"], choices=["f32", "bf16"],
                    help="kft's precisions in the time-to-target runs (PyTorch: f32)")
    a = ap.parse_args()
    if a.repeats < 1 or a.seeds < 0 or a.pair_steps < 1 or min(a.batches) < 1:
        sys.exit(f"char_lm_peers: --repeats, --pair-steps and --batches must be >= 1, --seeds >= 0 "
                 f"(got {a.repeats}, {a.pair_steps}, {a.batches}, {a.seeds})")
    if not os.path.exists(kftbench.example(a.build, "09-char-transformer")):
        sys.exit(f"char_lm_peers: no {a.build}/examples/09-char-transformer: build it first")
    if not os.path.isdir("/usr/share/games/fortunes"):
        sys.exit("char_lm_peers: /usr/share/games/fortunes is missing: apt-get install fortunes")
    load0 = os.getloadavg()

    # Throughput pairs: one evaluation (8 windows) at the end only.
    rows = {}  # (batch, peer, ranks) -> [run]
    effs = {}  # (batch, peer) -> [efficiency]
    for _ in range(a.repeats):
        for b in a.batches:
            pair = ["--max-steps", str(a.pair_steps), "--eval-every", "0", "--eval-windows", "8", "--batch", str(b)]
            for name, f in (("kft", lambda n: kft(a.build, n, pair)), ("PyTorch", lambda n: torch(n, pair))):
                one, two = f(1), f(2)
                rows.setdefault((b, name, 1), []).append(one)
                rows.setdefault((b, name, 2), []).append(two)
                effs.setdefault((b, name), []).append(two["samples_per_s"] / (2 * one["samples_per_s"]))
    info = rows[(a.batches[0], "PyTorch", 1)][0]

    # Time to target: 2 ranks, seeds 1..N, kft and PyTorch interleaved (each seed's pair shares the machine's phase).
    run = ["--max-steps", str(a.max_steps), "--eval-every", "25", "--eval-windows", "128", "--target", str(a.target)]
    seeded = {("kft", p): [] for p in a.precisions}
    seeded[("PyTorch", "f32")] = []
    for seed in range(1, a.seeds + 1):
        for p in a.precisions:
            seeded[("kft", p)].append(kft(a.build, 2, run + ["--seed", str(seed), "--precision", p]))
        seeded[("PyTorch", "f32")].append(torch(2, run + ["--seed", str(seed)]))
    load1 = os.getloadavg()

    def med(v):
        return statistics.median(v) if v else None

    print(f"# char GPT 4 x 256 (8 heads, ctx 128; 3.25 M parameters, 13 MB of f32 gradients) on Debian's fortunes, "
          f"batch 8 windows/rank, AdamW lr 2e-3 (warm-up 50) betas (0.9, 0.95) wd 0.01; "
          f"{kftbench.cpu_description()}, {os.cpu_count()} CPUs")
    print(f"# 1 BLAS thread per rank on both sides; PyTorch {info['torch']} loaded: {info['blas']}; kft: OpenBLAS "
          f"(example 09 links libopenblas.so.0); load average {load0[0]:.2f} at the start, {load1[0]:.2f} at the end")
    print("# throughput: f32; bf16: kft only (PyTorch 1.13's gloo refuses bf16 allreduce: no bf16 DDP on CPU)")
    print()
    print(f"Throughput ({a.pair_steps} steps per run, medians of {a.repeats} pair(s); weak scaling: 2-rank windows/s over "
          f"2 x the 1-rank run's just before it):")
    print()
    print("| windows/rank | run | ranks | s/step | windows/s | exposed comm per step | weak-scaling eff. |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for (b, name, n), runs in rows.items():
        sps = med([r["seconds_per_step"] for r in runs])
        exp = med([r["exposed_per_step"] for r in runs if r["exposed_per_step"] is not None])
        exposed = "-" if n == 1 or exp is None else f"{1000 * exp:.1f} ms ({100 * exp / sps:.1f}%)"
        eff = "-" if n == 1 else kftbench.spread([100 * e for e in effs[(b, name)]], "{:.0f}%")
        label = {("kft", 1): "kft", ("kft", 2): "kft (kftrun, shm)", ("PyTorch", 1): "PyTorch 1 process",
                 ("PyTorch", 2): "PyTorch DDP (gloo, torchrun)"}[(name, n)]
        print(f"| {b} | {label} | {n} | {sps:.3f} | {med([r['samples_per_s'] for r in runs]):.1f} | {exposed} | {eff} |")
    print()
    for b in a.batches:
        k2 = med([r["seconds_per_step"] for r in rows[(b, "kft", 2)]])
        t2 = med([r["seconds_per_step"] for r in rows[(b, "PyTorch", 2)]])
        print(f"{b} windows/rank: kft 2 ranks' seconds per step / PyTorch DDP's: {k2 / t2:.2f}")
    print()
    if a.seeds:
        print(f"Time to validation loss <= {a.target} on 2 ranks, seeds 1..{a.seeds} (each: seconds of training "
              f"(epoch of the crossing evaluation; the run's seconds per step); a run that never reached it counts as "
              f"slower than any that did):")
        print()
        print("| run | precision | " + " | ".join(f"seed {i}" for i in range(1, a.seeds + 1)) +
              " | median (s) | s/step | exposed comm per step | final loss |")
        print("| --- | --- | " + " | ".join("---:" for _ in range(a.seeds)) + " | ---: | ---: | ---: | ---: |")
        for (name, p), runs in seeded.items():
            cells = [("not reached" if r["seconds_to_target"] is None else
                      f"{r['seconds_to_target']:.1f} ({r['epoch_to_target']:.3f}; {r['seconds_per_step']:.3f})")
                     for r in runs]
            sps = med([r["seconds_per_step"] for r in runs])
            exp = med([r["exposed_per_step"] for r in runs if r["exposed_per_step"] is not None])
            print(f"| {'kft (kftrun, shm)' if name == 'kft' else 'PyTorch DDP (gloo, torchrun)'} | {p} | " +
                  " | ".join(cells) +
                  f" | {cell(median_to_target(runs), '{:.1f}')} | {sps:.3f} | "
                  f"{'-' if exp is None else f'{1000 * exp:.1f} ms'} | {med([r['final_loss'] for r in runs]):.4f} |")
        print()
        theirs = seeded[("PyTorch", "f32")]
        t = median_to_target(theirs)
        for p in a.precisions:
            mine = seeded[("kft", p)]
            k = median_to_target(mine)
            if k and t:
                sk = med([r["seconds_per_step"] for r in mine])
                st = med([r["seconds_per_step"] for r in theirs])
                each = ", ".join("-" if None in (x["seconds_to_target"], y["seconds_to_target"]) else
                                 f"{x['seconds_to_target'] / y['seconds_to_target']:.2f}" for x, y in zip(mine, theirs))
                print(f"median over seeds, kft {p} 2 ranks time to loss <= {a.target} / PyTorch DDP f32: {k / t:.2f} "
                      f"(issue 45's target <= 0.5); seed by seed: {each}; seconds per step (medians): {sk / st:.2f}")
                print()
            else:
                print(f"a seeded run ({p}) did not reach {a.target}: no median ratio")
                print()
    for h in kftbench.hangs:
        print(f"note: a run hung (no progress within the limit) and was repeated: {h}")


if __name__ == "__main__":
    main()

#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The anchor of `ddp_perf bucketing`: PyTorch 1.13's own DDP buckets against one allreduce per
tensor, over gloo, on the same gradient sizes (Debian's python3-torch, under torchrun).

    build-tests/bench/ddp_perf bucketing --list-sizes > /tmp/sizes.txt
    /usr/bin/python3 -m torch.distributed.run --standalone --nproc_per_node 2 \\
        bench/ddp/ddp_bucketing_torch.py --sizes /tmp/sizes.txt --reps 21

The model is one parameter per size whose gradient is a constant (the backward pass costs a
fill), so a step is the backward's fill plus the communication:
  ddp        torch.nn.parallel.DistributedDataParallel (bucket_cap_mb 25, first bucket 1 MiB,
             gradient_as_bucket_view: gradients are views into the buckets, as in kft)
  per-tensor the same backward without DDP, then one async all_reduce per gradient (last layer
             first, as backward produces them), all waited for, then divided by the world size
  backward   the backward alone (no communication)
Variants alternate within each repetition in a rotating order; the times are the slowest
rank's; prints one JSON line (rank 0) with the medians and the median per-repetition ratio.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


class Grads(nn.Module):
    def __init__(self, counts):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.zeros(n)) for n in counts])

    def forward(self, c):
        return sum((p * c).sum() for p in self.ps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", required=True, help="element counts, one per line (ddp_perf bucketing --list-sizes)")
    ap.add_argument("--reps", type=int, default=21)
    a = ap.parse_args()
    with open(a.sizes) as f:
        counts = [int(line) for line in f if line.strip() and not line.startswith("#")]
    if not counts:
        raise SystemExit(f"{a.sizes}: no sizes")
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    c = torch.tensor(float(rank + 1))
    want = (world + 1) / 2.0

    plain = Grads(counts)
    wrapped = Grads(counts)
    ddp = nn.parallel.DistributedDataParallel(wrapped, bucket_cap_mb=25, gradient_as_bucket_view=True)
    wrong = 0

    def check(model):
        nonlocal wrong
        for p in model.parameters():
            wrong += int((p.grad != want).sum())

    def slowest(t):
        v = torch.tensor([t], dtype=torch.float64)
        dist.all_reduce(v, op=dist.ReduceOp.MAX)
        return float(v)

    def step_ddp():
        for p in wrapped.parameters():
            p.grad = None if p.grad is None else p.grad.zero_()
        loss = ddp(c)
        dist.barrier()
        t0 = time.perf_counter()
        loss.backward()
        t = time.perf_counter() - t0
        check(wrapped)
        return t

    def step_per_tensor():
        plain.zero_grad(set_to_none=False)
        loss = plain(c)
        dist.barrier()
        t0 = time.perf_counter()
        loss.backward()
        grads = [p.grad for p in plain.parameters()][::-1]
        works = [dist.all_reduce(g, async_op=True) for g in grads]
        for w in works:
            w.wait()
        for g in grads:
            g.div_(world)
        t = time.perf_counter() - t0
        check(plain)
        return t

    def step_backward():
        plain.zero_grad(set_to_none=False)
        loss = plain(c)
        dist.barrier()
        t0 = time.perf_counter()
        loss.backward()
        return time.perf_counter() - t0

    variants = [step_ddp, step_per_tensor, step_backward]
    times = [[] for _ in variants]
    for r in range(a.reps + 2):  # two warm-up rounds (DDP rebuilds its buckets after the first)
        for k in range(len(variants)):
            v = (k + r) % len(variants)
            t = slowest(variants[v]())
            if r >= 2:
                times[v].append(t)
    wrong_t = torch.tensor([wrong], dtype=torch.int64)
    dist.all_reduce(wrong_t)
    if rank == 0:
        ratios = [p / d for p, d in zip(times[1], times[0])]
        print(json.dumps({
            "peer": "pytorch", "torch": torch.__version__, "ranks": world, "tensors": len(counts),
            "mib": sum(counts) * 4 / 2**20, "reps": a.reps,
            "ddp_ms": 1e3 * statistics.median(times[0]), "per_tensor_ms": 1e3 * statistics.median(times[1]),
            "backward_ms": 1e3 * statistics.median(times[2]), "ratio": statistics.median(ratios),
            "wrong": int(wrong_t)}), flush=True)
    # Leave without tearing gloo down: torch 1.13's teardown now and then hangs or aborts after
    # the last step (seen in bench/workloads/fashion_mnist_peers.py too); every rank is done by this barrier.
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()

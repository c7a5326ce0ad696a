#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch side of bench/workloads/fashion_mnist_peers.py: the same MLP, data, batch, learning rate,
epochs, evaluation schedule and target as examples/05-fashion-mnist, in PyTorch (Debian's
python3-torch under /usr/bin/python3), as one process or as DDP (gloo) under torchrun.

    /usr/bin/python3 bench/workloads/fashion_mnist_torch.py --epochs 5
    torchrun --standalone --nproc_per_node 2 bench/workloads/fashion_mnist_torch.py --epochs 5

Prints one JSON line (rank 0): seconds per epoch, time to the target (training time, the
evaluations excluded, as kft's trainer counts it), final accuracy, samples/s, the BLAS torch
loaded and its thread count.

It is also the reference of tests/integration/libtorch_equivalence.py: `--no-shuffle` takes the
samples in file order (DistributedSampler(shuffle=False)), `--init-out` / `--final-out` make rank 0
write the parameters before the first and after the last step (raw little-endian f32 in
named_parameters() order), and `--max-steps` stops early.
"""
import argparse
import gzip
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn


def load(d, split):
    with gzip.open(os.path.join(d, split + "-images-idx3-ubyte.gz")) as f:
        x = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 784)
    with gzip.open(os.path.join(d, split + "-labels-idx1-ubyte.gz")) as f:
        y = np.frombuffer(f.read(), np.uint8, offset=8)
    return torch.from_numpy(x.copy()), torch.from_numpy(y.astype(np.int64))


def blas_loaded():
    try:
        with open("/proc/self/maps") as f:
            libs = {line.split()[-1] for line in f if ".so" in line}
        hits = sorted(os.path.basename(p) for p in libs if "blas" in p.lower())
        return ", ".join(hits) or "unknown"
    except OSError:
        return "unknown"


def join_job(threads):
    """torch threads per rank; under torchrun (WORLD_SIZE > 1) the gloo process group.
    Returns (ddp, rank, world)."""
    torch.set_num_threads(threads)
    ddp = "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1
    if ddp:
        dist.init_process_group("gloo")
    return ddp, (dist.get_rank() if ddp else 0), (dist.get_world_size() if ddp else 1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="/usr/share/datasets/fashion-mnist")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--batch", type=int, default=64, help="samples per rank per step")
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--momentum", type=float, default=0.9)
    ap.add_argument("--hidden", default="256,128")
    ap.add_argument("--target", type=float, default=0.87)
    ap.add_argument("--evals-per-epoch", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--no-shuffle", action="store_true", help="samples in file order")
    ap.add_argument("--init-out", help="rank 0 writes the initial parameters here (raw f32)")
    ap.add_argument("--final-out", help="rank 0 writes the final parameters here (raw f32)")
    a = ap.parse_args()

    ddp, rank, world = join_job(a.threads)
    torch.manual_seed(a.seed)

    xtr, ytr = load(a.data, "train")
    xte, yte = load(a.data, "t10k")
    widths = [784] + [int(w) for w in a.hidden.split(",")] + [10]
    layers = []
    for i in range(len(widths) - 1):
        layers.append(nn.Linear(widths[i], widths[i + 1]))
        if i + 2 < len(widths):
            layers.append(nn.ReLU())
    model = nn.Sequential(*layers)

    def save(path):
        if path and rank == 0:
            with open(path + ".tmp", "wb") as f:
                for p in model.parameters():
                    f.write(p.detach().contiguous().numpy().astype("<f4").tobytes())
            os.replace(path + ".tmp", path)

    save(a.init_out)
    net = nn.parallel.DistributedDataParallel(model) if ddp else model
    opt = torch.optim.SGD(net.parameters(), lr=a.lr, momentum=a.momentum)
    lossf = nn.CrossEntropyLoss()

    def prep(x):
        return (x.float() * (1.0 / 255.0) - 0.2860) * (1.0 / 0.3530)

    def evaluate():
        model.eval()
        correct = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            idx = torch.arange(rank, xte.shape[0], world)
            for s in range(0, idx.numel(), 1000):
                b = idx[s:s + 1000]
                out = model(prep(xte[b]))
                correct[0] += (out.argmax(1) == yte[b]).sum().item()
                correct[1] += b.numel()
        if ddp:
            dist.all_reduce(correct)
        model.train()
        return correct[0].item() / correct[1].item()

    n = xtr.shape[0]
    per_rank = (n + world - 1) // world
    steps_per_epoch = (per_rank + a.batch - 1) // a.batch
    eval_every = max(1, steps_per_epoch // a.evals_per_epoch)
    train_s, to_target, epoch_s, acc, step = 0.0, None, [], 0.0, 0
    epoch_to_target = None  # the fractional epoch of the evaluation that first reached the target
    done = False
    for epoch in range(a.epochs):
        if done:
            break
        if a.no_shuffle:
            perm = torch.arange(n)
        else:
            g = torch.Generator()
            g.manual_seed(a.seed + epoch)
            perm = torch.randperm(n, generator=g)
        perm = torch.cat([perm, perm[: per_rank * world - n]])[rank::world]  # DistributedSampler's rule
        t_epoch = 0.0
        t0 = time.perf_counter()
        for s in range(steps_per_epoch):
            b = perm[s * a.batch:(s + 1) * a.batch]
            opt.zero_grad(set_to_none=True)
            loss = lossf(net(prep(xtr[b])), ytr[b])
            loss.backward()
            opt.step()
            step += 1
            if os.environ.get("KFT_BENCH_DEBUG") and step % 100 == 0:
                print(f"rank {rank} epoch {epoch} step {step}", flush=True)
            done = a.max_steps and step >= a.max_steps
            if step % eval_every == 0 or s + 1 == steps_per_epoch or done:
                t1 = time.perf_counter()
                t_epoch += t1 - t0
                train_s += t1 - t0
                acc = evaluate()
                if to_target is None and acc >= a.target:
                    to_target = train_s
                    epoch_to_target = epoch + (s + 1) / steps_per_epoch
                t0 = time.perf_counter()
            if done:
                break
        epoch_s.append(t_epoch)
    save(a.final_out)
    if rank == 0:
        print(json.dumps({
            "peer": "pytorch-ddp-gloo" if ddp else "pytorch-1-process", "ranks": world, "torch": torch.__version__,
            "blas": blas_loaded(), "threads_per_rank": torch.get_num_threads(),
            "seconds_per_epoch": sum(epoch_s) / len(epoch_s), "train_seconds": train_s,
            "seconds_to_target": to_target, "epoch_to_target": epoch_to_target, "final_accuracy": acc,
            "steps": step, "samples_per_s": step * a.batch * world / train_s}), flush=True)
    if ddp:
        dist.barrier()  # both ranks are done before either tears gloo down
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

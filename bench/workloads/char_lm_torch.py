#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""The PyTorch side of bench/workloads/char_lm_peers.py: examples/09-char-transformer in PyTorch
1.13 (Debian's python3-torch under /usr/bin/python3), as one process or as DDP (gloo) under
torchrun, with everything that decides the arithmetic taken from the example:

  - the model: examples/09-char-transformer/char_gpt.py (gpt.hpp's twin: the same parameters,
    shapes and initialisation from the same seed, --seed + 1);
  - the text: corpus.hpp's reading (the files of a directory not ending .dat/.u8, by name; the
    distinct bytes, sorted, as the vocabulary; the last --valid-fraction for validation);
  - the windows: training window i at token i * ctx; --eval-windows validation windows spread
    as main.cpp spreads them;
  - the order: kft's sampler (kft/ddp/sampler.hpp: the splitmix64 Fisher-Yates of seed and
    epoch, global batches of consecutive positions, rank r taking positions r, r + N, ...),
    so both sides train on the same windows in the same steps;
  - AdamW (lr, betas (0.9, --beta2), eps 1e-8, --weight-decay on every parameter) with the
    same linear warm-up; a validation loss every --eval-every steps and after the last step.

    /usr/bin/python3 bench/workloads/char_lm_torch.py --max-steps 300
    torchrun --standalone --nproc_per_node 2 bench/workloads/char_lm_torch.py --max-steps 300

Prints one JSON line (rank 0): seconds per step, time to the target (training time, the
evaluations excluded, as kft's trainer counts it) with the epoch of the evaluation that first
reached it, every evaluation, windows/s, the BLAS torch loaded, and DDP's own timing of the
communication left exposed after the backward pass (its logging data, sampled by the reducer
on iterations 1-10 and every 100th).
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(here)), "examples", "09-char-transformer"))
from char_gpt import CharGPT, Config, _splitmix64  # noqa: E402
from fashion_mnist_torch import blas_loaded, join_job  # noqa: E402


def text_files(path):
    """corpus.hpp's text_files: a file, or a directory's regular files not ending .dat/.u8, by name."""
    if not os.path.exists(path):
        sys.exit(f"char_lm_torch: {path}: no such file or directory")
    if not os.path.isdir(path):
        return [path]
    return sorted(os.path.join(path, n) for n in os.listdir(path)
                  if os.path.isfile(os.path.join(path, n)) and os.path.splitext(n)[1] not in (".dat", ".u8"))


def read_corpus(paths, valid_fraction):
    """corpus.hpp's read_corpus: token ids over the sorted distinct bytes; the last fraction for validation."""
    text = b"".join(open(f, "rb").read() for p in paths for f in text_files(p))
    raw = np.frombuffer(text, np.uint8)
    vocab = np.unique(raw)
    ids = np.searchsorted(vocab, raw).astype(np.uint8)
    valid = int(len(ids) * valid_fraction)
    return ids[:len(ids) - valid], ids[len(ids) - valid:], len(vocab)


def permutation(size, seed, epoch):
    """kft::ddp::permutation (kft/ddp/sampler.hpp): Fisher-Yates driven by splitmix64."""
    mask = (1 << 64) - 1
    state = (seed ^ (((epoch + 1) * 0xD1B54A32D192ED03) & mask)) & mask
    draws = _splitmix64(state, max(size - 1, 0)).tolist()
    p = list(range(size))
    for k, i in enumerate(range(size - 1, 0, -1)):
        j = (draws[k] * (i + 1)) >> 64
        p[i], p[j] = p[j], p[i]
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", nargs="+", default=["/usr/share/games/fortunes"])
    ap.add_argument("--valid-fraction", type=float, default=0.1)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d", type=int, default=256)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8, help="windows per rank per step")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--max-steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--beta2", type=float, default=0.95)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--eval-every", type=int, default=25)
    ap.add_argument("--eval-windows", type=int, default=256)
    ap.add_argument("--target", type=float, default=2.5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bucket-cap-mb", type=int, default=25)
    a = ap.parse_args()

    ddp, rank, world = join_job(a.threads)

    train, valid, vocab = read_corpus(a.data, a.valid_fraction)
    need = a.ctx + 1
    train_w = torch.from_numpy(train.astype(np.int64)).unfold(0, need, a.ctx)  # window i: tokens i*ctx ...
    spans = len(valid) - need
    valid_stride = a.ctx
    if a.eval_windows > 1 and spans // (a.eval_windows - 1) > a.ctx:
        valid_stride = spans // (a.eval_windows - 1)
    valid_w = torch.from_numpy(valid.astype(np.int64)).unfold(0, need, valid_stride)[:a.eval_windows]

    model = CharGPT(Config(vocab=vocab, ctx=a.ctx, d=a.d, layers=a.layers, heads=a.heads, seed=a.seed + 1))
    net = model
    if ddp:
        # The causal masks are constant bool buffers, which gloo cannot broadcast: DDP leaves them alone.
        DDP = torch.nn.parallel.DistributedDataParallel
        DDP._set_params_and_buffers_to_ignore_for_model(model, [n for n, _ in model.named_buffers()])
        net = DDP(model, bucket_cap_mb=a.bucket_cap_mb, gradient_as_bucket_view=True)

    def lr_at(s):
        return a.lr * s / a.warmup if a.warmup and s < a.warmup else a.lr

    opt = torch.optim.AdamW(net.parameters(), lr=lr_at(1), betas=(0.9, a.beta2), eps=1e-8,
                            weight_decay=a.weight_decay)

    def evaluate():
        """kft's trainer: rank r takes windows r, r + N, ...; sums reduced over the ranks."""
        model.eval()
        sums = torch.zeros(2, dtype=torch.float64)
        with torch.no_grad():
            mine = valid_w[rank::world]
            for s in range(0, mine.shape[0], a.batch):
                w = mine[s:s + a.batch]
                _, loss = model(w[:, :-1], w[:, 1:])
                sums[0] += loss.item() * w[:, 1:].numel()
                sums[1] += w[:, 1:].numel()
        if ddp:
            dist.all_reduce(sums)
        model.train()
        return sums[0].item() / sums[1].item()

    n = train_w.shape[0]
    global_batch = a.batch * world
    train_s, to_target, epoch_to_target, step, evals = 0.0, None, None, 0, []
    done = False
    for epoch in range(a.epochs):
        if done:
            break
        order = permutation(n, a.seed, epoch)
        cursor = 0
        t0 = time.perf_counter()
        while cursor < n and not done:
            size = min(global_batch, n - cursor)
            per_rank = -(-size // world)
            pos = [cursor + rank + k * world for k in range(per_rank)]
            idx = torch.tensor([order[p - (cursor + size) if p >= cursor + size else p] for p in pos])
            cursor += size
            w = train_w[idx]
            opt.zero_grad(set_to_none=True)
            _, loss = net(w[:, :-1], w[:, 1:])
            loss.backward()
            opt.step()
            step += 1
            for g in opt.param_groups:
                g["lr"] = lr_at(step + 1)
            done = a.max_steps and step >= a.max_steps
            if (a.eval_every and step % a.eval_every == 0) or done or cursor >= n:
                t1 = time.perf_counter()
                train_s += t1 - t0
                ep = epoch + cursor / n
                v = evaluate()
                evals.append({"step": step, "epoch": ep, "train_seconds": train_s, "loss": v})
                if to_target is None and v <= a.target:
                    to_target, epoch_to_target = train_s, ep
                t0 = time.perf_counter()
    exposed = None
    if ddp:
        d = net._get_ddp_logging_data()
        if "avg_backward_comm_time" in d:  # nanoseconds, averaged over the sampled iterations
            exposed = (d["avg_backward_comm_time"] - d["avg_backward_compute_comm_overlap_time"]) * 1e-9
    if rank == 0:
        print(json.dumps({
            "peer": "pytorch-ddp-gloo" if ddp else "pytorch-1-process", "ranks": world, "torch": torch.__version__,
            "blas": blas_loaded(), "threads_per_rank": torch.get_num_threads(), "steps": step,
            "train_seconds": train_s, "seconds_per_step": train_s / max(step, 1),
            "seconds_to_target": to_target, "epoch_to_target": epoch_to_target,
            "final_loss": evals[-1]["loss"] if evals else math.nan, "evals": evals,
            "samples_per_s": step * global_batch / train_s if train_s > 0 else 0.0,
            "exposed_comm_seconds_per_step": exposed}), flush=True)
    if ddp:
        dist.barrier()  # both ranks are done before either tears gloo down
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""Example 09's C++ char_gpt (gpt.hpp) against its PyTorch twin (char_gpt.py beside it): the
same model computes the same loss and the same gradients, so a benchmark of the two compares
like with like.

    char_transformer_twin.py TEST_CHAR_TRANSFORMER [--configs V,CTX,D,LAYERS,HEADS,BATCH,SEED[,PERTURB] ...]
                             [--tolerance 1e-4]

For each config, `test_char_transformer --run_test=twin_dump -- --out F --config ...` builds the
C++ model (its values redrawn from the seed PERTURB when given, not 0: non-unit gains, non-zero
biases), runs one forward_backward over `BATCH` windows of random tokens and writes its
parameters, the tokens, the windows, the loss and every gradient (the format is in
tests/unit/test_char_transformer.cpp's header comment). This script then checks, under Debian's
python3-torch 1.13 (/usr/bin/python3):
1. the twin's parameters have the C++ names, sizes and order, and (unperturbed) its own
   initialisation from the seed gives the C++ values;
2. from those values, on those windows, torch's mean loss equals the C++ one (relative 1e-5) and
   so does the next-token accuracy;
3. every parameter's gradient: max |C++ - torch| <= tolerance x max |torch| over the tensor.
Prints each tensor's difference. Exit 0 on agreement, 1 naming what differs, 77 (skipped) when
this Python cannot import torch.
"""
import argparse
import os
import struct
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))
sys.path.insert(0, os.path.join(repo, "examples", "09-char-transformer"))

try:
    import numpy as np
    import torch
except ImportError as e:
    print(f"SKIP: {sys.executable} cannot import torch or numpy ({e}); Debian's python3-torch is needed")
    sys.exit(77)

from char_gpt import CharGPT, Config  # noqa: E402  (after the path and the skip)

# V,CTX,D,LAYERS,HEADS,BATCH,SEED[,PERTURB]: the tiny model of the gradient check and a second
# shape, each as initialised and with its values redrawn (PERTURB: non-unit gains, non-zero
# biases, large weights), and the default (the benchmark's) at batch 2.
DEFAULT_CONFIGS = ["11,8,16,2,2,3,7", "11,8,16,2,2,3,7,99", "37,16,32,3,4,4,21", "37,16,32,3,4,4,21,5",
                   "96,128,256,4,8,2,1"]


def read_dump(path):
    with open(path, "rb") as f:
        b = f.read()
    at = 0

    def take(fmt):
        nonlocal at
        v = struct.unpack_from("<" + fmt, b, at)
        at += struct.calcsize("<" + fmt)
        return v

    if b[:8] != b"KFTGPT01":
        raise ValueError(f"{path}: not a twin dump (magic {b[:8]!r})")
    at = 8
    vocab, ctx, d, layers, heads, stride = take("6I")
    (seed,) = take("Q")
    (ntok,) = take("I")
    tokens = np.frombuffer(b, dtype=np.uint8, count=ntok, offset=at).copy()
    at += ntok
    (batch,) = take("I")
    samples = np.frombuffer(b, dtype=np.uint32, count=batch, offset=at).copy()
    at += 4 * batch
    loss_sum, count, correct = take("3d")
    (nparams,) = take("I")
    params = []
    for _ in range(nparams):
        (nlen,) = take("I")
        name = b[at:at + nlen].decode()
        at += nlen
        (n,) = take("Q")
        value = np.frombuffer(b, dtype=np.float32, count=n, offset=at).copy()
        at += 4 * n
        grad = np.frombuffer(b, dtype=np.float32, count=n, offset=at).copy()
        at += 4 * n
        params.append((name, value, grad))
    if at != len(b):
        raise ValueError(f"{path}: {len(b) - at} bytes after the last parameter")
    cfg = Config(vocab=vocab, ctx=ctx, d=d, layers=layers, heads=heads, seed=seed)
    return cfg, stride, tokens, samples, (loss_sum, count, correct), params


def check(binary, spec, tolerance, tmp):
    out = os.path.join(tmp, "dump.bin")
    p = subprocess.run([binary, "--run_test=twin_dump", "--color_output=false", "--", "--out", out, "--config", spec],
                       capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        return [f"config {spec}: {binary} exited {p.returncode}: {(p.stdout + p.stderr)[-2000:]}"]
    cfg, stride, tokens, samples, (loss_sum, count, correct), params = read_dump(out)
    problems = []
    model = CharGPT(cfg)
    mine = list(model.named_parameters())
    print(f"config {spec}: {sum(p.numel() for _, p in mine)} parameters, C++ loss {loss_sum / count:.7f}")
    if [n for n, _ in mine] != [n for n, _, _ in params]:
        return problems + [f"config {spec}: parameter names or order differ: torch {[n for n, _ in mine]}, "
                           f"C++ {[n for n, _, _ in params]}"]
    perturbed = len(spec.split(",")) > 7 and int(spec.split(",")[7]) != 0
    for (name, p), (_, value, _) in zip(mine, params):
        if p.numel() != value.size:
            problems.append(f"config {spec}: {name}: {p.numel()} values in torch, {value.size} in C++")
            continue
        if perturbed:
            continue
        init_diff = float(np.max(np.abs(p.detach().numpy().ravel() - value))) if value.size else 0.0
        if init_diff > 1e-7:
            problems.append(f"config {spec}: {name}: the twin's initialisation differs from C++'s by {init_diff:.3g}")
    if problems:
        return problems
    with torch.no_grad():
        for (_, p), (_, value, _) in zip(mine, params):
            p.copy_(torch.from_numpy(value).view_as(p))  # the C++ values, bit for bit
    windows = np.stack([tokens[s * stride:s * stride + cfg.ctx + 1] for s in samples.astype(np.int64)])
    idx = torch.from_numpy(windows[:, :-1].astype(np.int64))
    tgt = torch.from_numpy(windows[:, 1:].astype(np.int64))
    logits, loss = model(idx, tgt)
    loss.backward()
    cpp_loss = loss_sum / count
    rel = abs(loss.item() - cpp_loss) / cpp_loss
    hits = int((logits.argmax(-1) == tgt).sum())
    print(f"  loss: torch {loss.item():.7f}, C++ {cpp_loss:.7f}, relative difference {rel:.2e}; "
          f"correct: torch {hits}, C++ {int(correct)} of {int(count)}")
    if count != idx.numel():
        problems.append(f"config {spec}: C++ counted {count} tokens, the batch has {idx.numel()}")
    if rel > 1e-5:
        problems.append(f"config {spec}: loss torch {loss.item()} C++ {cpp_loss}: relative difference {rel:.3g}")
    if abs(hits - correct) > max(1, count // 1000):  # argmax ties may fall either way
        problems.append(f"config {spec}: correct predictions torch {hits} C++ {correct}")
    worst = (0.0, "")
    for (name, p), (_, _, grad) in zip(mine, params):
        g = p.grad.numpy().ravel()
        scale = float(np.max(np.abs(g)))
        diff = float(np.max(np.abs(g - grad)))
        ratio = diff / scale if scale > 0 else diff
        worst = max(worst, (ratio, name))
        print(f"  {name:<16} {g.size:>8}  max|grad| {scale:.3e}  max|diff| {diff:.3e}  ({ratio:.2e} of max)")
        if ratio > tolerance:
            problems.append(f"config {spec}: {name}: gradients differ by {diff:.3g}, {ratio:.3g} of the largest "
                            f"({scale:.3g}); tolerance {tolerance}")
    print(f"  worst gradient difference: {worst[0]:.2e} of the tensor's largest, in {worst[1]}")
    return problems


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("binary", help="the test_char_transformer executable")
    ap.add_argument("--configs", nargs="+", default=DEFAULT_CONFIGS)
    ap.add_argument("--tolerance", type=float, default=1e-4)
    a = ap.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__} ({sys.executable})")
    problems = []
    with tempfile.TemporaryDirectory(prefix="kft-gpt-twin-") as tmp:
        for spec in a.configs:
            problems += check(a.binary, spec, a.tolerance, tmp)
    for p in problems:
        print("FAIL:", p)
    if not problems:
        print(f"char_transformer_twin: {len(a.configs)} configs agree "
              f"(loss 1e-5, gradients {a.tolerance} of each tensor's largest)")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()

#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""kft's libtorch DDP against Python PyTorch DDP: the same weights, data order and SGD, K steps,
parameters compared bit for bit.

    libtorch_equivalence.py KFTRUN EXAMPLE07 [--steps 40] [--loop own|trainer]
                            [--aten-capability native|default|avx2|avx512] [--tolerance T]

1. PyTorch 1.13 DDP (gloo, 2 ranks under torchrun, Debian's /usr/bin/python3) runs
   bench/workloads/fashion_mnist_torch.py: the Fashion-MNIST MLP 784-256-128-10, samples in file order
   (DistributedSampler(shuffle=False)), batch 32 per rank, SGD lr 0.05 momentum 0.9, K steps;
   rank 0 writes the initial and the final parameters (raw f32).
2. examples/07-libtorch-ddp runs the same under kftrun (2 ranks, kft's shared-memory group) from
   those initial parameters (--init-params), and writes its final parameters.
3. Both sides get one environment: one thread per rank (--threads 1, OMP_NUM_THREADS and
   OPENBLAS_NUM_THREADS 1), whatever OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE the machine sets, and
   ATEN_CPU_CAPABILITY when --aten-capability pins it. The test checks that both load the same
   libtorch and the same OpenBLAS (so OpenBLAS picks the same kernel for this CPU on both
   sides) and prints the ATen capability and OpenBLAS core in use.
4. Every value must agree to the bit (--tolerance T instead accepts a difference up to T of the
   largest parameter, for measurements).

What holds where (docs/libtorch.md, "Same bits"): the libtorch loop (--loop own, torch::optim::SGD)
runs the same kernels as Python on any CPU, so its bits agree with the CPU's own ATen capability.
kft's trainer (--loop trainer) updates with kft's SGD, `w -= lr * b` rounded twice, while ATen's
vectorized kernels (AVX2, AVX-512: what torch picks on x86 CPUs that have them) compute PyTorch's
`p.add_(buf, alpha=-lr)` as one fused multiply-add: its bits agree with ATen's default (scalar)
kernels, which ctest pins (--aten-capability default); with the vectorized ones the last bits
drift (4.6e-7 of the largest parameter after 40 steps on an AMD EPYC).
"""
import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

from procs import free_port  # (this folder is on the path when run as a script)

here = os.path.dirname(os.path.abspath(__file__))
repo = os.path.dirname(os.path.dirname(here))
DATA = "/usr/share/datasets/fashion-mnist"


def fail(msg, *context):
    print("FAIL:", msg)
    for c in context:
        print("  ", str(c)[-4000:])
    sys.exit(1)


def run(cmd, env, what, timeout=300, done_file=None):
    """Runs cmd to its end. With done_file: once that file exists, the job has written what the
    test needs; torch 1.13's gloo teardown sometimes never returns (bench/workloads/fashion_mnist_peers.py
    saw it too), so a job still running 30 s later is ended and the test goes on, saying so."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    deadline = time.monotonic() + timeout
    finished_at = None
    while p.poll() is None:
        now = time.monotonic()
        if done_file and finished_at is None and os.path.exists(done_file):
            finished_at = now
        if now > deadline or (finished_at is not None and now > finished_at + 30):
            os.killpg(p.pid, signal.SIGKILL)
            out, err = p.communicate()
            if finished_at is None:
                fail(f"{what} did not finish within {timeout} s", out, err)
            print(f"note: {what} wrote its results but had not exited 30 s later (torch's teardown); ended it")
            return
        time.sleep(0.1)
    out, err = p.communicate()
    if p.returncode != 0:
        fail(f"{what} exited {p.returncode}", out, err)


def loaded_libraries(example):
    """The shared libraries example 07 loads (ldd), by soname stem -> real path."""
    out = subprocess.run(["ldd", example], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in out.splitlines():
        parts = line.split("=>")
        if len(parts) == 2 and parts[1].strip().startswith("/"):
            libs[parts[0].strip().split(".so")[0]] = os.path.realpath(parts[1].split()[0])
    return libs


PROBE = r"""
import ctypes, os, sys, torch
cap = torch.__config__.show().split("CPU capability usage: ")[1].split("\n")[0].strip()
maps = open("/proc/self/maps").read().split()
libs = sorted({os.path.realpath(p) for p in maps if p.startswith("/") and ".so" in p})
blas = [p for p in libs if "openblas" in os.path.basename(p)]
core = ctypes.CDLL(blas[0]).openblas_get_corename if blas else None
if core: core.restype = ctypes.c_char_p
print(cap)
print(core().decode() if core else "?")
print("\n".join(libs))
"""


def same_kernels(example, env):
    """Checks that PyTorch (Python) and example 07 load the same libtorch and OpenBLAS, and
    says which ATen capability and OpenBLAS core they run with in this environment."""
    p = subprocess.run(["/usr/bin/python3", "-c", PROBE], capture_output=True, text=True, env=env)
    if p.returncode != 0:
        fail("could not ask PyTorch for its kernels", p.stdout, p.stderr)
    cap, core, *python_libs = p.stdout.split("\n")
    ours = loaded_libraries(example)
    for stem in ("libtorch_cpu", "libblas", "libopenblas"):
        theirs = [x for x in python_libs if os.path.basename(x).startswith(stem)]
        if stem not in ours or not theirs:
            fail(f"{stem}: example 07 loads {ours.get(stem, 'none')}, PyTorch loads {theirs or 'none'}")
        if stem != "libtorch_cpu" and "openblas" not in ours[stem]:
            fail(f"example 07's {stem} is {ours[stem]}, not OpenBLAS's")
        if ours[stem] not in theirs:
            fail(f"the two sides load different {stem}: example 07 {ours[stem]}, PyTorch {theirs[0]}: their "
                 f"kernels could differ, and so could the bits")
    return f"ATen CPU capability {cap}, OpenBLAS core {core}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kftrun")
    ap.add_argument("example")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--loop", default="own", choices=["own", "trainer"])
    ap.add_argument("--aten-capability", default="native", choices=["native", "default", "avx2", "avx512"],
                    help="ATEN_CPU_CAPABILITY for both sides (native: torch's choice for this CPU)")
    ap.add_argument("--tolerance", type=float, default=0.0,
                    help="accept a difference up to this fraction of the largest parameter (default: none)")
    a = ap.parse_args()
    if not os.path.exists(os.path.join(DATA, "train-images-idx3-ubyte.gz")):
        print(f"SKIP: no Fashion-MNIST in {DATA} (apt-get install dataset-fashion-mnist)")
        sys.exit(77)
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", KFT_RDZV_TOKEN="libtorch-equivalence")
    if a.aten_capability != "native":
        env["ATEN_CPU_CAPABILITY"] = a.aten_capability
    kernels = same_kernels(a.example, env)
    common = ["--batch", "32", "--lr", "0.05", "--momentum", "0.9", "--max-steps", str(a.steps), "--epochs", "1",
              "--evals-per-epoch", "1"]
    with tempfile.TemporaryDirectory() as d:
        init, ref, ours = (os.path.join(d, n) for n in ("init.f32", "torch.f32", "kft.f32"))
        port = free_port()
        run(["/usr/bin/python3", "-m", "torch.distributed.run", "--nnodes", "1", "--nproc_per_node", "2",
             "--master_addr", "127.0.0.1", "--master_port", str(port), "--monitor_interval", "0.2",
             "--redirects", "9:0", "--tee", "9:0",  # (torch 1.13 under Python 3.11 needs both set)
             os.path.join(repo, "bench", "workloads", "fashion_mnist_torch.py"), "--no-shuffle", "--threads", "1",
             "--init-out", init, "--final-out", ref] + common, env, "PyTorch DDP (torchrun, gloo)", done_file=ref)
        run([a.kftrun, "--nproc-per-node", "2", "--", a.example, "--loop", a.loop, "--no-shuffle", "--threads", "1",
             "--quiet", "--init-params", init, "--save-params", ours] + common, env, f"kft (example 07, --loop {a.loop})")
        x0 = np.fromfile(init, dtype="<f4")
        t = np.fromfile(ref, dtype="<f4")
        k = np.fromfile(ours, dtype="<f4")
    if not (x0.size == t.size == k.size == 235146):
        fail("parameter files of the wrong size", x0.size, t.size, k.size)
    moved = np.abs(t - x0).max()
    diff = np.abs(t - k)
    scale = np.abs(t).max()
    bits = int((t.view(np.uint32) != k.view(np.uint32)).sum())
    tol = a.tolerance
    print(f"libtorch_equivalence (--loop {a.loop}, {kernels}): {a.steps} steps of 2 ranks x 32 samples; the parameters "
          f"moved by up to {moved:.4g} from their start; kft vs PyTorch DDP: max |diff| {diff.max():.3g} "
          f"({diff.max() / scale:.3g} of the largest parameter, tolerance {tol:g}), "
          f"{bits} of {t.size} values differ in any bit")
    if moved < 1e-3:
        fail("the parameters barely moved: the comparison would prove nothing")
    if not np.isfinite(k).all():
        fail("kft's parameters are not finite")
    if diff.max() > tol * scale or (tol == 0 and bits):
        worst = int(diff.argmax())
        fail(f"kft and PyTorch DDP differ: {bits} of {t.size} values, by up to {diff.max():.4g} at value {worst} "
             f"(kft {k[worst]!r}, torch {t[worst]!r}) with {kernels}")


if __name__ == "__main__":
    main()

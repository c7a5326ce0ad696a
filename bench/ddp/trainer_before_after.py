#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The trainer before and after a change, in one script: Fashion-MNIST's time to 87% (example 05,
2 ranks under kftrun, 1 BLAS thread each) over several seeds, and the steady state of a step
(bench/ddp/trainer_steady.cpp: heap allocations, copied gradient bytes, ms per step).

  python3 bench/ddp/trainer_before_after.py --base 8d8c069 [--after build-tests] [--seeds 5] [--steady-runs 3]

The base revision is taken with `git archive` into a temporary directory; the same
trainer_steady.cpp source (with tests/common/alloc_counter.hpp) is added to it, so both sides
run one probe. Both sides build only example 05, kftrun and the probe (the base configured with
tools/configure.sh, tests off). Runs alternate ABBA per seed (this VM's speed drifts); the table
shows medians, and the crossing epoch of each seed's run beside its time.
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

here = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(here), "common"))
import kftbench  # noqa: E402

TARGETS = ["05-fashion-mnist", "kftrun", "trainer_steady"]
PROBE_CMAKE = """
# (added by bench/ddp/trainer_before_after.py: the probe the current tree builds, on this tree)
find_package(ZLIB QUIET)
add_executable(trainer_steady ddp/trainer_steady.cpp)
target_link_libraries(trainer_steady PRIVATE kft::kft PkgConfig::KFT_OPENBLAS ZLIB::ZLIB Threads::Threads rt)
target_compile_options(trainer_steady PRIVATE -O3)
"""


def prepare_base(rev, work):
    src = os.path.join(work, "base")
    os.makedirs(src)
    archive = subprocess.run(["git", "-C", kftbench.REPO, "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", src], input=archive, check=True)
    shutil.copy(os.path.join(here, "trainer_steady.cpp"), os.path.join(src, "bench", "ddp", "trainer_steady.cpp"))
    shutil.copy(os.path.join(kftbench.REPO, "tests", "common", "alloc_counter.hpp"),
                os.path.join(src, "tests", "common", "alloc_counter.hpp"))
    if "add_executable(trainer_steady" not in open(os.path.join(src, "bench", "CMakeLists.txt")).read():
        with open(os.path.join(src, "bench", "CMakeLists.txt"), "a") as f:
            f.write(PROBE_CMAKE)
    build = os.path.join(work, "build-base")
    print(f"# building {rev} in {build} (example 05, kftrun, trainer_steady)", flush=True)
    subprocess.run(["bash", os.path.join(src, "tools", "configure.sh"), build, "-DKFT_BUILD_TESTS=OFF"], check=True,
                   stdout=subprocess.DEVNULL)
    subprocess.run(["cmake", "--build", build, "--target", *TARGETS], check=True, stdout=subprocess.DEVNULL)
    return build


def fashion(build, seed, epochs):
    log = tempfile.mktemp(prefix="kft-before-after-", suffix=".jsonl")
    exe = kftbench.example(build, "05-fashion-mnist")
    cmd = [kftbench.kftrun(build), "--nproc-per-node", "2", "--", exe, "--threads", "1", "--quiet", "--seed", str(seed),
           "--epochs", str(epochs), "--log-json", log]
    kftbench.run(cmd, limit=300, env=kftbench.ONE_THREAD)
    with open(log) as f:
        events = [json.loads(line) for line in f]
    os.unlink(log)
    s = [e for e in events if e["event"] == "summary"][-1]
    crossed = [e["epoch"] for e in events if e["event"] == "eval" and e["test_accuracy"] >= 0.87]
    epochs_ = [e for e in events if e["event"] == "epoch"]
    return {"to_target": s["seconds_to_target"], "epoch": crossed[0] if crossed else None,
            "s_per_epoch": sum(e["seconds"] for e in epochs_) / max(1, len(epochs_))}


def steady(build, steps):
    out = kftbench.run([kftbench.bench_program(build, "trainer_steady"), "--steps", str(steps)], limit=300,
                       env=kftbench.ONE_THREAD)
    vals = {}
    for line in out.splitlines():
        if line.startswith("allocations per step:"):
            vals["allocs"] = float(line.split(":")[1].split()[0])
        elif line.startswith("gradient bytes copied per step:"):
            vals["copied"] = float(line.split(":")[1].split()[0])
        elif line.startswith("ms per step:"):
            vals["ms"] = float(line.split(":")[1])
    return vals


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the revision before the change (a commit, tag or branch)")
    ap.add_argument("--after", default=os.path.join(kftbench.REPO, "build-tests"),
                    help="a configured build directory of the current tree (its three targets are built)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--steady-runs", type=int, default=3)
    ap.add_argument("--steady-steps", type=int, default=300)
    ap.add_argument("--keep", help="build the base here and keep it (default: a temporary directory)")
    a = ap.parse_args()
    if a.seeds < 1 or a.steady_runs < 1:
        sys.exit("trainer_before_after: --seeds and --steady-runs must be >= 1")
    if not os.path.exists(os.path.join(a.after, "CMakeCache.txt")):
        sys.exit(f"trainer_before_after: {a.after} is not a configured build directory (bash tools/configure.sh DIR)")
    head = subprocess.run(["git", "-C", kftbench.REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True).stdout.strip()
    work = a.keep or tempfile.mkdtemp(prefix="kft-before-after-")
    try:
        base = prepare_base(a.base, work) if not os.path.exists(os.path.join(work, "build-base", "tools", "kftrun")) \
            else os.path.join(work, "build-base")
        print(f"# building the current tree in {a.after}", flush=True)
        subprocess.run(["cmake", "--build", a.after, "--target", *TARGETS], check=True, stdout=subprocess.DEVNULL)
        sides = {"before": base, "after": a.after}
        runs = {"before": [], "after": []}
        st = {"before": [], "after": []}
        for i in range(max(a.seeds, a.steady_runs)):
            order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
            for side in order:
                if i < a.seeds:
                    r = fashion(sides[side], i + 1, a.epochs)
                    runs[side].append(r)
                    print(f"# seed {i + 1} {side}: {r}", flush=True)
                if i < a.steady_runs:
                    st[side].append(steady(sides[side], a.steady_steps))
        print(f"\n## The trainer before ({a.base}) and after ({head}): {kftbench.cpu_name()}, "
              f"2 ranks x 1 BLAS thread, seeds 1-{a.seeds}\n")
        print("| measure | before | after | after / before |")
        print("| --- | ---: | ---: | ---: |")

        def row(name, b, f, fmt="{:.2f}"):
            ratio = f"{f / b:.2f}" if b and f else "-"
            print(f"| {name} | {'-' if b is None else fmt.format(b)} | {'-' if f is None else fmt.format(f)} | {ratio} |")
        row("time to 87%, median over seeds (s)", med([r["to_target"] for r in runs["before"]]),
            med([r["to_target"] for r in runs["after"]]))
        row("seconds per epoch, median", med([r["s_per_epoch"] for r in runs["before"]]),
            med([r["s_per_epoch"] for r in runs["after"]]), "{:.3f}")
        row("ms per steady step (trainer_steady), median", med([s["ms"] for s in st["before"]]),
            med([s["ms"] for s in st["after"]]), "{:.3f}")
        for key, name in (("allocs", "heap allocations per step"), ("copied", "gradient bytes copied per step")):
            b, f = max(s[key] for s in st["before"]), max(s[key] for s in st["after"])
            print(f"| {name} (the largest of the runs) | {b:g} | {f:g} | - |")
        print("\n| seed | before: s to 87% (epoch) | after: s to 87% (epoch) |")
        print("| ---: | ---: | ---: |")
        for i in range(a.seeds):
            cell = [("not reached" if r["to_target"] is None else f"{r['to_target']:.2f} ({r['epoch']:.2f})")
                    for r in (runs["before"][i], runs["after"][i])]
            print(f"| {i + 1} | {cell[0]} | {cell[1]} |")
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

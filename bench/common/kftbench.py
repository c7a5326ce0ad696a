# SPDX-License-Identifier: Apache-2.0
"""What every bench script shares: running a command (one policy for hangs and failures), the
build tree's programs, this machine's CPU, sizes, medians. Each script puts this folder on its
path first, so `python3 bench/<folder>/<script>.py` works from anywhere:

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
    import kftbench  # noqa: E402

Standard library only: the scripts run under Debian's /usr/bin/python3 (where python3-torch and
python3-matplotlib are) as well as under any other python3.
"""
import argparse
import json
import os
import platform
import signal
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Open MPI refuses to start as root without these (containers, CI).
ROOT_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
# One BLAS/OpenMP thread per rank: ranks on a few cores must not fight over them.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def who():
    """The running script's name, which every message starts with."""
    return os.path.splitext(os.path.basename(sys.argv[0]))[0] or "bench"


# ---- the build tree -------------------------------------------------------------------------

_flags_checked = set()


def reduced_flags(build):
    """The build's KFT_BENCH_OPTIMIZE, when it replaced the benchmarks' -O3 (the test suite's tree,
    build-tests, builds them at -O1 for its smoke tests), else ""."""
    try:
        with open(os.path.join(build, "CMakeCache.txt")) as f:
            for line in f:
                if line.startswith("KFT_BENCH_OPTIMIZE:"):
                    return line.split("=", 1)[1].strip()
    except OSError:
        pass
    return ""


def bench_program(build, name):
    """BUILD/bench/NAME: bench/CMakeLists.txt defines every program itself, so each lands there
    whichever folder of bench/ its source is in. Says once, on standard error, when the build's
    benchmarks are not at their own flags (their numbers are not the ones to quote)."""
    if build not in _flags_checked:
        _flags_checked.add(build)
        flags = reduced_flags(build)
        if flags:
            print(f"{who()}: note: {build} builds the benchmarks with KFT_BENCH_OPTIMIZE={flags} (the test suite's "
                  "smoke build), not -O3: for numbers, use a build configured without it (docs/building.md)",
                  file=sys.stderr)
    return os.path.join(build, "bench", name)


def kftrun(build):
    return os.path.join(build, "tools", "kftrun")


def example(build, name):
    return os.path.join(build, "examples", name)


# ---- this machine ---------------------------------------------------------------------------

def cpu_name():
    """The CPU's model name (/proc/cpuinfo), else what platform knows."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def cpu_description():
    """The model name, and the family/model numbers a VM's model name may hide (AMD family 26 = Zen 5)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                info.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    extra = f" (family {info['cpu family']}, model {info['model']})" if "cpu family" in info and "model" in info else ""
    return cpu_name() + extra


# ---- sizes and medians ----------------------------------------------------------------------

def parse_size(text):
    """nccl-tests' sizes: a number with an optional K, M or G (powers of 1024); for argparse."""
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    try:
        return int(t[:-1]) * mult[t[-1]] if t[-1] in mult else int(t)
    except (ValueError, IndexError):
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 8, 64K, 1M, 1G)")


def human(n):
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"


def spread(v, fmt="{:.2f}"):
    """'median (min-max)' of the values."""
    return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"


def median_table(runs):
    """The --json documents of several `*_perf --algos` runs, per size: auto's algorithm and median
    busbw, every forced algorithm's median busbw, the best of them, and choice_over_best."""
    by_size = {}
    for run in runs:
        for row in run["results"]:
            entry = by_size.setdefault(row["size"], {"auto_algo": row["algorithm"], "auto": [], "forced": {}})
            entry["auto"].append(row["out_of_place"]["bus_bw"])
            for algo, m in row.get("out_of_place_forced", {}).items():
                entry["forced"].setdefault(algo, []).append(m["bus_bw"])
    table = {}
    for size, e in sorted(by_size.items()):
        forced = {a: statistics.median(v) for a, v in e["forced"].items()}
        best = max(forced, key=forced.get) if forced else e["auto_algo"]
        chosen = forced.get(e["auto_algo"], statistics.median(e["auto"]))
        table[size] = {
            "auto_algorithm": e["auto_algo"],
            "auto_busbw": statistics.median(e["auto"]),
            "forced_busbw": forced,
            "best_algorithm": best,
            # The choice's quality, free of the auto row's own noise: forced(chosen) / forced(best).
            "choice_over_best": chosen / forced[best] if forced and forced[best] > 0 else 1.0,
        }
    return table


# ---- running a command ----------------------------------------------------------------------

hangs = []  # the runs that passed their limit and were run again (a script may report them at the end)


def _kill_group(proc):
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run(cmd, *, limit, env=None, attempts=3, leftovers=None, merge_stderr=False):
    """Runs `cmd` and returns its standard output. The bench scripts' one policy, the most careful
    of the three they had (no retry at all; two attempts, the hang printed; three, the hangs
    listed at the end):

      - the command runs in a session of its own, so all it starts (mpirun's or kftrun's ranks,
        torchrun's workers) can be killed together;
      - a run that takes more than `limit` seconds hangs: it is not a measurement. Its whole
        process group is killed, and whatever `leftovers` names (`pkill -f`: torchrun's workers
        leave the group), so no stray rank competes with the next run for the CPUs; the hang is
        printed at once (a '#' line) and kept in `hangs`; the command runs again, `attempts`
        times in all, then the script exits naming it;
      - a run that fails is never retried (a failure is a finding, not noise): the script exits
        with the command's whole output on stderr and the command named;
      - Ctrl-C kills the command's group too.

    `env` is added to this process's environment; a name mapped to None is removed.
    `merge_stderr`: the command's standard error is returned too, interleaved with its output."""
    e = dict(os.environ)
    for name, value in (env or {}).items():
        if value is None:
            e.pop(name, None)
        else:
            e[name] = value
    for attempt in range(attempts):
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
                                text=True, env=e, start_new_session=True)
        try:
            out, err = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            if leftovers:
                subprocess.run(["pkill", "-f", leftovers], check=False)
            shown = " ".join(os.path.basename(c) for c in cmd[:8])
            hangs.append(shown)
            print(f"#   (did not finish within {limit} s, attempt {attempt + 1} of {attempts}: {shown})", flush=True)
            continue
        except BaseException:
            _kill_group(proc)
            raise
        if proc.returncode != 0:
            sys.stderr.write(out)
            sys.stderr.write(err or "")
            sys.exit(f"{who()}: {' '.join(cmd)} exited {proc.returncode}")
        return out
    sys.exit(f"{who()}: {' '.join(cmd)} did not finish within {limit} s in {attempts} attempts")


def torch_peer(script, ranks, args, **kw):
    """Runs a PyTorch side (a script for Debian's /usr/bin/python3, where python3-torch is) by
    `run` (`kw`: its limit, env, leftovers): one process, or `ranks` workers under torchrun
    --standalone (rank 0's output, tee'd); returns its last output line that is a JSON object."""
    cmd = ["/usr/bin/python3", script]
    if ranks > 1:
        cmd[1:1] = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks), "--redirects", "9:0",
                    "--tee", "9:0", "--monitor_interval", "0.2"]
    out = run(cmd + list(args), **kw)
    return json.loads([line for line in out.splitlines() if line.startswith("{")][-1])


def run_perf_json(mpirun, nranks, program, flags, out_json, limit, env=None):
    """Runs a `*_perf` program under mpirun with --json out_json (by `run`) and returns the JSON."""
    cmd = [mpirun, "-np", str(nranks), "--oversubscribe", program, "--json", out_json] + flags
    run(cmd, limit=limit, env={**ROOT_ENV, **(env or {})})
    with open(out_json) as f:
        return json.load(f)

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The conventions every kft tool follows (tools/common/cli.hpp):

    tool_conventions.py VERSION KFTRUN KFT_INFO [KFT_MANIFEST] [KFT_TRACE]

--version prints "<tool> (kft VERSION)" and exits 0; --help exits 0 and lists --version,
--verbose and --quiet; an unknown flag, a bad value and a missing argument exit 2 with one line
"<tool> ERROR: ..." naming the flag or value; every diagnostic line on standard error reads
"<who> <LEVEL>: <message>"; KFT_LOG_LEVEL sets the threshold (a bad value exits 2 naming it),
-v/--verbose and -q/--quiet set KFT_LOG_LEVEL (kftrun's workers inherit it).
"""
import functools
import os
import re
import subprocess
import sys

import procs  # (this folder is on the path when run as a script)

VERSION, KFTRUN, KFT_INFO = sys.argv[1:4]
OPTIONAL = {os.path.basename(a): a for a in sys.argv[4:]}
KFT_MANIFEST = OPTIONAL.get("kft-manifest")
KFT_TRACE = OPTIONAL.get("kft-trace")
LINE = re.compile(r"^(kftrun|kftrun\[node \d+\]|kft-info|kft-manifest|kft-trace) (ERROR|WARN|INFO|DEBUG): \S")

# A clean environment: no launcher, no KFT_* of the caller (KFT_LOG_LEVEL above all).
BASE = {k: v for k, v in os.environ.items()
        if k in ("PATH", "HOME", "LANG", "LD_LIBRARY_PATH", "TMPDIR") or k.endswith("SAN_OPTIONS")}
# Not fatal: every convention is checked, and the script fails by procs.failures at the end.
expect = functools.partial(procs.expect, fatal=False)


def run(args, **extra):
    return subprocess.run(args, env={**BASE, **extra}, capture_output=True, text=True, timeout=60)


def well_formed(p):
    """Every line on standard error is a log line."""
    return all(LINE.match(l) for l in p.stderr.splitlines())


def usage_error(tool, args, *names, **extra):
    p = run(args, **extra)
    ok = (p.returncode == 2 and p.stdout == "" and p.stderr.startswith(f"{tool} ERROR: ") and
          p.stderr.count("\n") == 1 and all(n in p.stderr for n in names))
    expect(ok, f"{tool} {' '.join(args[1:])}: exit 2, one ERROR line naming {', '.join(map(repr, names))}", p)


tools = [("kftrun", KFTRUN), ("kft-info", KFT_INFO)] + ([("kft-manifest", KFT_MANIFEST)] if KFT_MANIFEST else []) + \
    ([("kft-trace", KFT_TRACE)] if KFT_TRACE else [])
for tool, exe in tools:
    p = run([exe, "--version"])
    expect(p.returncode == 0 and p.stdout == f"{tool} (kft {VERSION})\n" and p.stderr == "",
           f"{tool} --version prints '{tool} (kft {VERSION})' and exits 0", p)
    p = run([exe, "--help"])
    expect(p.returncode == 0 and all(f in p.stdout for f in ("--help", "--version", "--verbose", "--quiet")),
           f"{tool} --help exits 0 and lists --version, --verbose, --quiet", p)
    usage_error(tool, [exe, "--no-such-flag"], "--no-such-flag")
    usage_error(tool, [exe, "--verbose", "--quiet"], "--verbose", "--quiet")

# Bad values and missing arguments, per tool.
usage_error("kftrun", [KFTRUN, "--nnodes", "0", "--", "true"], '--nnodes="0"')
usage_error("kftrun", [KFTRUN, "--monitor-interval", "100", "--", "true"], "--monitor-interval", "100")
usage_error("kftrun", [KFTRUN, "--node-rank", "abc", "--", "true"], "--node-rank", "abc")
usage_error("kftrun", [KFTRUN, "--nproc-per-node", "2"], "program")
usage_error("kftrun", [KFTRUN, "--", "true"], 'KFT_LOG_LEVEL="loud"', KFT_LOG_LEVEL="loud")
usage_error("kft-info", [KFT_INFO, "--mpi=maybe"], "--mpi", "maybe")
usage_error("kft-info", [KFT_INFO, "--topology-timeout", "0"], "--topology-timeout", "0")
usage_error("kft-info", [KFT_INFO, "--output"], "--output")
usage_error("kft-info", [KFT_INFO], 'KFT_LOG_LEVEL="loud"', KFT_LOG_LEVEL="loud")
# A malformed launcher environment is a usage error too, through the same line.
usage_error("kft-info", [KFT_INFO], 'RANK="abc"', RANK="abc", WORLD_SIZE="2")
if KFT_TRACE:
    usage_error("kft-trace", [KFT_TRACE], "dir")
    usage_error("kft-trace", [KFT_TRACE, "/nonexistent/trace"], "/nonexistent/trace", "not a directory")
    usage_error("kft-trace", [KFT_TRACE, "/tmp"], 'KFT_LOG_LEVEL="loud"', KFT_LOG_LEVEL="loud")
if KFT_MANIFEST:
    job = ["--name", "demo", "--image", "reg/kft:1"]
    usage_error("kft-manifest", [KFT_MANIFEST, "trainjob", "--nodes", "abc", *job, "--", "./train"], "--nodes", "abc")
    usage_error("kft-manifest", [KFT_MANIFEST, "trainjob", "--nodes", "0", *job, "--", "./train"], '--nodes="0"')
    usage_error("kft-manifest", [KFT_MANIFEST, "trainjob", "--no-such-flag", *job], "--no-such-flag")
    usage_error("kft-manifest", [KFT_MANIFEST, "trainjob", *job, "-o"], "--output-file")
    usage_error("kft-manifest", [KFT_MANIFEST], "subcommand")
    usage_error("kft-manifest", [KFT_MANIFEST, "sbatch", *job, "--", "./t"], 'KFT_LOG_LEVEL="loud"', KFT_LOG_LEVEL="loud")
    # The runtime-only note is a WARN: shown by default and with -q, hidden by KFT_LOG_LEVEL=error;
    # the YAML on standard output is the same every time.
    note = [KFT_MANIFEST, "trainjob", *job, "--max-restarts", "2", "--", "./train"]
    p0 = run(note)
    expect(p0.returncode == 0 and p0.stderr.startswith("kft-manifest WARN: --max-restarts belong to the runtime")
           and well_formed(p0) and 'kind: "TrainJob"' in p0.stdout, "kft-manifest's note is a WARN line", p0)
    p = run(note[:2] + ["-q"] + note[2:])
    expect(p.returncode == 0 and "WARN: --max-restarts" in p.stderr and p.stdout == p0.stdout, "-q keeps warnings", p)
    p = run(note, KFT_LOG_LEVEL="error")
    expect(p.returncode == 0 and p.stderr == "" and p.stdout == p0.stdout, "KFT_LOG_LEVEL=error hides the note", p)

# kftrun: -v shows the agent's DEBUG lines and passes KFT_LOG_LEVEL=debug to the workers; -q and
# KFT_LOG_LEVEL=warn hide them; the workers' output is relayed as before.
show = ["--nproc-per-node", "2", "--", "sh", "-c", 'echo "level=$KFT_LOG_LEVEL"']
p = run([KFTRUN, "-v", *show])
expect(p.returncode == 0 and re.search(r"^kftrun\[node 0\] DEBUG: round 0: started ranks 0-1 of 2", p.stderr, re.M)
       and well_formed(p) and sorted(p.stdout.splitlines()) == ["[0]: level=debug", "[1]: level=debug"],
       "kftrun -v: DEBUG lines, and the workers see KFT_LOG_LEVEL=debug", p)
p = run([KFTRUN, *show], KFT_LOG_LEVEL="debug")
expect(p.returncode == 0 and "DEBUG: round 0: started ranks" in p.stderr and well_formed(p),
       "KFT_LOG_LEVEL=debug alone does the same", p)
p = run([KFTRUN, "-q", *show], KFT_LOG_LEVEL="debug")
expect(p.returncode == 0 and p.stderr == "" and p.stdout.count("level=warn") == 2,
       "kftrun -q overrides KFT_LOG_LEVEL: no DEBUG lines, the workers see warn", p)
p = run([KFTRUN, *show])
expect(p.returncode == 0 and "DEBUG" not in p.stderr and p.stdout.count("level=\n") == 2,
       "by default (info) no DEBUG lines, and the workers' KFT_LOG_LEVEL stays unset", p)
# A failing worker: the job's end is an ERROR line of the agent; kftrun exits 1 (worker failed).
p = run([KFTRUN, "--nproc-per-node", "1", "--", "sh", "-c", "exit 3"])
expect(p.returncode == 1 and re.search(r"^kftrun\[node 0\] ERROR: rank 0 .*exited with status 3$", p.stderr, re.M)
       and well_formed(p), "a failed job ends with one ERROR line of the agent", p)

print(f"tool_conventions: {procs.checks - procs.failures} passed, {procs.failures} failed")
sys.exit(1 if procs.failures else 0)

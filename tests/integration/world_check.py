#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Run a launcher that starts `kft-info --json` on every rank, and check that the ranks
form one consistent world.

    world_check.py --ranks 3 --nodes 1 --backend mpi -- mpirun -np 3 kft-info --json
    world_check.py --ranks 4 --nodes 2 --cmd "torchrun ... --node_rank 0 ..." --cmd "... --node_rank 1 ..."

Checks: the launcher(s) exit 0 within the timeout; exactly --ranks JSON lines; every rank
0..N-1 exactly once; every rank agrees on world_size; the deciding backend is --backend;
the local and node views add up (each node's local ranks are 0..local_size-1 exactly once,
the node indices are 0..node_count-1, the local sizes sum to the world size). "{out}" in a
command is replaced by a fresh directory whose files are read too: srun forwards remote
output in 1 KiB pieces that interleave between nodes, so srun tests write one file per task
(`srun --output={out}/task-%t.json`). Exit 77
(CTest "skipped") with a reason when a launcher is not installed.
"""
import argparse
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def fail(msg):
    print(f"world_check: FAIL: {msg}", file=sys.stderr)
    sys.exit(1)


def run_all(commands, timeout):
    procs = []
    for cmd in commands:
        exe = cmd[0]
        if shutil.which(exe) is None and not os.path.exists(exe):
            print(f"world_check: SKIP: launcher {exe!r} is not installed", file=sys.stderr)
            sys.exit(77)
        print("world_check: running:", " ".join(shlex.quote(c) for c in cmd), flush=True)
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                      start_new_session=True))
    deadline = time.monotonic() + timeout
    results = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:  # the whole process group: launcher and its ranks
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, err = p.communicate()
            sys.stderr.write(err)
            fail(f"launcher did not finish within {timeout} s")
        results.append((p.returncode, out, err))
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, required=True)
    ap.add_argument("--nodes", type=int, help="expected node_count (default: only check consistency)")
    ap.add_argument("--backend", help="expected deciding backend on every rank")
    ap.add_argument("--source", help="regex the deciding backend's source must match")
    ap.add_argument("--note", action="append", default=[],
                    help="RANKS:REGEX, e.g. '1-2:slurm.*says rank 0': those ranks must have a matching note")
    ap.add_argument("--layout", help="expected kft-info topology layout on every rank, e.g. '2 nodes x 2 ranks'")
    ap.add_argument("--via", action="append", default=[],
                    help="RANKS:REGEX, e.g. '2-3:relay': how those ranks reached the store (kft-info's topology 'via')")
    ap.add_argument("--timeout", type=float, default=60)
    ap.add_argument("--cmd", action="append", default=[], help="a launcher command line (may repeat: run together)")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    commands = [shlex.split(c) for c in a.cmd]
    if a.command:
        commands.append(a.command[1:] if a.command[0] == "--" else a.command)
    if not commands:
        ap.error("no command")
    out_dir = tempfile.mkdtemp(prefix="kft-world-")
    commands = [[arg.replace("{out}", out_dir) for arg in cmd] for cmd in commands]

    texts = []
    for rc, out, err in run_all(commands, a.timeout):
        if rc != 0:
            sys.stderr.write(out + err)
            fail(f"launcher exited with {rc}")
        texts.append(out)
    for name in sorted(os.listdir(out_dir)):
        with open(os.path.join(out_dir, name)) as f:
            texts.append(f.read())
    shutil.rmtree(out_dir)

    worlds, layouts, vias = [], [], {}
    for text in texts:
        for line in text.splitlines():
            line = line.strip()
            m = re.search(r"\{.*\}$", line)  # tolerate launcher prefixes such as "[0]: "
            if not m:
                continue
            try:
                doc = json.loads(m.group(0))
            except json.JSONDecodeError as e:
                fail(f"unparsable JSON line ({e}): {line[:200]}")
            worlds.append(doc["world"])
            topo = doc.get("host", {}).get("topology", {})
            layouts.append((doc["world"]["rank"], topo.get("layout", topo.get("error", "no topology"))))
            vias[doc["world"]["rank"]] = topo.get("via", "")

    n = a.ranks
    print(f"{'rank':>4} {'size':>4} {'local':>7} {'node':>7}  backend / host")
    for w in sorted(worlds, key=lambda w: w["rank"]):
        print(f"{w['rank']:>4} {w['world_size']:>4} {w['local_rank']!s:>3}/{w['local_size']!s:<3} "
              f"{w['node_rank']!s:>3}/{w['node_count']!s:<3}  {w['backend']} ({w['source']}) on "
              f"{w['hostname']}{' as ' + w['node_name'] if w.get('node_name') else ''}")
    if len(worlds) != n:
        fail(f"expected {n} ranks to report, got {len(worlds)}")
    ranks = sorted(w["rank"] for w in worlds)
    if ranks != list(range(n)):
        fail(f"ranks are not 0..{n - 1} exactly once: {ranks}")
    for w in worlds:
        if w["world_size"] != n:
            fail(f"rank {w['rank']} says world_size {w['world_size']}, expected {n}")
        if a.backend and w["backend"] != a.backend:
            fail(f"rank {w['rank']} was decided by {w['backend']}, expected {a.backend}")
        if a.source and not re.search(a.source, w["source"]):
            fail(f"rank {w['rank']} source {w['source']!r} does not match {a.source!r}")
        for key in ("local_rank", "local_size", "node_rank", "node_count"):
            if w[key] is None:
                fail(f"rank {w['rank']} does not know its {key}")

    if a.layout is not None:
        for rank, got in layouts:
            if got != a.layout:
                fail(f"rank {rank} sees topology {got!r}, expected {a.layout!r}")

    for spec in a.via:  # "2-3:regex": those ranks match, the others do not
        span, _, pattern = spec.partition(":")
        lo, _, hi = span.partition("-")
        chosen = set(range(int(lo), int(hi or lo) + 1))
        for rank, via in sorted(vias.items()):
            if bool(re.search(pattern, via)) != (rank in chosen):
                fail(f"rank {rank} reached the store via {via!r}: expected {'a' if rank in chosen else 'no'} "
                     f"match of {pattern!r} (ranks {span})")

    counts = {w["node_count"] for w in worlds}
    if len(counts) != 1:
        fail(f"ranks disagree on node_count: {sorted(counts)}")
    node_count = counts.pop()
    if a.nodes is not None and node_count != a.nodes:
        fail(f"node_count is {node_count}, expected {a.nodes}")
    by_node = {}
    for w in worlds:
        by_node.setdefault(w["node_rank"], []).append(w)
    if sorted(by_node) != list(range(node_count)):
        fail(f"node indices {sorted(by_node)} are not 0..{node_count - 1}")
    total = 0
    for node, members in sorted(by_node.items()):
        sizes = {m["local_size"] for m in members}
        if len(sizes) != 1:
            fail(f"node {node}: ranks disagree on local_size: {sorted(sizes)}")
        size = sizes.pop()
        locals_ = sorted(m["local_rank"] for m in members)
        if locals_ != list(range(size)):
            fail(f"node {node}: local ranks {locals_} are not 0..{size - 1} exactly once")
        names = {m.get("node_name") for m in members}
        if len(names) != 1:
            fail(f"node {node}: ranks disagree on the node's name: {sorted(map(str, names))}")
        total += size
    if total != n:
        fail(f"local sizes add up to {total}, expected {n}")

    for spec in a.note:
        which, _, pattern = spec.partition(":")
        lo, _, hi = which.partition("-")
        for w in worlds:
            if int(lo) <= w["rank"] <= int(hi or lo):
                if not any(re.search(pattern, note) for note in w["notes"]):
                    fail(f"rank {w['rank']} has no note matching {pattern!r}: {w['notes']}")
    print(f"world_check: OK: {n} ranks on {node_count} node(s), one consistent world")


if __name__ == "__main__":
    main()

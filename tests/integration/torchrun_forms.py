#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A kft program under each of torchrun's forms, as users start it (Debian's torch 1.13).

    torchrun_forms.py TORCHRUN FORM --expect REGEX [--expect REGEX ...] -- PROGRAM [ARGS...]

FORM:
  static_1node    torchrun --nproc_per_node 2 --master_port P PROGRAM  (static rendezvous, agent store)
  static_2agents  two agents, --nnodes 2 --node_rank i --master_addr/--master_port
  standalone      torchrun --standalone --nproc_per_node 3              (c10d on localhost)
  c10d_2agents    two agents, --rdzv_backend c10d --rdzv_endpoint ...  (KFT_RDZV_TOKEN set)
  c10d_no_token   the same without KFT_RDZV_TOKEN: must fail, naming the variable
  elastic         --nnodes 1:2 --rdzv_backend c10d, one agent

Single-host forms run with no KFT_RDZV_TOKEN in the environment (none is needed). Each run
gets a private XDG_RUNTIME_DIR, which must hold no token file afterwards. Every --expect
regex must match the agents' combined output. Exit 77 when torchrun is missing.
"""
import argparse
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("torchrun")
    ap.add_argument("form")
    ap.add_argument("--expect", action="append", default=[])
    ap.add_argument("--timeout", type=float, default=90)
    argv = sys.argv[1:]
    if "--" not in argv:
        ap.error("give the program after --")
    cut = argv.index("--")
    a = ap.parse_args(argv[:cut])
    prog = argv[cut + 1:]
    if shutil.which(a.torchrun) is None and not os.path.exists(a.torchrun):
        print(f"skip: {a.torchrun} is not installed (python3-torch)")
        return 77
    base = [a.torchrun, "--no_python", "--redirects", "9:0", "--tee", "9:0", "--monitor_interval", "0.2"]
    runtime = tempfile.mkdtemp(prefix="kft-xdg-")
    os.chmod(runtime, 0o700)
    env = {k: v for k, v in os.environ.items() if k != "KFT_RDZV_TOKEN"}
    env["XDG_RUNTIME_DIR"] = runtime
    port = free_port()
    expect_fail = False
    if a.form == "static_1node":
        cmds = [base + ["--nproc_per_node", "2", "--master_port", str(port)] + prog]
    elif a.form == "static_2agents":
        cmds = [base + ["--nnodes", "2", "--node_rank", str(i), "--master_addr", "127.0.0.1", "--master_port",
                        str(port), "--nproc_per_node", "2"] + prog for i in (0, 1)]
    elif a.form == "standalone":
        cmds = [base + ["--standalone", "--nproc_per_node", "3"] + prog]
    elif a.form in ("c10d_2agents", "c10d_no_token"):
        cmds = [base + ["--nnodes", "2", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                        "--rdzv_id", f"forms-{port}", "--nproc_per_node", "2"] + prog for _ in (0, 1)]
        if a.form == "c10d_2agents":
            env["KFT_RDZV_TOKEN"] = "torchrun-forms-" + str(port)
        else:
            expect_fail = True
    elif a.form == "elastic":
        # last_call_timeout: how long the first agent waits for more before starting with MIN (30 s)
        cmds = [base + ["--nnodes", "1:2", "--rdzv_backend", "c10d", "--rdzv_endpoint", f"127.0.0.1:{port}",
                        "--rdzv_id", f"elastic-{port}", "--rdzv_conf", "last_call_timeout=1", "--nproc_per_node", "2"]
                + prog]
    else:
        ap.error(f"unknown form {a.form}")

    procs = []
    for cmd in cmds:
        print("running:", " ".join(cmd), flush=True)
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
        time.sleep(0.2)
    deadline = time.monotonic() + a.timeout
    output, codes = "", []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                try:
                    os.killpg(q.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            out, _ = p.communicate()
            print(out)
            print(f"FAIL: {a.form} did not finish within {a.timeout} s")
            return 1
        output += out
        codes.append(p.returncode)
    # torchrun's banner about OMP_NUM_THREADS is noise here.
    shown = "\n".join(l for l in output.splitlines() if "OMP_NUM_THREADS" not in l and not l.startswith("*****"))
    print(shown)
    problems = []
    if expect_fail and all(c == 0 for c in codes):
        problems.append(f"expected the agents to fail, they exited {codes}")
    if not expect_fail and any(c != 0 for c in codes):
        problems.append(f"agents exited {codes}")
    for rx in a.expect:
        if not re.search(rx, output, re.S):
            problems.append(f"no match for {rx!r}")
    left = []
    for root, _, names in os.walk(runtime):
        left += [os.path.join(root, n) for n in names]
    if left:
        problems.append(f"token files left behind: {left}")
    shutil.rmtree(runtime, ignore_errors=True)
    for p in problems:
        print("FAIL:", p)
    print(f"torchrun_forms {a.form}: {'OK' if not problems else 'FAILED'}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

# SPDX-License-Identifier: Apache-2.0
"""kft-trace on real hangs (issue 47 item 4): 4 ranks of trace_hang_worker under a launcher, with
the flight recorder writing to a fresh KFT_TRACE_DIR; one rank misbehaves at its 10th call. Then
`kft-trace --json <dir>` must name that rank, and only it:

  stop  rank 2 stops itself (SIGSTOP): the others wait for it to their 3 s deadline and dump;
        it writes nothing. kft-trace: stuck in allreduce #10, ranks 0, 1, 3 inside, every
        one's wait leads to rank 2, culprit rank 2 (no dump).
  skip  rank 1 skips its 10th allreduce, so its barrier (#20) meets the others' allreduce #20.
        kft-trace: the first divergent call is #20, culprit rank 1.
  size  rank 3's 10th allreduce has 1023 floats where the others' have 1024. kft-trace: the
        first divergent call is #10 with two counts, culprit rank 3.

    trace_hang_test.py <trace_hang_worker> <kftrun> <kft-trace> <kftrun|mpirun> [mpirun executable]

A launcher that cannot run here (no mpirun) exits 77 (skipped). Also checked: the job ends (no
process of it left), and kft-trace refuses a directory with no dump and a file that is not one,
naming it, with exit 2.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import expect, marked_processes  # noqa: E402

worker, kftrun, kft_trace, launcher = sys.argv[1:5]
mpirun = sys.argv[5] if len(sys.argv) > 5 else "mpirun"
if launcher == "mpirun" and not shutil.which(mpirun):
    print(f"skip: {mpirun} is not installed")
    sys.exit(77)

CASES = {"stop": 2, "skip": 1, "size": 3}


def run_case(mode, victim, trace_dir):
    env = dict(os.environ, KFT_TRACE_DIR=trace_dir, KFT_RUN_ID=f"trace-{mode}-{os.getpid()}")
    if launcher == "kftrun":
        cmd = [kftrun, "--nproc-per-node", "4", "--", worker, mode, str(victim)]
    else:
        cmd = [mpirun, "-np", "4", "--oversubscribe", "-x", "KFT_TRACE_DIR", "-x", "KFT_RUN_ID", worker, mode, str(victim)]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    if mode == "stop":
        # The others dump at their 3 s deadline; the stopped rank never does. Once the three
        # dumps are there, the stopped rank is killed, as an operator would after reading them
        # (kftrun and mpirun end the job when the others exit, but a stopped process keeps a
        # SIGTERM pending until it runs again).
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len([f for f in os.listdir(trace_dir) if f.startswith("rank")]) < 3:
            time.sleep(0.2)
        for line in marked_processes(worker, skip=("trace_hang_test.py",)):
            pid = int(line.split(":")[0])
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                        os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    try:
        out, err = p.communicate(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, err = p.communicate()
    took = time.monotonic() - t0
    result = subprocess.CompletedProcess(cmd, p.returncode, out, err)
    expect(p.returncode != 0, f"{launcher} {mode}: the job failed ({took:.1f} s)", result)
    expect(not marked_processes(worker, skip=("trace_hang_test.py",)), f"{launcher} {mode}: no worker process is left", marked_processes(worker, skip=("trace_hang_test.py",)))
    return result


failures = []
for mode, victim in CASES.items():
    trace_dir = tempfile.mkdtemp(prefix=f"kft-trace-{mode}-")
    try:
        job = run_case(mode, victim, trace_dir)
        dumps = sorted(f for f in os.listdir(trace_dir) if f.startswith("rank"))
        t = subprocess.run([kft_trace, "--json", trace_dir], capture_output=True, text=True, timeout=60)
        expect(t.returncode == 0, f"{launcher} {mode}: kft-trace read {len(dumps)} dump(s)", t, job)
        report = json.loads(t.stdout)
        text = subprocess.run([kft_trace, trace_dir], capture_output=True, text=True, timeout=60).stdout
        print(text, end="", flush=True)
        culprits = [c["rank"] for c in report["culprits"]]
        expect(culprits == [victim], f"{launcher} {mode}: kft-trace names rank {victim} and no other ({culprits})",
               text, job)
        groups = report["groups"]
        expect(len(groups) == 1, f"{launcher} {mode}: one group recorded", text)
        g = groups[0]
        if mode == "stop":
            expect(report["no_dump"] == [victim], f"stop: rank {victim} alone wrote no dump ({report['no_dump']})", text)
            stuck = g["stuck"]
            expect(stuck is not None and stuck["seq"] == 10 and stuck["op"] == "allreduce",
                   "stop: the job is stuck in allreduce #10", text)
            inside = sorted(i["rank"] for i in stuck["inside"])
            expect(inside == [r for r in range(4) if r != victim], f"stop: the other ranks were inside it ({inside})", text)
            ends = sorted({c[-1] for c in report["chains"]})
            expect(ends == [victim], f"stop: every chain of waits ends at rank {victim} ({report['chains']})", text)
            expect(g["divergence"] is None, "stop: no call diverged", text)
        else:
            d = g["divergence"]
            want_seq = 20 if mode == "skip" else 10
            expect(d is not None and d["seq"] == want_seq, f"{mode}: the first divergent call is #{want_seq}", text)
            odd = [c for c in d["calls"] if victim in c["ranks"]]
            expect(len(odd) == 1 and odd[0]["ranks"] == [victim], f"{mode}: rank {victim} alone made the odd call", text)
            if mode == "skip":
                expect(odd[0]["op"] == "barrier", "skip: its odd call is the barrier", text)
            else:
                expect(odd[0]["count"] == 1023, "size: its odd call has 1023 elements", text)
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)

# Bad input: named, exit 2.
empty = tempfile.mkdtemp(prefix="kft-trace-empty-")
try:
    t = subprocess.run([kft_trace, empty], capture_output=True, text=True, timeout=30)
    expect(t.returncode == 2 and "no flight-recorder dumps" in t.stderr and empty in t.stderr,
           "kft-trace refuses a directory with no dump, naming it (exit 2)", t)
    with open(os.path.join(empty, "rank0.jsonl"), "w") as f:
        f.write('{"kft_trace":1,"rank":0,"world_size":2,"why":"x","now_ns":1}\n{"group":"g","op":\n')
    t = subprocess.run([kft_trace, empty], capture_output=True, text=True, timeout=30)
    expect(t.returncode == 2 and "rank0.jsonl:2: not JSON" in t.stderr,
           "kft-trace refuses a broken dump, naming its file and line (exit 2)", t)
finally:
    shutil.rmtree(empty, ignore_errors=True)
print(f"PASS: kft-trace named the culprit of every hang under {launcher}")

# SPDX-License-Identifier: Apache-2.0
"""kftrun's live status (issue 47 item 6), with real workers (status_worker: a step counter and an
allreduce every 20 ms):

  signal   one node, 4 ranks; rank 3 is stopped (SIGSTOP), then kftrun gets SIGUSR1: it prints one
           JSON line with every rank: 0-2 running, each with its step and newest collective
           (allreduce, its sequence number, its age), rank 3 "stopped". A second SIGUSR1 shows
           the running ranks' steps unchanged (they wait for rank 3) and their call's age grown.
  command  two agents on this machine (--nnodes 2, a token), 2 ranks each: `kftrun status`
           against the store prints all 4 ranks from both nodes and exits 0; a wrong run id
           exits 1 naming it; no token exits 2 naming KFT_RDZV_TOKEN.

Also: nothing is left in TMPDIR (the workers' status sockets are abstract: no file).

    live_status_test.py <kftrun> <status_worker>
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from procs import expect, free_port, marked_processes  # noqa: E402

kftrun, worker = sys.argv[1:3]
tmp = tempfile.mkdtemp(prefix="kft-status-")
env = dict(os.environ, TMPDIR=tmp)  # (nothing of the live status may land here: checked at the end)


class reader:
    """Collects a process's standard output lines on a thread."""

    def __init__(self, p):
        self.lines, self.p = [], p
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        for line in self.p.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pred, timeout):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [l for l in self.lines if pred(l)]
            if found:
                return found
            time.sleep(0.02)
        return []


def status_lines(r):
    return [l for l in r.lines if l.startswith('{"kftrun_status"')]


def ask(p, r, before):
    """SIGUSR1 to kftrun; its next status line (and the seconds it took to come)."""
    t0 = time.monotonic()
    p.send_signal(signal.SIGUSR1)
    end = time.monotonic() + 10
    while time.monotonic() < end and len(status_lines(r)) <= before:
        time.sleep(0.01)
    took = time.monotonic() - t0
    lines = status_lines(r)
    expect(len(lines) > before, "kftrun printed a status line after SIGUSR1", "\n".join(r.lines[-20:]))
    return json.loads(lines[before]), took


def stop(p, r):
    for line in marked_processes(worker, skip=("live_status_test.py",)):
        os.kill(int(line.split(":")[0]), signal.SIGCONT)
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


# -- one node, a signal ------------------------------------------------------------------------
pids = tempfile.mkdtemp(dir=tmp)
p = subprocess.Popen([kftrun, "--nproc-per-node", "4", "--", worker, pids, "60"], env=env, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT, text=True)
r = reader(p)
end = time.monotonic() + 60
while time.monotonic() < end and len([l for l in r.lines if "ready rank" in l]) < 4:
    time.sleep(0.05)
expect(len([l for l in r.lines if "ready rank" in l]) == 4, "4 ranks are ready", "\n".join(r.lines[-20:]))
time.sleep(0.5)  # a few steps in
with open(os.path.join(pids, "pid.3")) as f:
    os.kill(int(f.read()), signal.SIGSTOP)
time.sleep(0.3)
s1, took1 = ask(p, r, 0)
print(json.dumps(s1)[:1500], flush=True)
ranks = {x["rank"]: x for x in s1["ranks"]}
expect(sorted(ranks) == [0, 1, 2, 3], f"the status has ranks 0-3 ({sorted(ranks)})", s1)
expect(ranks[3]["state"] == "stopped", f"rank 3 is shown stopped ({ranks[3]['state']})", s1)
for k in (0, 1, 2):
    x = ranks[k]
    call = x["calls"][0] if x["calls"] else {}
    expect(x["state"] == "running" and x["step"] >= 1 and call.get("op") == "allreduce" and call.get("seq", 0) >= 2
           and call.get("group_id") == "job" and x["age_s"] >= 0 and x["pid"] > 0 and x["node"] == 0,
           f"rank {k}: running at step {x['step']}, newest call {call.get('op')} #{call.get('seq')}, "
           f"{call.get('state')}, age {x.get('age_s')} s", x)
time.sleep(1.0)
s2, took2 = ask(p, r, 1)
ranks2 = {x["rank"]: x for x in s2["ranks"]}
for k in (0, 1, 2):
    a, b = ranks[k], ranks2[k]
    expect(b["step"] == a["step"] and b["calls"][0]["seq"] == a["calls"][0]["seq"] and b["calls"][0]["state"] == "running"
           and b["age_s"] >= a["age_s"] + 0.8,
           f"rank {k} waits for the stopped rank: step {b['step']} unchanged, its allreduce #{b['calls'][0]['seq']} "
           f"running for {b['age_s']:.2f} s (was {a['age_s']:.2f} s)", a, b)
print(f"status of 4 ranks on one node: {took1 * 1000:.0f} ms and {took2 * 1000:.0f} ms from SIGUSR1 to the line "
      f"(kftrun says {s1['took_s'] * 1000:.0f} ms, {s2['took_s'] * 1000:.0f} ms)", flush=True)
stop(p, r)

# -- two agents, `kftrun status` against the store --------------------------------------------
port = free_port()
token = f"status-{os.getpid()}"
run = f"status{os.getpid()}"
agents, readers = [], []
for node in (0, 1):
    a = subprocess.Popen([kftrun, "--nnodes", "2", "--node-rank", str(node), "--master-addr", "127.0.0.1",
                          "--master-port", str(port), "--run-id", run, "--nproc-per-node", "2", "--",
                          worker, pids, "60"],
                         env=dict(env, KFT_RDZV_TOKEN=token, KFT_HOST_ID=f"h{node}"), stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    agents.append(a)
    readers.append(reader(a))
end = time.monotonic() + 90
while time.monotonic() < end and sum(len([l for l in x.lines if "ready rank" in l]) for x in readers) < 4:
    time.sleep(0.05)
expect(sum(len([l for l in x.lines if "ready rank" in l]) for x in readers) == 4, "2 nodes x 2 ranks are ready",
       "\n".join(readers[0].lines[-10:] + readers[1].lines[-10:]))
time.sleep(0.5)
args = [kftrun, "status", "--master-addr", "127.0.0.1", "--master-port", str(port), "--run-id", run]
t0 = time.monotonic()
c = subprocess.run(args, env=dict(env, KFT_RDZV_TOKEN=token), capture_output=True, text=True, timeout=60)
took = time.monotonic() - t0
expect(c.returncode == 0, f"kftrun status exits 0 ({took * 1000:.0f} ms)", c)
st = json.loads(c.stdout)
got = sorted((x["rank"], x["node"], x["state"]) for x in st["ranks"])
expect(got == [(0, 0, "running"), (1, 0, "running"), (2, 1, "running"), (3, 1, "running")] and st["nodes_missing"] == [],
       f"kftrun status shows the 4 ranks of both nodes, running ({got})", c)
expect(all(x["step"] >= 1 and x["calls"] and x["calls"][0]["op"] == "allreduce" for x in st["ranks"]),
       "each with its step and newest allreduce", c)
# Node 1's agent, signalled, gathers the whole job too.
s3, _ = ask(agents[1], readers[1], 0)
expect(sorted(x["rank"] for x in s3["ranks"]) == [0, 1, 2, 3], "node 1's agent, on SIGUSR1, shows the 4 ranks", s3)
bad = subprocess.run(args[:-1] + ["no-such-run"], env=dict(env, KFT_RDZV_TOKEN=token), capture_output=True,
                     text=True, timeout=60)
expect(bad.returncode == 1 and 'no agent of run "no-such-run"' in bad.stderr, "a wrong run id exits 1, naming it", bad)
nok = subprocess.run(args, env={k: v for k, v in env.items() if k != "KFT_RDZV_TOKEN"}, capture_output=True,
                     text=True, timeout=60)
expect(nok.returncode == 2 and "KFT_RDZV_TOKEN" in nok.stderr, "no token exits 2, naming KFT_RDZV_TOKEN", nok)
for a, x in zip(agents, readers):
    stop(a, x)

left = [f for f in os.listdir(tmp) if f.startswith("kftrun-")]
expect(not left, f"the live status left no file in TMPDIR ({left})")
expect(not marked_processes(worker, skip=("live_status_test.py",)), "no worker is left")
shutil.rmtree(tmp, ignore_errors=True)
print("PASS: kftrun's live status")

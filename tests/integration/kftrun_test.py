#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kftrun, run for real: real processes, real sockets on loopback, real signals.

    kftrun_test.py KFTRUN KFT_INFO SCENARIO

Each scenario asserts what a user would check by hand: exit status (kftrun's failure classes,
tools/kftrun/exit_codes.hpp: EXIT below), the message, how long it took. After every scenario, whatever its path: no process of it is left (agents included),
nothing new in /dev/shm, nothing listening on a port it used, and nothing in the TMPDIR /
XDG_RUNTIME_DIR its jobs ran with (a private directory per scenario).
"""
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time

import procs
from procs import expect, files_under, kft_shm, listening, marked_processes

KFTRUN, KFT_INFO, SCENARIO = sys.argv[1], sys.argv[2], sys.argv[3]
MARK = str(random.randint(10**8, 10**9))  # unique argument to find this test's processes


PRIVATE = tempfile.mkdtemp(prefix="kftrun-test-tmp-")  # every job's TMPDIR and XDG_RUNTIME_DIR
PORTS = []  # every port a scenario gave a job: nothing may listen on one afterwards


def exit_classes():
    """kftrun's exit statuses, read from tools/kftrun/exit_codes.hpp (so a drift fails here)."""
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "..", "..", "tools", "kftrun", "exit_codes.hpp")) as f:
        text = f.read()
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"inline constexpr int (\w+) = (\d+);", text)}


EXIT = exit_classes()


def free_port():
    port = procs.free_port()
    PORTS.append(port)
    return port


def env(**extra):
    e = {k: v for k, v in os.environ.items() if not k.startswith(("PET_", "KFT_", "RANK", "WORLD_SIZE", "TORCHELASTIC"))}
    e["TMPDIR"] = e["XDG_RUNTIME_DIR"] = PRIVATE
    e.update({k: str(v) for k, v in extra.items()})
    return e


def start(args, **extra):
    return subprocess.Popen([KFTRUN, *args], env=env(**extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def run(args, timeout=60, **extra):
    t0 = time.monotonic()
    p = subprocess.run([KFTRUN, *args], env=env(**extra), capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


def leftovers():
    """Processes (other than kftrun agents) whose command line carries MARK."""
    return marked_processes(MARK, skip=("kftrun",))


def no_leftovers(wait=2.0):
    deadline = time.monotonic() + wait
    while leftovers() and time.monotonic() < deadline:
        time.sleep(0.05)
    left = leftovers()
    expect(not left, "no worker process is left behind", *left)


def wait_for_workers(count, timeout=20):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(leftovers()) >= count:
            return
        time.sleep(0.05)
    expect(False, f"{count} workers started", *leftovers())


def two_agents(flags, program):
    """Starts node 0 and node 1 agents of a 2-node job on loopback, sharing a token."""
    port = free_port()
    token = dict(KFT_RDZV_TOKEN="t" + MARK)
    common = ["--nnodes", "2", "--master-port", str(port), *flags]
    return [start([*common, "--node-rank", str(n), "--", *program], **token) for n in (0, 1)]


def agents_of(nodes, flags, program):
    """Starts the agents of an n-node job on loopback, sharing a token."""
    port = free_port()
    token = dict(KFT_RDZV_TOKEN="t" + MARK)
    common = ["--nnodes", str(nodes), "--master-port", str(port), *flags]
    return [start([*common, "--node-rank", str(n), "--", *program], **token) for n in range(nodes)]


def kill_one(agents, victim, survivor):
    """Kills agent `victim` once all 4 workers run; returns (survivor's stderr, seconds to its exit)."""
    wait_for_workers(4)
    agents[victim].kill()
    t0 = time.monotonic()
    _, err = agents[survivor].communicate(timeout=30)
    agents[victim].wait()
    return err, time.monotonic() - t0


# ---- scenarios ------------------------------------------------------------------------------

def torch_style_worker():
    script = ("echo RANK=$RANK LOCAL_RANK=$LOCAL_RANK WORLD_SIZE=$WORLD_SIZE LOCAL_WORLD_SIZE=$LOCAL_WORLD_SIZE "
              "GROUP_RANK=$GROUP_RANK ROLE_RANK=$ROLE_RANK MASTER_ADDR=$MASTER_ADDR MASTER_PORT=$MASTER_PORT "
              "RUN=$TORCHELASTIC_RUN_ID RESTART=$TORCHELASTIC_RESTART_COUNT MAX=$TORCHELASTIC_MAX_RESTARTS "
              "OMP=$OMP_NUM_THREADS STORE=$KFT_STORE_ADDR:$KFT_STORE_PORT")
    p, _ = run(["--nproc-per-node", "2", "--run-id", "job7", "--max-restarts", "2", "--", "sh", "-c", script])
    expect(p.returncode == 0, "an unmodified torchrun-style worker runs to completion", p.stdout, p.stderr)
    lines = sorted(l for l in p.stdout.splitlines() if "RANK=" in l)
    expect(len(lines) == 2, "both workers printed one line, prefixed by their rank", p.stdout)
    for r, line in enumerate(lines):
        expect(line.startswith(f"[{r}]: RANK={r} LOCAL_RANK={r} WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 "
                               f"ROLE_RANK={r} MASTER_ADDR=127.0.0.1 MASTER_PORT="), f"rank {r}'s torchrun variables", line)
        expect("RUN=job7 RESTART=0 MAX=2 OMP=1 STORE=127.0.0.1:" in line, f"rank {r}'s run id, restarts and store", line)
        port = int(line.split("MASTER_PORT=")[1].split()[0])
        store = int(line.split("STORE=127.0.0.1:")[1].split()[0])
        expect(port != store, "workers' MASTER_PORT is free for their own use, not the kft store's port", line)


def worker_fails():
    p, took = run(["--nproc-per-node", "3", "--", "sh", "-c",
                   f'if [ "$RANK" = 1 ]; then sleep 0.2; exit 3; fi; exec sleep {MARK}'])
    expect(p.returncode == EXIT["worker_failed"], "kftrun exits 1 (worker failed), whatever the worker's status",
           p.returncode, p.stderr)
    expect(took < 8, f"the job ends within seconds ({took:.2f} s)")
    expect("rank 1 (local rank 1, node 0) on " in p.stderr and "exited with status 3" in p.stderr,
           "the message names the rank, host and exit reason", p.stderr)
    expect(re.search(r"^kftrun\[node 0\] ERROR: rank 1 \(local rank 1, node 0\) on .* exited with status 3$", p.stderr, re.M),
           "the job's end is one ERROR line of the agent (docs/launching.md)", p.stderr)
    no_leftovers()


def worker_killed_by_signal():
    p, _ = run(["--nproc-per-node", "2", "--", "sh", "-c",
                f'if [ "$RANK" = 0 ]; then kill -SEGV $$; fi; exec sleep {MARK}'])
    expect(p.returncode == EXIT["worker_failed"], "a worker that crashed (SIGSEGV) gives 1 (worker failed)",
           p.returncode, p.stderr)
    expect("was killed by signal 11 (SIGSEGV)" in p.stderr, "the message names the signal", p.stderr)
    no_leftovers()


def restart_once():
    p, _ = run(["--nproc-per-node", "2", "--max-restarts", "1", "--", "sh", "-c",
                'echo "restart=$TORCHELASTIC_RESTART_COUNT rank=$RANK"; '
                'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 4; fi; sleep 0.2'])
    expect(p.returncode == 0, "a worker that fails only on its first attempt leads to success", p.stdout, p.stderr)
    expect("restart=1 rank=0" in p.stdout and "restart=1 rank=1" in p.stdout,
           "every worker of the second attempt sees TORCHELASTIC_RESTART_COUNT=1", p.stdout)
    expect("restarting all workers (restart 1 of 1)" in p.stderr, "the restart is announced with its cause", p.stderr)
    expect(re.search(r"^kftrun\[node 0\] WARN: restarting all workers \(restart 1 of 1\) after: ", p.stderr, re.M),
           "the restart is a WARN line of the agent", p.stderr)
    p, _ = run(["-q", "--nproc-per-node", "2", "--max-restarts", "1", "--", "sh", "-c",
                'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 1 ]; then exit 4; fi; '
                'echo "level=$KFT_LOG_LEVEL restart=$TORCHELASTIC_RESTART_COUNT"'])
    expect(p.returncode == 0 and "WARN: restarting all workers" in p.stderr and
           p.stdout.count("level=warn restart=1") == 2,
           "-q keeps warnings, and the workers inherit KFT_LOG_LEVEL=warn", p.stdout, p.stderr)


def restarts_exhausted():
    p, _ = run(["--nproc-per-node", "2", "--max-restarts", "2", "--", "sh", "-c",
                'echo "attempt $TORCHELASTIC_RESTART_COUNT"; [ "$RANK" = 0 ] && exit 9; exit 0'])
    expect(p.returncode == EXIT["worker_failed"], "after the last restart kftrun exits 1 (worker failed)", p.returncode)
    expect(p.stdout.count("[0]: attempt") == 3 and "[0]: attempt 2" in p.stdout, "exactly 1 + 2 attempts ran", p.stdout)


def two_agents_restart_together():
    cmd = ['sh', '-c', 'echo "node=$GROUP_RANK restart=$TORCHELASTIC_RESTART_COUNT"; '
                       'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ] && [ "$RANK" = 3 ]; then exit 6; fi; sleep 0.3']
    a0, a1 = two_agents(["--nproc-per-node", "2", "--max-restarts", "1"], cmd)
    o0, e0 = a0.communicate(timeout=60)
    o1, e1 = a1.communicate(timeout=60)
    expect(a0.returncode == 0 and a1.returncode == 0, "both agents succeed after one restart", e0, e1)
    expect("node=0 restart=1" in o0 and "node=1 restart=1" in o1, "both nodes' workers were restarted together", o0, o1)


def agent_killed():
    # Three nodes: kill -9 of node 1's agent; node 0 (the store's host) and node 2 both exit 4.
    agents = agents_of(3, ["--nproc-per-node", "1", "--heartbeat-timeout", "2"], ["sleep", MARK])
    wait_for_workers(3)
    agents[1].kill()
    t0 = time.monotonic()
    _, err = agents[0].communicate(timeout=30)
    took = time.monotonic() - t0
    _, err2 = agents[2].communicate(timeout=30)
    agents[1].wait()
    for n, e in ((0, err), (2, err2)):
        expect(agents[n].returncode == EXIT["node_lost"], f"surviving node {n} exits 4 (node lost)",
               agents[n].returncode, e)
    expect(took < 2, f"the closed connection is noticed before the heartbeat timeout ({took:.2f} s)", err)
    expect("the agent of node 1 on" in err and "is gone: its connection to the store closed" in err,
           "the message names the dead agent", err)
    no_leftovers()  # node 1's workers die with their agent (PDEATHSIG), the others' are stopped


def agent_stopped():
    # SIGSTOP of node 1's agent: alive (still connected) but silent, so node 0 exits 5 (hang).
    agents = two_agents(["--nproc-per-node", "1", "--heartbeat-timeout", "1"], ["sleep", MARK])
    wait_for_workers(2)
    agents[1].send_signal(signal.SIGSTOP)
    t0 = time.monotonic()
    _, err = agents[0].communicate(timeout=30)
    took = time.monotonic() - t0
    agents[1].send_signal(signal.SIGCONT)
    _, err1 = agents[1].communicate(timeout=30)
    expect(agents[0].returncode == EXIT["hang"], "node 0 exits 5 (hang)", agents[0].returncode, err)
    expect(0.5 < took < 4, f"after the heartbeat timeout ({took:.2f} s)", err)
    expect("the agent of node 1 on" in err and "but is still connected to the store" in err,
           "the message says the agent is silent, not gone", err)
    expect(agents[1].returncode == EXIT["node_lost"] and "lost the rendezvous store" in err1,
           "the stopped agent, resumed, finds node 0 gone (4)", agents[1].returncode, err1)
    no_leftovers()


def store_host_killed():
    agents = two_agents(["--nproc-per-node", "2"], ["sleep", MARK])
    err, took = kill_one(agents, victim=0, survivor=1)
    expect(agents[1].returncode == EXIT["node_lost"], "the other agent exits 4 (node lost)", agents[1].returncode, err)
    expect(took < 5, f"within seconds ({took:.2f} s)")
    expect("lost the rendezvous store" in err, "the message says the store (node 0's agent) is gone", err)
    no_leftovers()


def terminate(sig, code):
    a = start(["--nproc-per-node", "3", "--term-grace", "1", "--", "sh", "-c",
               f'trap "" TERM; sh -c "sleep {MARK}" & sleep {MARK}; wait'])
    wait_for_workers(6)
    a.send_signal(sig)
    t0 = time.monotonic()
    _, err = a.communicate(timeout=30)
    expect(a.returncode == code, f"kftrun exits with {code} after {signal.Signals(sig).name}", a.returncode, err)
    expect(time.monotonic() - t0 < 5, "workers that ignore SIGTERM are killed after the grace period")
    no_leftovers()


def sigterm():
    terminate(signal.SIGTERM, 143)


def sigint():
    terminate(signal.SIGINT, 130)


def wrong_token():
    port = free_port()
    common = ["--nnodes", "2", "--master-port", str(port), "--rdzv-timeout", "3"]
    a0 = start([*common, "--node-rank", "0", "--", "true"], KFT_RDZV_TOKEN="right" + MARK)
    time.sleep(0.3)
    p, _ = run([*common, "--node-rank", "1", "--", "true"], KFT_RDZV_TOKEN="wrong" + MARK)
    _, err0 = a0.communicate(timeout=30)
    expect(p.returncode == 2, "an agent with the wrong token is refused (exit 2)", p.returncode, p.stderr)
    expect("refused by the rendezvous store" in p.stderr and "wrong" + MARK not in p.stderr,
           "its message says refused, without printing the token", p.stderr)
    expect("wrong token" in err0 and "refused" in err0, "the store logs the refusal", err0)
    expect("node rank 1 of 2 did not join" in err0, "node 0 then times out naming node rank 1", err0)


def port_in_use():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p, _ = run(["--nnodes", "2", "--node-rank", "0", "--master-port", str(port), "--", "true"],
                   KFT_RDZV_TOKEN="t")
    expect(p.returncode == 1, "a port already in use fails", p.returncode, p.stderr)
    expect(f"127.0.0.1:{port}: address already in use" in p.stderr, "with the address and 'already in use'", p.stderr)


def unreachable_master():
    port = free_port()
    p, took = run(["--nnodes", "2", "--node-rank", "1", "--master-port", str(port), "--rdzv-timeout", "1.5",
                   "--", "true"], KFT_RDZV_TOKEN="t")
    expect(p.returncode == EXIT["hang"], "an unreachable master: 5 (a deadline passed)", p.returncode, p.stderr)
    expect(f"could not reach the rendezvous store at 127.0.0.1:{port} within 1.5 s" in p.stderr,
           "naming the address and the timeout", p.stderr)
    expect(1.4 < took < 5, f"after the rendezvous timeout ({took:.2f} s)")


def gang_timeout():
    port = free_port()
    p, took = run(["--nnodes", "3", "--node-rank", "0", "--master-port", str(port), "--rdzv-timeout", "1.5",
                   "--", "true"], KFT_RDZV_TOKEN="t")
    expect(p.returncode == EXIT["hang"], "a job whose nodes never all join exits 5 (hang)", p.returncode)
    expect("node ranks 1, 2 of 3 did not join (joined: 0 on" in p.stderr, "naming the missing node ranks", p.stderr)
    expect(took < 5, f"soon after the rendezvous timeout ({took:.2f} s)")


def log_dir():
    with tempfile.TemporaryDirectory() as d:
        p, _ = run(["--nproc-per-node", "2", "--log-dir", d, "--run-id", "logs", "--", "sh", "-c",
                    'echo "out of $RANK"; echo "err of $RANK" >&2'])
        expect(p.returncode == 0 and "out of" not in p.stdout, "with --log-dir, output goes to files only", p.stdout)
        for r in (0, 1):
            with open(os.path.join(d, "logs", "attempt_0", str(r), "stdout.log")) as f:
                expect(f.read() == f"out of {r}\n", f"rank {r}'s stdout.log")
            with open(os.path.join(d, "logs", "attempt_0", str(r), "stderr.log")) as f:
                expect(f.read() == f"err of {r}\n", f"rank {r}'s stderr.log")
        p, _ = run(["--nproc-per-node", "2", "--log-dir", d, "--run-id", "tee", "--tee", "--", "sh", "-c",
                    'echo "out of $RANK"'])
        expect("[1]: out of 1" in p.stdout and os.path.exists(os.path.join(d, "tee", "attempt_0", "1", "stdout.log")),
               "with --tee, both", p.stdout)


def bad_input():
    for args, extra, text in [
        (["--nnodes", "2", "--node-rank", "2", "--", "true"], {"KFT_RDZV_TOKEN": "t"}, '--node-rank="2" is not below --nnodes=2'),
        (["--nproc-per-node", "abc", "--", "true"], {}, '--nproc-per-node="abc" is not a positive integer, auto, cpu or gpu'),
        (["--nproc-per-node", "0", "--", "true"], {}, '--nproc-per-node="0"'),
        (["--nnodes", "2", "--", "true"], {}, 'KFT_RDZV_TOKEN="" is not set'),
        (["--max-restarts", "-1", "--", "true"], {}, "--max-restarts"),
        (["--nproc-per-node", "2"], {}, "program"),
        # Found by fuzz.kftrun_args: seconds that overflow (undefined behaviour) or round to 0 ms.
        (["--rdzv-timeout", "1e300", "--", "true"], {}, "--rdzv-timeout"),
        (["--rdzv-timeout", "0.0000001", "--", "true"], {}, "--rdzv-timeout"),
        (["--on-failure", "retry", "--", "true"], {}, "--on-failure"),
        (["--nnodes", "1:2", "--on-failure", "continue", "--", "true"], {"KFT_RDZV_TOKEN": "t"},
         '--on-failure="continue" keeps the survivors of a fixed-size job (--nnodes=1:2 is elastic'),
        (["--nnodes", "1:2", "--on-failure", "heal", "--max-restarts", "1", "--", "true"], {"KFT_RDZV_TOKEN": "t"},
         '--on-failure="heal" keeps the survivors of a fixed-size job (--nnodes=1:2 is elastic'),
        (["--on-failure", "heal", "--", "true"], {}, '--max-restarts="0" is how many replacements --on-failure heal'),
    ]:
        p, _ = run(args, **extra)
        expect(p.returncode == 2 and text in p.stderr, f"refused with exit 2: {' '.join(args)}", p.returncode, p.stderr)
    # --on-failure continue, when no worker is left: the job fails as before, named after the first one lost.
    p, _ = run(["--nproc-per-node", "2", "--on-failure", "continue", "--", "sh", "-c",
                'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 0.3; echo "on_failure=$KFT_ON_FAILURE"; exit 4'])
    expect(p.returncode == 3 and "rank 1 (local rank 1) was killed by signal 9" in p.stderr and
           "the other workers go on" in p.stderr and "on_failure=continue" in p.stdout,
           "--on-failure continue with nobody left: exit 3 (rank lost), naming rank 1", p.returncode, p.stdout, p.stderr)
    # --on-failure heal: the lost worker is replaced once (same rank, KFT_JOIN=1, told the policy);
    # the other worker never sees KFT_JOIN, even when kftrun's own environment has it.
    p, _ = run(["--nproc-per-node", "2", "--on-failure", "heal", "--max-restarts", "1", "--", "sh", "-c",
                'if [ "$RANK" = 1 ] && [ -z "$KFT_JOIN" ]; then kill -9 $$; fi; sleep 0.3; '
                'echo "rank=$RANK join=${KFT_JOIN:-none} on_failure=$KFT_ON_FAILURE"'], KFT_JOIN="7")
    expect(p.returncode == 0 and "rank=1 join=1 on_failure=heal" in p.stdout and "rank=0 join=none" in p.stdout and
           "replacement 1 of at most 1" in p.stderr, "--on-failure heal: rank 1 replaced once, with KFT_JOIN=1",
           p.returncode, p.stdout, p.stderr)
    # ... and only --max-restarts times: a replacement that dies too is lost for good.
    p, _ = run(["--nproc-per-node", "2", "--on-failure", "heal", "--max-restarts", "1", "--", "sh", "-c",
                'if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 0.5; echo "rank=$RANK done"'])
    expect(p.returncode == 0 and p.stderr.count("a replacement joins them") == 1 and "rank=0 done" in p.stdout and
           "lost on the way: rank(s) 1, 1" in p.stderr, "--on-failure heal: at most --max-restarts replacements",
           p.returncode, p.stdout, p.stderr)
    p, _ = run(["--nproc-per-node", "1", "--", "/nonexistent/program" + MARK])
    expect(p.returncode == 127 and "could not start \"/nonexistent/program" in p.stderr and
           "No such file or directory" in p.stderr, "a program that cannot start: exit 127 and why", p.returncode,
           p.stderr)


def pet_environment_forms():
    # The PET_* forms alone (what a TrainJob pod has), plus one flag overriding its variable.
    p, _ = run(["--nproc-per-node", "2", "--", "sh", "-c", 'echo "$RANK/$WORLD_SIZE"'], PET_NPROC_PER_NODE="5",
               PET_MAX_RESTARTS="0")
    expect(p.returncode == 0 and p.stdout.count("/2") == 2, "a flag wins over its PET_* variable", p.stdout, p.stderr)
    p, _ = run(["--", "sh", "-c", 'echo "$RANK/$WORLD_SIZE restarts=$TORCHELASTIC_MAX_RESTARTS"'],
               PET_NPROC_PER_NODE="3", PET_MAX_RESTARTS="4")
    expect(p.returncode == 0 and p.stdout.count("/3 restarts=4") == 3, "PET_NPROC_PER_NODE and PET_MAX_RESTARTS are read",
           p.stdout, p.stderr)
    # An elastic range in PET_NNODES (one agent, 1:2: a job of one node that a second could join).
    p, _ = run(["--", "sh", "-c", 'echo "$RANK/$WORLD_SIZE nodes=$GROUP_WORLD_SIZE"'], PET_NNODES="1:2",
               PET_NPROC_PER_NODE="2", PET_RDZV_TIMEOUT="10", KFT_RDZV_TOKEN="t" + MARK, PET_MASTER_PORT=str(free_port()),
               KFT_RDZV_LAST_CALL="0.2")
    expect(p.returncode == 0 and p.stdout.count("/2 nodes=1") == 2 and "round 0: 1 node(s)" in p.stderr,
           "PET_NNODES=MIN:MAX makes an elastic job", p.stdout, p.stderr)
    p, _ = run(["--", "true"], PET_NNODES="3:2")
    expect(p.returncode == 2 and '--nnodes="3:2" has MIN above MAX' in p.stderr, "a reversed range is refused", p.stderr)


def signal_stops_every_node():
    # SIGTERM to one agent of two, with restarts left: the whole job stops, nobody restarts.
    a0, a1 = two_agents(["--nproc-per-node", "1", "--max-restarts", "3", "--term-grace", "1"], ["sleep", MARK])
    wait_for_workers(2)
    a1.terminate()
    t0 = time.monotonic()
    _, e0 = a0.communicate(timeout=30)
    _, e1 = a1.communicate(timeout=30)
    expect(a1.returncode == 143, "the signalled agent exits 143", a1.returncode, e1)
    expect(a0.returncode == 143 and "the agent of node 1 on" in e0 and "received SIGTERM" in e0,
           "the other agent stops too, saying why, without restarting", a0.returncode, e0)
    expect("restarting" not in e0 and time.monotonic() - t0 < 10, "no restart was attempted", e0)
    no_leftovers()


def nproc_auto():
    import json
    info = json.loads(subprocess.run([KFT_INFO, "--json"], capture_output=True, text=True, env=env()).stdout)
    gpus = len(info["host"]["cuda"]["devices"])
    expected = gpus if gpus > 0 else os.cpu_count()
    p, _ = run(["--", "sh", "-c", 'echo "size=$WORLD_SIZE"'], PET_NPROC_PER_NODE="auto")
    expect(p.returncode == 0 and p.stdout.count(f"size={expected}") == expected,
           f"--nproc-per-node auto = visible GPUs, else CPU cores ({expected} here)", p.stdout, p.stderr)


def bind_core():
    import json
    info = json.loads(subprocess.run([KFT_INFO, "--json"], capture_output=True, text=True, env=env()).stdout)
    if "error" in info["host"]["hwloc"]:
        print("SKIP: kft built without hwloc")
        sys.exit(77)
    cores = info["host"]["hwloc"]["cores"]
    p, _ = run(["--nproc-per-node", str(cores), "--bind", "core", "--", KFT_INFO, "--json"])
    expect(p.returncode == 0, "workers run bound", p.stdout, p.stderr)
    sets = {}
    for line in p.stdout.splitlines():
        if "{" in line:
            doc = json.loads(line[line.index("{"):])
            sets[doc["world"]["rank"]] = doc["host"]["hwloc"]["bound_cpuset"]
    expect(len(sets) == cores, "every worker reported its binding", p.stdout)
    expect(len(set(sets.values())) == cores, "each worker has its own core(s)", sets)
    expect(all(f"local rank {r}: PUs {sets[r]}," in p.stderr for r in sets),
           "kftrun announced each binding, and the workers run with it", p.stderr, sets)
    p, _ = run(["--bind", "socket", "--", "true"])
    expect(p.returncode == 2 and "KFT_BIND=\"socket\"" in p.stderr, "a bad --bind is refused, naming it", p.stderr)


# ---- hostile and unlucky input (issue 15): each failed before its fix -----------------------

def proc_stat(pid):
    """(state, utime+stime seconds) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return fields[0], (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def wait_listening(port, timeout=10):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.05)
    expect(False, f"the store listens on port {port}")


def frame(payload):
    return len(payload).to_bytes(4, "little") + payload


def wire_str(b):
    return len(b).to_bytes(4, "little") + b


def signal_and_wait(p, sig, timeout=60):
    """Sends `sig` to kftrun and waits for it: (its stderr, seconds until it exited)."""
    t0 = time.monotonic()
    p.send_signal(sig)
    _, err = p.communicate(timeout=timeout)
    return err, time.monotonic() - t0


def sigterm_during_gang_start():
    port = free_port()
    a = start(["--nnodes", "2", "--node-rank", "0", "--master-port", str(port), "--", "true"], KFT_RDZV_TOKEN="t")
    wait_listening(port)
    time.sleep(0.5)
    err, took = signal_and_wait(a, signal.SIGTERM, 30)
    expect(a.returncode == 143, "node 0 waiting for node 1 exits 143 on SIGTERM", a.returncode, err)
    expect(took < 2, f"at once, not at the rendezvous timeout ({took:.2f} s)")
    expect("received SIGTERM while waiting for the other nodes (node rank 1 of 2 did not join" in err,
           "saying which signal, and what it was waiting for", err)
    # A node whose master never comes up, in its connect retries.
    b = start(["--nnodes", "2", "--node-rank", "1", "--master-port", str(free_port()), "--", "true"],
              KFT_RDZV_TOKEN="t")
    time.sleep(1.0)
    err, took = signal_and_wait(b, signal.SIGINT, 30)
    expect(b.returncode == 130 and took < 2, f"node 1 connecting to its master exits 130 on SIGINT ({took:.2f} s)",
           b.returncode, err)
    expect("received SIGINT while connecting to the rendezvous store" in err, "saying so", err)


def daemon_left_behind():
    for code in (0, 3):
        p, _ = run(["--nproc-per-node", "2", "--term-grace", "1", "--", "sh", "-c",
                    f'(setsid sh -c "trap \\"\\" TERM; sleep {MARK}; sleep {MARK}" &); sleep 0.3; exit {code}'])
        expect(p.returncode == (0 if code == 0 else EXIT["worker_failed"]), f"the job exits {code and 1}", p.returncode,
               p.stderr)
        expect("ended 2 processes the workers left running" in p.stderr, "kftrun says it ended the daemons", p.stderr)
        expect(not leftovers(), f"no daemon (setsid, double fork) outlives kftrun (exit {code})", *leftovers())


def worker_exit_classes():
    """Each class a worker's end gives kftrun; the worker's own status stays in the ERROR line."""
    for script, cls, says in [
        ("exit 2", "worker_failed", "exited with status 2"),      # not a usage error of kftrun
        ("exit 143", "worker_failed", "exited with status 143"),  # not a preemption of kftrun
        ("kill -9 $$", "rank_lost", "was killed by signal 9 (SIGKILL)"),
        ("kill -ABRT $$", "worker_failed", "was killed by signal 6 (SIGABRT)"),
    ]:
        p, took = run(["--nproc-per-node", "2", "--", "sh", "-c", f'if [ "$RANK" = 1 ]; then {script}; fi; exec sleep {MARK}'])
        expect(p.returncode == EXIT[cls], f"a worker that runs `{script}`: kftrun exits {EXIT[cls]} ({cls})",
               p.returncode, p.stderr)
        expect(re.search(rf"ERROR: rank 1 \(local rank 1, node 0\) on .* {re.escape(says)}$", p.stderr, re.M),
               f"the ERROR line keeps the worker's own end ({says})", p.stderr)
    # A local worker stopped (state T) for longer than the heartbeat timeout: a hang.
    p, took = run(["--nproc-per-node", "2", "--heartbeat-timeout", "1", "--", "sh", "-c",
                   f'if [ "$RANK" = 1 ]; then kill -STOP $$; fi; exec sleep {MARK}'])
    expect(p.returncode == EXIT["hang"], "a worker stopped past --heartbeat-timeout: kftrun exits 5 (hang)",
           p.returncode, p.stderr)
    expect("rank 1 (local rank 1, node 0) on" in p.stderr and "stayed stopped (state T" in p.stderr,
           "naming the stopped rank", p.stderr)
    expect(1 < took < 4, f"after the heartbeat timeout ({took:.2f} s)")
    p, _ = run(["--no-such-flag", "--", "true"])
    expect(p.returncode == EXIT["usage"], "a bad flag: 2 (usage)", p.returncode, p.stderr)
    no_leftovers()


def stopped_worker():
    a = start(["--nproc-per-node", "2", "--term-grace", "20", "--", "sh", "-c",
               f'if [ "$RANK" = 1 ]; then trap "" TERM; fi; while :; do sleep 0.2; done # {MARK}'])
    wait_for_workers(2)
    victim = None
    for line in leftovers():
        pid = int(line.split(":")[0])
        with open(f"/proc/{pid}/environ", "rb") as f:
            if b"\0RANK=1\0" in b"\0" + f.read():
                victim = pid
    expect(victim is not None, "found rank 1's process", *leftovers())
    os.kill(victim, signal.SIGSTOP)
    time.sleep(0.3)
    err, took = signal_and_wait(a, signal.SIGTERM)
    expect(a.returncode == 143, "kftrun exits 143", a.returncode, err)
    expect(took < 3, f"a stopped worker is killed at once, not after --term-grace 20 ({took:.2f} s)")
    no_leftovers()


def exit_grace():
    """After a worker fails, the others may still exit by themselves for --exit-grace (1 s), so
    that the error of one that saw the failure (often naming the rank at fault) is printed before
    it is signalled; one that does not exit is stopped after the grace (a deadline), a stopped
    one is not waited for, and a signal to kftrun ends the grace at once."""
    said = "rank 0: kft: rank 1 is at a different call"

    def script(delay):  # rank 1 fails at once, rank 0 sees it `delay` s later and says so, rank 2 goes on
        return f'case $RANK in 1) exit 3;; 0) sleep {delay}; echo "{said}" >&2; exit 3;; *) exec sleep {MARK};; esac'

    p, took = run(["--nproc-per-node", "3", "--", "sh", "-c", script(0.3)])
    expect(p.returncode == EXIT["worker_failed"] and
           re.search(r"^kftrun\[node 0\] ERROR: rank 1 \(local rank 1, node 0\) on .* exited with status 3$", p.stderr, re.M),
           "the job fails naming the first rank to fail", p.returncode, p.stderr)
    expect(f"[0]: {said}" in p.stderr, "the rank that saw the failure had the time to say so", p.stderr)
    expect(0.9 < took < 4, f"the rank that went on was stopped after the grace of 1 s ({took:.2f} s)", p.stderr)
    # --exit-grace 0: signalled at once (SIGTERM's default ends a worker before it can say anything).
    p, took = run(["--nproc-per-node", "3", "--exit-grace", "0", "--", "sh", "-c", script(3)])
    expect(p.returncode == EXIT["worker_failed"] and said not in p.stderr and took < 3,
           f"--exit-grace 0 stops the others at once ({took:.2f} s)", p.returncode, p.stderr)
    # A stopped worker cannot exit by itself: the grace does not wait for it.
    p, took = run(["--nproc-per-node", "3", "--exit-grace", "20", "--", "sh", "-c",
                   f'case $RANK in 0) kill -STOP $$; exec sleep {MARK};; 1) sleep 0.5; exit 3;; esac'])
    expect(p.returncode == EXIT["worker_failed"] and took < 3,
           f"workers left that are all stopped end the grace of 20 s at once ({took:.2f} s)", p.returncode, p.stderr)
    # SIGTERM to kftrun during a long grace: the job stops at once.
    a = start(["--nproc-per-node", "3", "--exit-grace", "30", "--", "sh", "-c",
               f'[ "$RANK" = 1 ] && exit 3; exec sleep {MARK}'])
    wait_for_workers(2)
    time.sleep(0.5)
    err, took = signal_and_wait(a, signal.SIGTERM)
    expect(a.returncode == 143 and took < 3, f"SIGTERM during the grace of 30 s stops the job at once ({took:.2f} s)",
           a.returncode, err)
    no_leftovers()


def store_flood():
    # 200 idle strangers against an agent limited to 128 file descriptors.
    port = free_port()
    token = dict(KFT_RDZV_TOKEN="t" + MARK)
    a0 = subprocess.Popen(["prlimit", "--nofile=128:128", KFTRUN, "--nnodes", "2", "--node-rank", "0",
                           "--master-port", str(port), "--rdzv-timeout", "60", "--", "true"],
                          env=env(**token), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_listening(port)
    crowd = []
    for _ in range(200):
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        crowd.append(s)
    time.sleep(0.5)
    _, cpu0 = proc_stat(a0.pid)
    time.sleep(2.0)
    _, cpu1 = proc_stat(a0.pid)
    expect(cpu1 - cpu0 < 0.5, f"the flooded store does not spin ({cpu1 - cpu0:.2f} s of CPU in 2 s)")
    t0 = time.monotonic()
    p, _ = run(["--nnodes", "2", "--node-rank", "1", "--master-port", str(port), "--rdzv-timeout", "20", "--",
                "true"], timeout=60, **token)
    took = time.monotonic() - t0
    _, err0 = a0.communicate(timeout=60)
    for s in crowd:
        s.close()
    expect(p.returncode == 0 and a0.returncode == 0, f"node 1 joins and the job succeeds while the crowd stays ({took:.1f} s)",
           p.returncode, p.stderr, a0.returncode, err0[-2000:])
    expect("dropped" in err0, "the store says it dropped strangers", err0[-2000:])
    expect(err0.count("\n") < 60, "in a bounded number of lines", err0.count("\n"))


def rendezvous_cost():
    """The static rendezvous costs each agent the same number of store requests (waits aside)
    for 2 nodes as for 24: node records are read in one multi_get, not one get per node."""
    per_node = {}
    for nodes in (2, 24):
        agents = agents_of(nodes, ["-v", "--nproc-per-node", "1", "--rdzv-timeout", "60"], ["sh", "-c", f": {MARK}"])
        outs = [a.communicate(timeout=120) for a in agents]
        counts = []
        for n, (a, (_, err)) in enumerate(zip(agents, outs)):
            expect(a.returncode == 0, f"node {n} of {nodes} ends the job with 0", a.returncode, err[-2000:])
            m = re.search(rf"round 0 formed with {nodes} node\(s\): (\d+) store requests from this agent, besides (\d+) wait", err)
            expect(m, f"node {n} of {nodes} says what the rendezvous cost it (-v)", err[-2000:])
            counts.append(int(m.group(1)))
        print(f"rendezvous of {nodes} nodes: store requests per agent (waits aside): {sorted(set(counts))}")
        per_node[nodes] = counts
    expect(max(per_node[24]) <= max(per_node[2]), "24 nodes cost no agent more store requests than 2 nodes do",
           per_node)
    expect(max(per_node[24]) <= 8, "a handful of requests per agent", per_node)


def store_oversized_hello():
    # 32 strangers each announce a 60 MiB first frame and stream data after it.
    port = free_port()
    a0 = start(["--nnodes", "2", "--node-rank", "0", "--master-port", str(port), "--rdzv-timeout", "30", "--", "true"],
               KFT_RDZV_TOKEN="t" + MARK)
    wait_listening(port)
    time.sleep(0.3)
    before = rss_mib(a0.pid)
    import threading
    sent = []

    def stream():
        total = 0
        try:
            with socket.create_connection(("127.0.0.1", port)) as s:
                s.settimeout(5)
                s.sendall((60 << 20).to_bytes(4, "little"))
                chunk = b"x" * 65536
                while total < (24 << 20):
                    s.sendall(chunk)
                    total += len(chunk)
        except OSError:
            pass
        sent.append(total)

    threads = [threading.Thread(target=stream) for _ in range(32)]
    for t in threads:
        t.start()
    peak = before
    while any(t.is_alive() for t in threads):
        peak = max(peak, rss_mib(a0.pid))
        time.sleep(0.02)
    peak = max(peak, rss_mib(a0.pid))
    a0.send_signal(signal.SIGTERM)
    _, err = a0.communicate(timeout=30)
    expect(peak - before < 32, f"kftrun's memory stays flat ({before:.1f} -> {peak:.1f} MiB)")
    expect(max(sent) < (16 << 20), f"each stranger is cut off after its header (at most {max(sent) >> 20} MiB taken)")
    expect("a first frame of 62914560 bytes" in err, "the store names the oversized first frame", err[-2000:])


def store_log_injection():
    port = free_port()
    a0 = start(["--nnodes", "2", "--node-rank", "0", "--master-port", str(port), "--rdzv-timeout", "30", "--", "true"],
               KFT_RDZV_TOKEN="t" + MARK)
    wait_listening(port)
    forged = b"x\nkftrun[node 0] ERROR: FORGED " + MARK.encode() + b"\r\x1b[2K"
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(frame(bytes([1]) + wire_str(b"wrong") + wire_str(forged)))
        s.recv(16)
    time.sleep(0.3)
    a0.send_signal(signal.SIGTERM)
    _, err = a0.communicate(timeout=30)
    expect("refused" in err and "FORGED" in err, "the refusal is logged", err)
    expect(any(re.match(r"kftrun\[node 0\] WARN: kft store .*refused", l) for l in err.splitlines()),
           "the refusal is one WARN line of the agent", err)
    expect(not any(l.startswith("kftrun[node 0] ERROR: FORGED") for l in err.splitlines()),
           "but a stranger's name cannot start a log line of its own", err)
    expect("\x1b" not in err and "\\x1b" in err and "\\n" in err, "control bytes are shown escaped", err)


def unbounded_output():
    # 100 MB of tqdm-style updates ('\r', no newline), and 20 MB in one unterminated line.
    script = ("import sys\n"
              "for i in range(1000000): sys.stdout.write('\\r' + str(i % 100).rjust(3) + '%|' + '#' * 90)\n"
              "sys.stdout.write('y' * 20000000)\n")
    with tempfile.TemporaryFile() as out:
        a = subprocess.Popen([KFTRUN, "--", "/usr/bin/python3", "-c", script], env=env(), stdout=out,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(0.2)
        base = rss_mib(a.pid)
        peak = base
        while a.poll() is None:
            try:
                peak = max(peak, rss_mib(a.pid))
            except OSError:
                break
            time.sleep(0.02)
        a.communicate(timeout=120)
        out.seek(0)
        head = out.read(4096).decode()
        out.seek(0, 2)
        size = out.tell()
    expect(a.returncode == 0, "the worker ran", a.returncode)
    expect(peak - base < 32, f"kftrun's memory stays flat while relaying ({base:.1f} -> {peak:.1f} MiB)")
    expect(head.startswith("[0]: \r") and "\r[0]:   1%|" in head, "each redraw is relayed with the rank prefix",
           repr(head[:300]))
    expect(size > 120_000_000, f"and nothing is lost ({size} bytes relayed)")


# ---- elastic jobs (--nnodes MIN:MAX) --------------------------------------------------------

class reader:
    """Collects an agent's stderr and stdout lines as they come, with the time each arrived."""
    def __init__(self, proc):
        import threading
        self.proc, self.lines = proc, []
        self._lock = threading.Lock()
        self._pumps = [threading.Thread(target=self._pump, args=(stream,), daemon=True)
                       for stream in (proc.stdout, proc.stderr)]
        for t in self._pumps:
            t.start()

    def wait(self, timeout=30):
        """Waits for the process to end and for its last lines to be read (the pipes' end of
        file): a process can exit before the pumps have taken its final line."""
        self.proc.wait(timeout=timeout)
        for t in self._pumps:
            t.join(timeout=timeout)

    def _pump(self, stream):
        for line in stream:
            with self._lock:
                self.lines.append((time.monotonic(), line.rstrip("\n")))

    def text(self):
        with self._lock:
            return "\n".join(l for _, l in self.lines)

    def wait_for(self, needle, timeout=30):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for t, l in self.lines:
                    if needle in l:
                        return t
            time.sleep(0.05)
        expect(False, f"within {timeout} s: a line with {needle!r}", self.text())


def elastic_agents(spec, ids, flag, last_call="1"):
    """Flags of one elastic job (--nnodes spec) and its worker: it prints its round and waits for `flag`."""
    port = free_port()
    worker = ['sh', '-c', 'echo "round=$TORCHELASTIC_RESTART_COUNT world=$WORLD_SIZE rank=$RANK '
                          'node=$GROUP_RANK/$GROUP_WORLD_SIZE"; '
                          f'while [ ! -e {flag} ]; do sleep 0.05; done; echo {MARK} > /dev/null']
    common = ["--nnodes", spec, "--master-port", str(port), "--heartbeat-timeout", "2", "--rdzv-last-call", last_call,
              "--max-restarts", "1"]
    return port, common, worker


def elastic_join_leave_rejoin():
    """Nodes 0 and 1 start a 2:3 job; node 2 joins (round 1: 3 nodes); node 2's agent is killed
    (round 2: 2 nodes, the one restart allowed); node 2 comes back (round 3: 3 nodes). Membership
    changes do not use up --max-restarts; every round re-numbers the ranks; the job ends with 0."""
    flag = os.path.join(PRIVATE, "done-" + MARK)
    port, common, worker = elastic_agents("2:3", None, flag)
    token = dict(KFT_RDZV_TOKEN="t" + MARK)
    start_node = lambda n: reader(start([*common, "--node-rank", str(n), "--", *worker, MARK], **token))
    a0, a1 = start_node(0), start_node(1)
    a0.wait_for("round 0: 2 node(s) (0 on")
    a0.wait_for("[0]: round=0 world=2 rank=0 node=0/2")
    a1.wait_for("[1]: round=0 world=2 rank=1 node=1/2")
    t_join = time.monotonic()
    a2 = start_node(2)
    t1 = a0.wait_for("round 1: 3 node(s)")
    expect(t1 - t_join < 5, f"a joining node starts a new round within the bound ({t1 - t_join:.2f} s)")
    a2.wait_for("[2]: round=1 world=3 rank=2 node=2/3")
    expect("re-forming the job (round 1): node 2 on" in a0.text() and "asked to join" in a0.text(),
           "node 0 says why the round ended", a0.text())
    a2.proc.kill()
    a2.proc.wait()
    t_kill = time.monotonic()
    t2 = a0.wait_for("round 2: 2 node(s)")
    expect(t2 - t_kill < 2 + 1 + 4, f"a lost node ends the round within heartbeat + last call ({t2 - t_kill:.2f} s)")
    a1.wait_for("[1]: round=2 world=2 rank=1 node=1/2")
    expect("restarting all workers (restart 1 of 1) after: the agent of node 2 on" in a0.text(),
           "the lost node is the one restart", a0.text())
    a2 = start_node(2)  # the node comes back
    t3 = a0.wait_for("round 3: 3 node(s)")
    a2.wait_for("[2]: round=3 world=3 rank=2 node=2/3")
    a1.wait_for("[1]: round=3 world=3 rank=1 node=1/3")
    expect(t3 > t2, "and is taken in at the next round")
    open(flag, "w").close()
    for a in (a0, a1, a2):
        a.wait(30)
    expect(a0.proc.returncode == 0 and a1.proc.returncode == 0 and a2.proc.returncode == 0,
           "every agent ends the job with 0 (two membership changes and one failure with --max-restarts 1)",
           a0.proc.returncode, a1.proc.returncode, a2.proc.returncode, a0.text(), a1.text(), a2.text())
    os.unlink(flag)


def elastic_below_min():
    """A 3:4 job where only nodes 0 and 1 come: it waits the rendezvous timeout, then every agent
    fails naming who joined and who did not."""
    port = free_port()
    token = dict(KFT_RDZV_TOKEN="t" + MARK)
    common = ["--nnodes", "3:4", "--master-port", str(port), "--rdzv-timeout", "3"]
    agents = [start([*common, "--node-rank", str(n), "--", "sleep", MARK], **token) for n in (0, 1)]
    t0 = time.monotonic()
    outs = [a.communicate(timeout=30) for a in agents]
    took = time.monotonic() - t0
    for n, (a, (_, err)) in enumerate(zip(agents, outs)):
        expect(a.returncode == EXIT["hang"], f"node {n}'s agent exits 5 (hang)", a.returncode, err)
        expect("rendezvous timed out after 3 s: 2 of at least 3 nodes joined round 0 (0 on" in err and
               "node rank(s) 2, 3 did not" in err, f"node {n} names who joined and who did not", err)
    expect(took < 3 + 3, f"after the rendezvous timeout ({took:.2f} s)")


def elastic_full_round_waits():
    """A 1:2 job with three agents (node ranks are identities: 0, 1, 5): the third waits while the
    job is full, and ends with it."""
    flag = os.path.join(PRIVATE, "done-" + MARK)
    port, common, worker = elastic_agents("1:2", None, flag)
    token = dict(KFT_RDZV_TOKEN="t" + MARK)
    a = [reader(start([*common, "--node-rank", str(n), "--", *worker, MARK], **token)) for n in (0, 1)]
    a[0].wait_for("round 0: 2 node(s)")
    third = reader(start([*common, "--node-rank", "5", "--", *worker, MARK], **token))
    time.sleep(2)
    expect("round 1" not in a[0].text(), "a full job is not re-formed for a waiting node", a[0].text())
    open(flag, "w").close()
    for r in (*a, third):
        r.wait(30)
    expect(a[0].proc.returncode == 0 and a[1].proc.returncode == 0, "the job ends with 0", a[0].text(), a[1].text())
    expect(third.proc.returncode == 0 and "the job ended (status 0) before this node was taken in" in third.text(),
           "the waiting agent ends with it and says so", third.proc.returncode, third.text())
    os.unlink(flag)


def elastic_duplicate_node_rank():
    """Two agents with node rank 1 ask to join the same round: the second is refused (exit 2),
    naming the first; the job goes on with the first."""
    flag = os.path.join(PRIVATE, "done-" + MARK)
    port, common, worker = elastic_agents("2:3", None, flag, last_call="5")  # (open while the second one comes)
    token = dict(KFT_RDZV_TOKEN="t" + MARK)
    a0 = reader(start([*common, "--node-rank", "0", "--", *worker, MARK], **token))
    a1 = reader(start([*common, "--node-rank", "1", "--", *worker, MARK], **token))
    time.sleep(1)
    dup = start([*common, "--node-rank", "1", "--", *worker, MARK], **token)
    _, err = dup.communicate(timeout=30)
    expect(dup.returncode == 2 and "node rank 1 is taken by the agent on" in err,
           "a second agent with node rank 1 is refused, naming the first", dup.returncode, err)
    a0.wait_for("round 0: 2 node(s) (0 on")
    open(flag, "w").close()
    for r in (a0, a1):
        r.wait(30)
    expect(a0.proc.returncode == 0 and a1.proc.returncode == 0, "the job runs on with the first", a0.text(), a1.text())
    os.unlink(flag)

SCENARIOS = {f.__name__: f for f in [
    rendezvous_cost,
    signal_stops_every_node, nproc_auto, bind_core,
    torch_style_worker, worker_fails, worker_killed_by_signal, restart_once, restarts_exhausted,
    two_agents_restart_together, agent_killed, agent_stopped, store_host_killed, worker_exit_classes, sigterm, sigint, wrong_token, port_in_use,
    unreachable_master, gang_timeout, log_dir, bad_input, pet_environment_forms,
    sigterm_during_gang_start, daemon_left_behind, stopped_worker, exit_grace, store_flood, store_oversized_hello,
    store_log_injection, unbounded_output, elastic_join_leave_rejoin, elastic_below_min, elastic_full_round_waits,
    elastic_duplicate_node_rank]}

def nothing_left(shm_before):
    """After every scenario, on every path: no process (agents included), no /dev/shm entry, no
    listener on a port the scenario used, nothing in the jobs' TMPDIR / XDG_RUNTIME_DIR."""
    deadline = time.monotonic() + 3
    while marked_processes(MARK) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = marked_processes(MARK)
    expect(not left, "afterwards: no process of the scenario is left, agents included", *left)
    new = [f for f in kft_shm() if f not in shm_before]
    expect(not new, "afterwards: nothing new in /dev/shm", new)
    busy = [p for p in PORTS if listening(p)]
    expect(not busy, f"afterwards: nothing listens on the {len(PORTS)} port(s) the scenario used", busy)
    files = files_under(PRIVATE)
    expect(not files, "afterwards: no file left in the jobs' TMPDIR and XDG_RUNTIME_DIR", files)
    os.rmdir(PRIVATE)


if __name__ == "__main__":
    shm_before = kft_shm()
    try:
        SCENARIOS[SCENARIO]()
        nothing_left(shm_before)
    finally:
        for line in marked_processes(MARK):  # never leave anything behind, even on failure
            try:
                os.kill(int(line.split(":")[0]), signal.SIGKILL)
            except (ProcessLookupError, ValueError):
                pass
    print(f"kftrun_test {SCENARIO}: 1 passed, 0 failed")

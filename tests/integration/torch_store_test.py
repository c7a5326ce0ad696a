#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kft's torch TCPStore client against the real thing (Debian's torch 1.13).

    /usr/bin/python3 torch_store_test.py build/tests/integration/torch_store_check

Hosts a torch TCPStore, seeds keys, runs the C++ check program, then checks from torch's side
what kft wrote; finally a port where nothing torch-like listens must fail fast and clearly.
Exit 77 (skip) when torch is not importable.
"""
import datetime
import socket
import subprocess
import sys
import threading
import time

try:
    import torch.distributed as dist
except Exception as e:  # pragma: no cover - depends on the machine
    print("skip: torch is not importable by %s (%s); install python3-torch" % (sys.executable, e))
    sys.exit(77)

check_prog = sys.argv[1]
store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30), wait_for_workers=False)
store.set("from_torch", "hello from torch")
store.add("torch_counter", 5)

proc = subprocess.Popen([check_prog, "127.0.0.1", str(store.port)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True)
# Torch's side: wait for kft's keys, compare, then release kft's last wait.
store.wait(["kft_ready"], datetime.timedelta(seconds=30))
problems = []
if store.get("from_kft") != b"bytes\0with nul":
    problems.append("torch read %r for from_kft" % store.get("from_kft"))
if int(store.get("kft_counter")) != 2:
    problems.append("torch read kft_counter=%r" % store.get("kft_counter"))
if int(store.get("torch_counter")) != 7:
    problems.append("torch read torch_counter=%r" % store.get("torch_counter"))
if store.get("cas") != b"second":
    problems.append("torch read cas=%r" % store.get("cas"))
if store.num_keys() != 7:  # from_torch torch_counter from_kft kft_counter_base kft_counter cas kft_ready
    problems.append("torch counts %d keys (erase left one behind?)" % store.num_keys())
time.sleep(0.2)
store.set("torch_done", "1")
out, _ = proc.communicate(timeout=60)
print(out, end="")
if proc.returncode != 0:
    problems.append("torch_store_check exited %d" % proc.returncode)

# A listener that accepts and never answers: kft must give up within its io timeout, saying
# the server does not speak torch's protocol (no hang).
silent = socket.socket()
silent.bind(("127.0.0.1", 0))
silent.listen(4)
conns = []
threading.Thread(target=lambda: conns.append(silent.accept()), daemon=True).start()
t0 = time.monotonic()
p = subprocess.run([check_prog, "127.0.0.1", str(silent.getsockname()[1])], capture_output=True, text=True, timeout=60)
took = time.monotonic() - t0
if p.returncode != 1 or "did not answer like torch 1.13's TCPStore" not in p.stderr or took > 15:
    problems.append("silent server: exit %d after %.1f s: %s" % (p.returncode, took, p.stderr.strip()))
else:
    print("ok   a server that does not answer is refused within %.1f s: %s" % (took, p.stderr.strip()))

for line in problems:
    print("FAIL", line)
sys.exit(1 if problems else 0)

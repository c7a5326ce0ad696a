#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kft's torch TCPStore client against the real torch 1.13 (Debian's), or against a server
speaking torch 2.x's protocol (torch2_store_server.py, written from PyTorch's sources).

    /usr/bin/python3 torch_store_test.py build/tests/integration/torch_store_check
    python3 torch_store_test.py build/tests/integration/torch_store_check --torch2 libuv|classic

Hosts the store, seeds keys, runs the C++ check program, then checks from torch's side (torch's
own client, or a torch 2.x client as TCPStore.cpp connects) what kft wrote; then the server goes
away while kft waits. Finally a port where nothing torch-like listens must fail fast and clearly.
With --torch2, it also checks that the server is as strict as PyTorch's (so kft passing means
it did the handshake) and, from the server's side, which connections kft opened.
Exit 77 (skip) when torch 1.13 is asked for and torch is not importable.
"""
import datetime
import os
import socket
import struct
import subprocess
import sys
import threading
import time

check_prog = sys.argv[1]
torch2 = sys.argv[3] if len(sys.argv) == 4 and sys.argv[2] == "--torch2" else None
if len(sys.argv) not in (2, 4) or (len(sys.argv) == 4 and torch2 not in ("libuv", "classic")):
    sys.exit("usage: torch_store_test.py CHECK_PROGRAM [--torch2 libuv|classic]")
problems = []

if torch2:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import torch2_store_server as t2

    server = t2.Server(torch2)
    port = server.port
    store = t2.Client("127.0.0.1", port)
    expect = "2"
else:
    try:
        import torch.distributed as dist
    except Exception as e:  # pragma: no cover - depends on the machine
        print("skip: torch is not importable by %s (%s); install python3-torch" % (sys.executable, e))
        sys.exit(77)
    store = dist.TCPStore("127.0.0.1", 0, 1, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    port = store.port
    expect = "1.13"


def raw(data, wait=1.0, more=None):
    """Sends bytes on a fresh connection: what came back, and whether the server closed it."""
    s = socket.create_connection(("127.0.0.1", port))
    s.settimeout(wait)
    s.sendall(data)
    got, closed = b"", False
    try:
        while True:
            chunk = s.recv(64)
            if not chunk:
                closed = True
                break
            got += chunk
    except socket.timeout:
        if more is not None:  # then send more and see again
            s.sendall(more)
            try:
                closed = s.recv(64) == b""
            except (socket.timeout, ConnectionResetError):
                closed = True
    except ConnectionResetError:
        closed = True
    s.close()
    return got, closed


if torch2:
    # The server is as strict as PyTorch's: nothing is served before VALIDATE, so the checks
    # below pass only if kft's client validates. GETNUMKEYS (7) alone, then VALIDATE with a
    # wrong magic; both are checked again after kft ran (nothing of them was stored).
    got, closed = raw(bytes([t2.GETNUMKEYS]), 0.5)
    strict = got == b"" and (closed if torch2 == "classic" else not closed)
    got2, closed2 = raw(bytes([t2.VALIDATE]) + struct.pack("<I", 0x12345678) + bytes([t2.GETNUMKEYS]), 0.5,
                        more=bytes([t2.GETNUMKEYS]))
    strict = strict and got2 == b"" and closed2
    (print if strict else problems.append)(
        ("ok   " if strict else "") + "the %s server serves no query before a correct VALIDATE "
        "(unvalidated GETNUMKEYS: %r, %s; wrong magic: %r, %s)" %
        (torch2, got, "dropped" if closed else "unanswered", got2, "dropped" if closed2 else "kept"))
    conns_before = len(server.connections())
else:
    # What kft sends a server that did not answer 1.13's GETNUMKEYS in time (VALIDATE + PING,
    # the nonce's third byte >= 0x80): torch 1.13 must refuse it at once and keep nothing.
    store.set("before", "1")
    t0 = time.monotonic()
    got, closed = raw(bytes([0]) + struct.pack("<I", 0x3C85F7CE) + bytes([13]) + struct.pack("<I", 0x4b801234), 5.0)
    took = time.monotonic() - t0
    safe = got == b"" and closed and took < 2 and store.num_keys() == 1 and store.get("before") == b"1"
    (print if safe else problems.append)(
        ("ok   " if safe else "") + "torch 1.13 drops torch 2.x's handshake in %.2f s and keeps nothing (%d key)" %
        (took, store.num_keys()))
    store.delete_key("before")

store.set("from_torch", "hello from torch")
store.add("torch_counter", 5)

proc = subprocess.Popen([check_prog, "127.0.0.1", str(port), expect, "server-goes-away"], stdout=subprocess.PIPE,
                        stderr=subprocess.STDOUT, text=True)
# Torch's side: wait for kft's keys, compare, then release kft's wait, then go away.
store.wait(["kft_ready"], datetime.timedelta(seconds=30))
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
time.sleep(0.5)  # kft is now waiting for a key no one sets: the server goes away
t_gone = time.monotonic()
if torch2:
    kft_conns = [c for c in server.connections()[conns_before:]]
    server.stop()
    store.close()
else:
    del store  # torch 1.13's server stops and closes its connections
out, _ = proc.communicate(timeout=60)
print(out, end="")
if proc.returncode != 0:
    problems.append("torch_store_check exited %d" % proc.returncode)
elif time.monotonic() - t_gone > 10:
    problems.append("kft noticed the server going away only after %.1f s" % (time.monotonic() - t_gone))

if torch2:
    # From the server's side: kft first asked 1.13's GETNUMKEYS (6, unanswered: the connection
    # was not validated), then opened one validated connection that served everything, the
    # timed-out waits included (cancelled with CANCEL_WAIT, not dropped).
    summary = ["#%d %s %s (%s)" % (n, "validated" if v else "not validated", q[:3] + (["..."] if len(q) > 3 else []),
                                   why) for n, v, q, why in kft_conns]
    validated = [c for c in kft_conns if c[1]]
    probe_ok = len(kft_conns) == 2 and not kft_conns[0][1] and kft_conns[0][2] == []
    served = len(validated) == 1 and validated[0][2][0] == t2.PING and t2.CANCEL_WAIT in validated[0][2]
    if probe_ok and served:
        print("ok   kft's connections as the server saw them: " + "; ".join(summary))
        print("ok   kft's timed-out waits were cancelled on its one validated connection (%d CANCEL_WAIT)" %
              validated[0][2].count(t2.CANCEL_WAIT))
    else:
        problems.append("kft's connections as the server saw them: " + "; ".join(summary))

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
if p.returncode != 1 or "answered like neither torch 1.13's TCPStore" not in p.stderr or took > 15:
    problems.append("silent server: exit %d after %.1f s: %s" % (p.returncode, took, p.stderr.strip()))
else:
    print("ok   a server that does not answer is refused within %.1f s: %s" % (took, p.stderr.strip()))

for line in problems:
    print("FAIL", line)
sys.exit(1 if problems else 0)

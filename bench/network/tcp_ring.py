#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""What plain TCP carries through the bench's throttled links: one process per namespace host,
each sending BYTES to the next host and receiving BYTES from the previous one at the same time
(the traffic of one ring step: every host's egress carries its data and the ACKs of what it
receives). bench/network/netns_allreduce.sh runs it on every host right after the allreduce bench, so
its "link bound" can be read against what the link really carries, not only against the tc rate
(tbf meters whole frames: headers, and the reverse ACKs, take a share of the rate).

    tcp_ring.py --me I --addrs A0,A1,... --port P --bytes N     (on host I; prints one JSON line)
"""
import argparse
import json
import socket
import sys
import threading
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--me", type=int, required=True)
    ap.add_argument("--addrs", required=True, help="every host's address, in ring order, comma-separated")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--bytes", type=int, required=True)
    ap.add_argument("--timeout", type=float, default=120.0)
    a = ap.parse_args()
    addrs = a.addrs.split(",")
    n = len(addrs)
    if n < 2 or not 0 <= a.me < n:
        sys.exit(f"tcp_ring: --me {a.me} is not a place in a ring of {n} hosts")
    right = addrs[(a.me + 1) % n]

    lst = socket.socket()
    lst.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lst.bind((addrs[a.me], a.port))
    lst.listen(1)
    lst.settimeout(a.timeout)
    deadline = time.monotonic() + a.timeout
    while True:  # the right neighbour may not listen yet
        try:
            out = socket.create_connection((right, a.port), timeout=2)
            break
        except OSError as e:
            if time.monotonic() > deadline:
                sys.exit(f"tcp_ring: host {a.me} could not connect to {right}:{a.port}: {e}")
            time.sleep(0.05)
    inc, _ = lst.accept()
    for s in (out, inc):
        s.settimeout(a.timeout)
    # A start line: one byte round the ring twice, so every host starts within a link latency.
    for _ in range(2):
        if a.me == 0:
            out.sendall(b"s")
            inc.recv(1)
        else:
            inc.recv(1)
            out.sendall(b"s")

    chunk = b"\0" * (1 << 20)
    got = 0

    def receive():
        nonlocal got
        buf = bytearray(1 << 20)
        while got < a.bytes:
            k = inc.recv_into(buf)
            if k == 0:
                break
            got += k

    t0 = time.perf_counter()
    r = threading.Thread(target=receive)
    r.start()
    left = a.bytes
    while left > 0:
        k = min(left, len(chunk))
        out.sendall(chunk[:k])
        left -= k
    r.join()
    t = time.perf_counter() - t0
    if got != a.bytes:
        sys.exit(f"tcp_ring: host {a.me} received {got} of {a.bytes} bytes")
    print(json.dumps({"host": a.me, "bytes": a.bytes, "seconds": t}), flush=True)


if __name__ == "__main__":
    main()

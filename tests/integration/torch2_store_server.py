#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A TCPStore server and client speaking torch 2.x's wire protocol (stdlib only), for testing kft's
client where torch 2.x cannot be installed.

Written from PyTorch's sources (torch/csrc/distributed/c10d/TCPStoreBackend.hpp/.cpp,
TCPStoreLibUvBackend.cpp, TCPStore.cpp), not from kft's client. Two behaviours, as PyTorch has
two servers:

- ``classic`` (TCPStoreBackend.cpp, the poll-based server): a connection whose first request is
  not VALIDATE with the magic 0x3C85F7CE is dropped, and so is one with a wrong magic.
- ``libuv`` (TCPStoreLibUvBackend.cpp, torchrun's default since 2.4): a first request that is
  not VALIDATE is left unanswered (the libuv server returns without consuming it); a wrong magic
  likewise, and the connection is dropped when more bytes come. Keys over 8 KiB, values over
  8 MiB and more than 131072 keys in one request drop the connection; GET of an absent key
  answers an empty value (the classic server drops the connection instead).

Both drop a connection that sends an unknown query type or ADDs to a value that is not an
integer. Every request and reply is little-endian: u8 query type, then u64-length-prefixed
strings; see kft/rendezvous/torch_store.hpp for the table.

    python3 torch2_store_server.py [--backend classic|libuv] [--port P]   # serve until killed
"""
import argparse
import os
import socket
import struct
import threading

MAGIC = 0x3C85F7CE
(VALIDATE, SET, COMPARE_SET, GET, ADD, CHECK, WAIT, GETNUMKEYS, DELETE_KEY, APPEND, MULTI_GET, MULTI_SET,
 CANCEL_WAIT, PING, QUEUE_PUSH, QUEUE_POP, QUEUE_LEN) = range(17)
READY, NOT_READY = 0, 1  # CHECK's answers
STOP_WAITING, WAIT_CANCELED = 0, 1  # WAIT's and CANCEL_WAIT's
MAX_KEY_COUNT, MAX_STRING_LEN, MAX_PAYLOAD_LEN = 128 * 1024, 8 * 1024, 8 * 1024 * 1024  # the libuv server's limits


class NeedMore(Exception):
    """The buffer ends inside a request."""


class Drop(Exception):
    """The server closes the connection (what PyTorch's servers do on an error)."""


class Reader:
    def __init__(self, buf, limits):
        self.buf, self.pos, self.limits = buf, 0, limits

    def take(self, n):
        if len(self.buf) - self.pos < n:
            raise NeedMore()
        out = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return out

    def u8(self):
        return self.take(1)[0]

    def u32(self):
        return struct.unpack("<I", self.take(4))[0]

    def u64(self):
        return struct.unpack("<Q", self.take(8))[0]

    def i64(self):
        return struct.unpack("<q", self.take(8))[0]

    def key(self):
        n = self.u64()
        if self.limits and n > MAX_STRING_LEN:
            raise Drop("key of %d bytes" % n)
        return self.take(n).decode("utf-8", "surrogateescape")

    def payload(self):
        n = self.u64()
        if self.limits and n > MAX_PAYLOAD_LEN:
            raise Drop("payload of %d bytes" % n)
        return self.take(n)

    def count(self):
        n = self.u64()
        if self.limits and n > MAX_KEY_COUNT:
            raise Drop("%d keys" % n)
        return n


def vec(b):
    return struct.pack("<Q", len(b)) + b


class Conn:
    def __init__(self, server, sock, number):
        self.server, self.sock, self.number = server, sock, number
        self.send_lock = threading.Lock()
        self.buf = bytearray()
        self.first = True  # not yet past its first request (libuv: "miscellaneous")
        self.validated = False
        self.queries = []  # query types served, in order
        self.closed_because = None

    def send(self, data):
        with self.send_lock:
            try:
                self.sock.sendall(data)
            except OSError:
                pass


class Server:
    def __init__(self, backend="classic", host="127.0.0.1", port=0):
        assert backend in ("classic", "libuv")
        self.backend = backend
        self.lock = threading.Lock()
        self.data = {}
        self.queues = {}
        self.waiting = {}  # key -> [Conn]
        self.awaited = {}  # Conn -> number of keys it still waits for
        self.conns = []
        self.listener = socket.create_server((host, port))
        self.port = self.listener.getsockname()[1]
        self.stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    # ---- connections --------------------------------------------------------------------------
    def _accept(self):
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self.lock:
                if self.stopped:
                    sock.close()
                    return
                c = Conn(self, sock, len(self.conns))
                self.conns.append(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        try:
            while True:
                chunk = c.sock.recv(65536)
                if not chunk:
                    raise Drop("the client closed the connection")
                c.buf += chunk
                self._process(c)
        except Drop as e:
            c.closed_because = str(e)
        except OSError as e:
            c.closed_because = "socket error: %s" % e
        with self.lock:
            self._clear_wait(c)
        try:
            c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        c.sock.close()

    def _process(self, c):
        """Serves every complete request in c.buf, the way the chosen server parses them."""
        while c.buf:
            r = Reader(c.buf, self.backend == "libuv")
            if self.backend == "libuv":
                # The libuv server takes a client off its "miscellaneous" list at the first bytes it
                # reads, whatever they are; only then does it look at the query type.
                if c.first:
                    c.first = False
                    q = r.u8()
                    if q != VALIDATE:
                        return  # left unconsumed and unanswered; parsed as a request when more bytes come
                    try:
                        if r.u32() != MAGIC:
                            return  # likewise; the next bytes start with VALIDATE again, which drops it
                    except NeedMore:
                        return  # (the next bytes restart at VALIDATE, which drops it)
                    c.validated = True
                    del c.buf[:r.pos]
                    continue
                q = r.u8()
                if q == VALIDATE:
                    raise Drop("VALIDATE after the first request")
            else:
                q = r.u8()
                if c.first:
                    if q != VALIDATE:
                        raise Drop("first request %d is not VALIDATE" % q)
                    try:
                        magic = r.u32()
                    except NeedMore:
                        return  # (the classic server blocks reading the magic)
                    if magic != MAGIC:
                        raise Drop("VALIDATE with magic 0x%08x" % magic)
                    c.first = False
                    c.validated = True
                    del c.buf[:r.pos]
                    continue
                if q == VALIDATE or q > PING:
                    raise Drop("unknown query %d" % q)
            try:
                self._request(c, q, r)
            except NeedMore:
                return
            del c.buf[:r.pos]

    # ---- requests (c.buf holds at least one whole request, or NeedMore is raised first) --------
    def _request(self, c, q, r):
        if q == PING:
            nonce = r.u32()
            c.queries.append(q)
            c.send(struct.pack("<I", nonce))
            return
        if q == SET:
            key, value = r.key(), r.payload()
            with self.lock:
                c.queries.append(q)
                self.data[key] = value
                self._wake(key)
        elif q == COMPARE_SET:
            key, expected, desired = r.key(), r.payload(), r.payload()
            with self.lock:
                c.queries.append(q)
                if key not in self.data:
                    if expected == b"":
                        self.data[key] = desired
                        out = desired
                    else:
                        out = expected  # (PyTorch answers the expectation for an absent key)
                else:
                    if self.data[key] == expected:
                        self.data[key] = desired
                    out = self.data[key]
                if self.backend == "libuv":
                    self._wake(key)  # (even when nothing was set; the classic server wakes no one here)
            c.send(vec(out))
        elif q == GET:
            key = r.key()
            with self.lock:
                c.queries.append(q)
                if key not in self.data and self.backend == "classic":
                    raise Drop("GET of absent key %r" % key)
                value = self.data.get(key, b"")
            c.send(vec(value))
        elif q == ADD:
            key, delta = r.key(), r.i64()
            with self.lock:
                c.queries.append(q)
                if key in self.data:
                    try:
                        delta += int(self.data[key].decode())
                    except ValueError:
                        raise Drop("ADD to %r, which holds no integer" % key)
                self.data[key] = str(delta).encode()
                self._wake(key)
            c.send(struct.pack("<q", delta))
        elif q in (CHECK, WAIT):
            keys = [r.key() for _ in range(r.count())]
            with self.lock:
                c.queries.append(q)
                present = all(k in self.data or self.queues.get(k) for k in keys)
                if q == CHECK:
                    c.send(bytes([READY if present else NOT_READY]))
                elif present:
                    c.send(bytes([STOP_WAITING]))
                else:
                    missing = [k for k in keys if k not in self.data]
                    for k in missing:
                        self.waiting.setdefault(k, []).append(c)
                    self.awaited[c] = len(missing)
        elif q == GETNUMKEYS:
            with self.lock:
                c.queries.append(q)
                n = len(self.data)
            c.send(struct.pack("<q", n))
        elif q == DELETE_KEY:
            key = r.key()
            with self.lock:
                c.queries.append(q)
                n = 1 if self.data.pop(key, None) is not None else 0
            c.send(struct.pack("<q", n))
        elif q == APPEND:
            key, value = r.key(), r.payload()
            with self.lock:
                c.queries.append(q)
                self.data[key] = self.data.get(key, b"") + value
                self._wake(key)
        elif q == MULTI_GET:
            keys = [r.key() for _ in range(r.count())]
            with self.lock:
                c.queries.append(q)
                if self.backend == "classic" and any(k not in self.data for k in keys):
                    raise Drop("MULTI_GET of an absent key")
                out = b"".join(vec(self.data.get(k, b"")) for k in keys)
            c.send(out)
        elif q == MULTI_SET:
            pairs = [(r.key(), r.payload()) for _ in range(r.count())]
            with self.lock:
                c.queries.append(q)
                for key, value in pairs:
                    self.data[key] = value
                    self._wake(key)
        elif q == CANCEL_WAIT:
            with self.lock:
                c.queries.append(q)
                self._clear_wait(c)
            c.send(bytes([WAIT_CANCELED]))
        elif q in (QUEUE_PUSH, QUEUE_POP, QUEUE_LEN) and self.backend == "libuv":
            key = r.key()
            value = r.payload() if q == QUEUE_PUSH else None
            with self.lock:
                c.queries.append(q)
                queue = self.queues.setdefault(key, [])
                if q == QUEUE_PUSH:
                    queue.append(value)
                    self._wake(key, one=True)
                elif q == QUEUE_LEN:
                    c.send(struct.pack("<q", len(queue)))
                else:
                    out = struct.pack("<q", len(queue)) + (vec(queue.pop(0)) if queue else b"")
                    c.send(out)
        else:
            raise Drop("unknown query %d" % q)

    def _wake(self, key, one=False):
        """Answers the WAITs that were missing only `key` (self.lock held)."""
        for c in list(self.waiting.get(key, [])):
            self.awaited[c] -= 1
            if self.awaited[c] == 0:
                del self.awaited[c]
                c.send(bytes([STOP_WAITING]))
                if one:
                    self.waiting[key].remove(c)
                    return
        if not one:
            self.waiting.pop(key, None)

    def _clear_wait(self, c):
        self.awaited.pop(c, None)
        for key in list(self.waiting):
            self.waiting[key] = [w for w in self.waiting[key] if w is not c]
            if not self.waiting[key]:
                del self.waiting[key]

    # ---- for tests ----------------------------------------------------------------------------
    def stop(self):
        """The server goes away: the listener and every connection close."""
        with self.lock:
            self.stopped = True
            conns = list(self.conns)
        self.listener.close()
        for c in conns:
            try:
                c.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def connections(self):
        with self.lock:
            return [(c.number, c.validated, list(c.queries), c.closed_because) for c in self.conns]


class Client:
    """torch 2.x's TCPStore client, as TCPStore.cpp connects: VALIDATE, then PING; keys get "/"."""

    def __init__(self, host, port, timeout=30.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.sendall(bytes([VALIDATE]) + struct.pack("<I", MAGIC))
        nonce = os.getpid() & 0xffffffff
        self.sock.sendall(bytes([PING]) + struct.pack("<I", nonce))
        if self._exact(4) != struct.pack("<I", nonce):
            raise RuntimeError("PING answered with another nonce")

    def _exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the server closed the connection")
            out += chunk
        return out

    @staticmethod
    def _key(k):
        return vec(("/" + k).encode())

    def set(self, key, value):
        value = value.encode() if isinstance(value, str) else value
        self.sock.sendall(bytes([SET]) + self._key(key) + vec(value))

    def wait(self, keys, timeout):
        self.sock.sendall(bytes([WAIT]) + struct.pack("<Q", len(keys)) + b"".join(self._key(k) for k in keys))
        self.sock.settimeout(timeout.total_seconds() if hasattr(timeout, "total_seconds") else timeout)
        try:
            reply = self._exact(1)[0]
        except socket.timeout:
            self.sock.settimeout(30.0)
            self.sock.sendall(bytes([CANCEL_WAIT]))
            if self._exact(1)[0] != WAIT_CANCELED:
                self._exact(1)
            raise TimeoutError("wait for %s timed out" % keys)
        self.sock.settimeout(30.0)
        if reply != STOP_WAITING:
            raise RuntimeError("WAIT answered %d" % reply)

    def get(self, key):
        self.wait([key], 30.0)
        self.sock.sendall(bytes([GET]) + self._key(key))
        return self._exact(struct.unpack("<Q", self._exact(8))[0])

    def add(self, key, delta):
        self.sock.sendall(bytes([ADD]) + self._key(key) + struct.pack("<q", delta))
        return struct.unpack("<q", self._exact(8))[0]

    def num_keys(self):
        self.sock.sendall(bytes([GETNUMKEYS]))
        return struct.unpack("<q", self._exact(8))[0]

    def close(self):
        self.sock.close()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--backend", choices=("classic", "libuv"), default="libuv")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    a = ap.parse_args()
    srv = Server(a.backend, a.host, a.port)
    print("torch 2.x TCPStore (%s) on %s:%d" % (a.backend, a.host, srv.port), flush=True)
    threading.Event().wait()

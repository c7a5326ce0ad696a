#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The rendezvous store at scale (issue 47): N clients meet through kft's TCP store and through
torch 1.13's TCPStore, the same workload in the same script.

    /usr/bin/python3 bench/store/store_scale.py [--build BUILD] [--sizes 1000 4000 16000] [--procs 4]
                                                [--repeats 1] [--stores kft torch] [--timeout 300]

For each N and each store, alternated (kft first in even repeats, torch first in odd ones):

  server   its own process: `store_scale serve` (kft's tcp_store_server, a fresh token) or
           Debian's /usr/bin/python3 with `torch.distributed.TCPStore(is_master=True)` (torch 1.13:
           one thread polling every connection)
  clients  --procs processes of `store_scale clients`, N / procs threads each, one connection
           per client; client i binds 127.c.b.a (its own address of 127.0.0.0/8) before it connects.
           kft: kft's tcp_store with the token. torch: kft's client of torch's TCPStore
           (rendezvous/torch_store.hpp: torch 1.13's wire protocol, the same queries torch's own
           C++ client sends; its `get` is WAIT + GET as in torch's client). The same client code
           and threads on both sides, so the stores are what differs. (torch 1.13's own Python
           TCPStore client opens two connections per client, the second for watchKey callbacks,
           and a thread: 16,000 of them would need 32,000 connections, over one process's 20,000
           open files.)

The phases, each started in every client process at once and timed from the first start to the
last client's end (CLOCK_MONOTONIC, one machine): connect (and authenticate), rank (add), publish
(set its address), read (get one peer's address: rank + 1's), barrier (add; the last sets; get),
leave (close). Printed: the CPU, the date, the load, then one row per N and store with each
phase's seconds (the median over --repeats), the total of connect..barrier and the server's
memory per connection (RSS once all are connected less RSS before, / N). Every run is checked:
every client finished every phase without an error (else the script stops, naming the first).
A benchmark: it prints numbers, it never passes or fails on them.

    /usr/bin/python3 bench/store/store_scale.py --relay [--sizes 65536] [--procs 16] [--ranks-per-node 8]

A job laid out as it would be at that size: N / 8 nodes x 8 ranks, each node's ranks going
through their node's relay (tcp_store_server with `upstream`: one connection per node to the
job's store, requests combined on the way). --procs processes of `store_scale nodes` each hold
N / 8 / procs nodes: their relays (one thread each, on the node's own address of 127.0.0.0/8)
and their ranks (one event-driven thread for all of them: a thread per rank would not fit
65,536 in this machine's 32,768 process ids). The same phases, timed the same way; "connect"
includes the relays connecting to the job's store. Printed beside the direct rows: the job
store's connections once all connected (one per node) and its requests per rank.
"""
import argparse
import datetime
import os
import resource
import secrets
import select
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "common"))
import kftbench  # noqa: E402

PHASES = ["connect", "rank", "publish", "read", "barrier", "leave"]
TIMED = PHASES[:5]  # the total
TORCH_PYTHON = "/usr/bin/python3"


def parse():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=os.path.join(kftbench.REPO, "build-tests"))
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000], help="clients N")
    ap.add_argument("--procs", type=int, default=4, help="client processes (N / procs threads each)")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each store at each N, alternated")
    ap.add_argument("--stores", nargs="+", default=["kft", "torch"], choices=["kft", "torch"])
    ap.add_argument("--timeout", type=int, default=300, help="seconds any one wait of a client may take")
    ap.add_argument("--relay", action="store_true", help="N / 8 nodes x 8 ranks, through a relay per node (kft only)")
    ap.add_argument("--ranks-per-node", type=int, default=8, help="--relay: ranks of each node")
    ap.add_argument("--torch-server", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.relay:
        if "--sizes" not in sys.argv:
            a.sizes = [65536]
        if "--procs" not in sys.argv:
            a.procs = 16
        a.stores = ["kft"]
        for n in a.sizes:
            if n % (a.ranks_per_node * a.procs) != 0:
                ap.error(f"--relay: N = {n} is not a multiple of --ranks-per-node x --procs")
    if a.procs < 1 or any(n < a.procs for n in a.sizes):
        ap.error("every N must be at least --procs, which must be at least 1")
    return a


def rss_kib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1


def torch_server(timeout):
    """The torch side's server process: torch 1.13's TCPStore master, answering "stats" lines."""
    import torch.distributed as dist
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=timeout), wait_for_workers=False)
    print(f"port {store.port}", flush=True)
    for line in sys.stdin:
        if line.strip() == "stats":
            print(f"stats rss_kib {rss_kib()} connected {len(os.listdir('/proc/self/fd'))} requests - dropped -",
                  flush=True)
    del store


class child:
    """A process of the run, in a session of its own, spoken to by lines with deadlines."""

    def __init__(self, cmd, what):
        self.what = what
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     bufsize=0, start_new_session=True)
        self.buf = b""

    def send(self, line):
        self.proc.stdin.write((line + "\n").encode())
        self.proc.stdin.flush()

    def read_line(self, deadline):
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                self.fail("gave no answer before its deadline")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 1.0))
            if ready:
                chunk = os.read(self.proc.stdout.fileno(), 65536)
                if not chunk:
                    self.fail("ended")
                self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        return line.decode()

    def fail(self, why):
        self.kill()
        err = self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
        sys.exit(f"{kftbench.who()}: {self.what} {why} (exit {self.proc.poll()}): {err[-2000:]}")

    def kill(self):
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def close(self, deadline):
        """Closes its standard input (the end of its part) and waits for it to exit."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            self.fail("did not exit after its input closed")


def stats(server, deadline):
    """The server's numbers now: rss_kib, connected, requests, dropped (torch's: "-" where it has none)."""
    server.send("stats")
    f = server.read_line(deadline).split()
    return dict(zip(f[1::2], f[2::2]))


def conntrack_room(need, limit_s=180):
    """Where the kernel tracks connections (nf_conntrack, loaded by iptables: the namespace tests
    load it), a full table drops new connections' packets (they time out). Waits, up to
    limit_s, until the table has room for `need` more (the last run's closed connections are
    kept there a while), saying so."""
    try:
        with open("/proc/sys/net/netfilter/nf_conntrack_max") as f:
            most = int(f.read())
    except OSError:
        return
    said = False
    until = time.monotonic() + limit_s
    while True:
        with open("/proc/sys/net/netfilter/nf_conntrack_count") as f:
            count = int(f.read())
        if count + need <= most:
            return
        if not said:
            print(f"# the kernel's connection tracking table holds {count} of {most} entries, {need} more are "
                  f"needed: waiting for old entries to expire (at most {limit_s} s)", flush=True)
            said = True
        if time.monotonic() >= until:
            print("# still not enough room: connections of this run may time out", flush=True)
            return
        time.sleep(2)


def one_run(a, n, store):
    program = kftbench.bench_program(a.build, "store_scale")
    token = secrets.token_hex(16)
    conntrack_room(n + (n // a.ranks_per_node if a.relay else 0) + 1000)
    limit = time.monotonic() + 2 * a.timeout + 120
    if store == "kft":
        server = child([program, "serve"], "the kft store server")
        server.send(token)
    else:
        server = child([TORCH_PYTHON, os.path.abspath(__file__), "--torch-server", "--timeout", str(a.timeout)],
                       "torch's TCPStore server")
    procs = []
    try:
        port = int(server.read_line(time.monotonic() + 60).split()[1])
        rss_before = stats(server, time.monotonic() + 60)
        if a.relay:  # nodes of --ranks-per-node ranks, the same number in each process
            nodes_each = n // a.ranks_per_node // a.procs
            for i in range(a.procs):
                c = child([program, "nodes", "--port", str(port), "--world", str(n), "--first-node", str(i * nodes_each),
                           "--nodes", str(nodes_each), "--ranks-per-node", str(a.ranks_per_node), "--timeout",
                           str(a.timeout)], f"node process {i}")
                c.send(token)
                procs.append(c)
        else:
            per = [n // a.procs + (1 if i < n % a.procs else 0) for i in range(a.procs)]
            first = 0
            for i, count in enumerate(per):
                c = child([program, "clients", "--protocol", store, "--port", str(port), "--world", str(n), "--first",
                           str(first), "--count", str(count), "--timeout", str(a.timeout)], f"client process {i} ({store})")
                if store == "kft":
                    c.send(token)
                procs.append(c)
                first += count
        for c in procs:
            if c.read_line(time.monotonic() + 120) != "ready":
                c.fail("did not say ready")
        times, rss_after, reconnects = {}, None, 0
        for phase in PHASES:
            for c in procs:
                c.send("go " + phase)
            starts, ends = [], []
            for c in procs:
                f = c.read_line(limit).split(" ", 6)
                if len(f) < 6 or f[0] != "done" or f[1] != phase:
                    c.fail(f"answered {' '.join(f)!r} to go {phase}")
                starts.append(int(f[2]))
                ends.append(int(f[3]))
                if int(f[4]) != 0:
                    c.fail(f"had {f[4]} client(s) fail in phase {phase}; the first: {f[6] if len(f) > 6 else '?'}")
                reconnects += int(f[5])
            times[phase] = (max(ends) - min(starts)) / 1e9
            if phase == "connect":
                rss_after = stats(server, time.monotonic() + 60)
        end = stats(server, time.monotonic() + 60)
        for c in procs:
            c.close(time.monotonic() + 60)
        server.close(time.monotonic() + 60)
        times["total"] = sum(times[p] for p in TIMED)
        times["rss_per_client_b"] = (int(rss_after["rss_kib"]) - int(rss_before["rss_kib"])) * 1024 / n
        times["connections"] = int(rss_after["connected"]) if rss_after["connected"] != "-" else 0
        times["requests_per_rank"] = int(end["requests"]) / n if end["requests"] != "-" else 0.0
        # Connections made again: the bench's own retries (torch), or those the kft server turned away
        # before their hello was read (its client connects again by itself).
        times["reconnects"] = reconnects + (int(end["dropped"]) if end["dropped"] != "-" else 0)
        return times
    except BaseException:
        for c in procs + [server]:
            c.kill()
        raise


def torch_available():
    if not os.access(TORCH_PYTHON, os.X_OK):
        return False
    return subprocess.run([TORCH_PYTHON, "-c", "import torch.distributed as d; d.TCPStore"], capture_output=True).returncode == 0


def main():
    a = parse()
    if a.torch_server:
        torch_server(a.timeout)
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # every child may open what the hard limit allows
    need = (max(a.sizes) // a.ranks_per_node if a.relay else max(a.sizes)) + 64
    if hard != resource.RLIM_INFINITY and need > hard:
        sys.exit(f"{kftbench.who()}: N = {max(a.sizes)} needs {need} open files in the server's process; "
                 f"the hard limit here is {hard} (ulimit -Hn)")
    stores = list(a.stores)
    if "torch" in stores and not torch_available():
        print(f"# torch: {TORCH_PYTHON} cannot import torch.distributed.TCPStore (Debian: python3-torch): kft only")
        stores.remove("torch")
    program = kftbench.bench_program(a.build, "store_scale")
    if not os.access(program, os.X_OK):
        sys.exit(f"{kftbench.who()}: {program} is not built (ninja -C {a.build} store_scale)")
    try:
        with open("/proc/sys/net/core/somaxconn") as f:
            somaxconn = f.read().strip()
    except OSError:
        somaxconn = "?"
    print(f"# {kftbench.cpu_description()}, {os.cpu_count()} CPUs; {datetime.datetime.now().isoformat(timespec='seconds')}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"# open files per process {hard}; net.core.somaxconn {somaxconn}; {a.procs} client processes; "
          f"repeats {a.repeats}; timeout {a.timeout} s")
    results = {}
    for n in a.sizes:
        for r in range(a.repeats):
            order = stores if r % 2 == 0 else list(reversed(stores))
            for store in order:
                t = one_run(a, n, store)
                results.setdefault((n, store), []).append(t)
                print(f"# N {n} {store}{' through relays' if a.relay else ''} run {r + 1}: total {t['total']:.3f} s "
                      f"({', '.join(f'{p} {t[p]:.3f}' for p in PHASES)}); server {t['rss_per_client_b']:.0f} B per client; "
                      f"{t['reconnects']} connection(s) made again; the job's store held {t['connections']} "
                      f"connection(s) and served {t['requests_per_rank']:.2f} request(s) per rank",
                      flush=True)
    print(f"# load average at the end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print()
    cols = ["connect", "rank (add)", "publish (set)", "read a peer (get)", "barrier (add + get)", "total", "leave",
            "server memory per client", "connections made again", "store's connections", "store requests per rank"]
    print("| N | store | " + " | ".join(cols) + " |")
    print("| --- | --- |" + " --- |" * len(cols))
    for n in a.sizes:
        for store in stores:
            runs = results[(n, store)]
            med = {k: statistics.median(t[k] for t in runs) for k in runs[0]}
            cells = [f"{med[p]:.3f}" for p in TIMED] + [f"{med['total']:.3f}", f"{med['leave']:.3f}",
                                                         f"{med['rss_per_client_b'] / 1024:.1f} KiB", f"{med['reconnects']:g}",
                                                         f"{med['connections']:g}", f"{med['requests_per_rank']:.2f}"]
            label = f"{store} via {n // a.ranks_per_node} relays" if a.relay else store
            print(f"| {n} | {label} | " + " | ".join(cells) + " |")
    print()
    print("Seconds (median of the repeats); total = connect + rank + publish + read + barrier.")


if __name__ == "__main__":
    main()

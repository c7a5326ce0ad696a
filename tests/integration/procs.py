# SPDX-License-Identifier: Apache-2.0
"""What the Python process tests share: expect(), the one check; finding a test's processes by a
marker in their command line; and checking that a job left nothing behind (/dev/shm entries,
listening ports, files). The scripts run as `python3 tests/integration/<script>.py`, so this
folder is on their path."""
import os
import socket
import subprocess
import sys

checks = 0    # expect() calls so far
failures = 0  # expect(..., fatal=False) calls that failed


def expect(cond, what, *context, fatal=True):
    """One check: prints "ok: WHAT" or "FAIL: WHAT" (flushed, so it stands in order with the
    output of the commands a test runs). A failed check prints each item of `context` (a
    finished process as its exit status and the ends of its output; None is left out), then
    exits 1 (fatal, the default: the checks after it would read a broken state) or, with
    fatal=False, counts itself in `failures` and returns (a matrix of independent cases runs
    on; the script exits by `failures` at its end)."""
    global checks, failures
    checks += 1
    print(("ok: " if cond else "FAIL: ") + what, flush=True)
    if cond:
        return
    for c in context:
        if c is None:
            continue
        if isinstance(c, subprocess.CompletedProcess):
            c = f"exit={c.returncode}\nstdout: {c.stdout[-1500:]!r}\nstderr: {c.stderr[-1500:]!r}"
        text = str(c)
        print(text if len(text) <= 10000 else f"... ({len(text) - 10000} characters before)\n{text[-10000:]}",
              flush=True)
    if fatal:
        sys.exit(1)
    failures += 1


def marked_processes(mark, skip=()):
    """'pid: command line' of every live (not zombie) process whose command line holds `mark`
    and none of `skip`."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if mark in cmd and state != "Z" and not any(s in cmd for s in skip):
            found.append(f"{pid}: {cmd}")
    return found


def free_port():
    """A TCP port on 127.0.0.1 that nothing used a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port):
    """Whether something accepts connections on 127.0.0.1:`port`."""
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def kft_shm():
    """kft's entries in /dev/shm (there should never be any: segments are anonymous memfds)."""
    return sorted(f for f in os.listdir("/dev/shm") if f.startswith("kft-"))


def files_under(root):
    """Every file and directory below `root` (a test's private TMPDIR / XDG_RUNTIME_DIR)."""
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, dirs, files in os.walk(root) for n in dirs + files)

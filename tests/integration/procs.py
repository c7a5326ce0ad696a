# SPDX-License-Identifier: Apache-2.0
"""What the Python process tests share: finding a test's processes by a marker in their command
line, and checking that a job left nothing behind (/dev/shm entries, listening ports, files)."""
import os
import socket


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

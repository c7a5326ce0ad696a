"""Finding a test's processes by a marker in their command line (shared by the Python tests)."""
import os


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

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""bench/README.md names every file under bench/.

    python3 tests/repo/bench_readme.py [REPO]

A file is named when its path below bench/ stands in the README between backticks: `sizes.hpp`
does not name common/sizes.hpp, `common/sizes.hpp` does (a file at the top of bench/ is named
by its bare name). The README itself, dot files and Python's caches are not counted.
Exit 0 when every file is named; 1 listing those that are not.
"""
import os
import re
import sys

repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
bench = os.path.join(repo, "bench")
try:
    with open(os.path.join(bench, "README.md"), encoding="utf-8") as f:
        named = set(re.findall(r"`([^`\s]+)`", f.read()))
except OSError as e:
    sys.exit(f"bench_readme: bench/README.md: {e.strerror}")

files = []
for root, dirs, names in os.walk(bench):
    dirs[:] = sorted(d for d in dirs if d != "__pycache__" and not d.startswith("."))
    for name in sorted(names):
        if name.startswith(".") or name.endswith(".pyc"):
            continue
        rel = os.path.relpath(os.path.join(root, name), bench).replace(os.sep, "/")
        if rel != "README.md":
            files.append(rel)

missing = [f for f in files if f not in named]
if missing:
    print(f"bench_readme: {len(missing)} of {len(files)} files under bench/ are not named in bench/README.md "
          "(as `folder/file` in backticks):")
    for f in missing:
        print(f"  bench/{f}")
    sys.exit(1)
print(f"bench_readme: bench/README.md names all {len(files)} files under bench/")

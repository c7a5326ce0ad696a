#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kft is Apache-2.0: the licence and notice are at the root, and every source file says so.

    python3 tests/repo/licence.py [REPO]

1. LICENSE holds the Apache License 2.0 text and NOTICE names kft.
2. Every source file of the repository (C++, CUDA, Python, shell, CMake, the CI entry point)
   carries `SPDX-License-Identifier: Apache-2.0` in its first five lines. Upstream data kept
   byte-identical (the CRDs under tests/manifest/schemas) is not kft's source and is skipped.
Exit 0 when both hold; 1 naming every file at fault otherwise.
"""
import os
import re
import sys

repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SOURCE_EXT = (".hpp", ".cpp", ".cu", ".cuh", ".h", ".c", ".py", ".sh", ".cmake", ".in")
SKIP_DIRS = {".git", "__pycache__", "schemas", "node_modules"}
TAG = "SPDX-License-Identifier: Apache-2.0"

problems = []
try:
    with open(os.path.join(repo, "LICENSE"), encoding="utf-8") as f:
        text = f.read()
    if "Apache License" not in text or "Version 2.0, January 2004" not in text or "END OF TERMS AND CONDITIONS" not in text:
        problems.append("LICENSE: not the Apache License 2.0 text")
except OSError as e:
    problems.append(f"LICENSE: {e.strerror}")
try:
    with open(os.path.join(repo, "NOTICE"), encoding="utf-8") as f:
        if "kft" not in f.read():
            problems.append("NOTICE: does not name kft")
except OSError as e:
    problems.append(f"NOTICE: {e.strerror}")

count = 0
for root, dirs, names in os.walk(repo):
    rel_root = os.path.relpath(root, repo)
    dirs[:] = sorted(d for d in dirs if d not in SKIP_DIRS and not d.startswith(("build", "_")))
    for n in sorted(names):
        rel = os.path.normpath(os.path.join(rel_root, n))
        if not (n.endswith(SOURCE_EXT) or n == "CMakeLists.txt" or rel == os.path.join(".ci", "run")):
            continue
        count += 1
        try:
            with open(os.path.join(root, n), encoding="utf-8") as f:
                head = [next(f, "") for _ in range(5)]
        except (UnicodeDecodeError, OSError) as e:
            problems.append(f"{rel}: unreadable ({e})")
            continue
        if not any(TAG in line for line in head):
            problems.append(f"{rel}: no '{TAG}' line in its first five lines")

if count < 100:
    problems.append(f"only {count} source files found under {repo}: is this the repository?")
for p in problems:
    print("licence:", p)
print(f"licence: {count} source files checked, {len(problems)} problem(s)")
sys.exit(1 if problems else 0)

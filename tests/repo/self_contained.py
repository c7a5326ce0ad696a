#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The repository reads nothing outside itself: a clone placed anywhere passes its own tests.

    python3 tests/repo/self_contained.py [REPO]

1. No file of the build, tests, benches, examples, tools or CI names a path outside the
   repository: a sibling checkout ("../shared", "../../x"), this machine's parent directory, or
   a home directory.
2. The manifest validator's self-test (the one suite that reads upstream data files) passes
   from a copy of tests/manifest placed in a fresh directory with nothing beside it.
Exit 0 when both hold; 1 with the offending lines otherwise.
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile

repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
SCANNED = ("CMakeLists.txt", "cmake", "tests", "bench", "examples", "tools", ".ci", "k8s-templates")
SKIP_DIRS = {".git", "__pycache__", "schemas"}  # schemas: upstream data, byte-identical copies
parent = os.path.dirname(repo)
patterns = [
    (re.compile(r"\.\./(\.\./)*shared\b"), "a sibling checkout (../shared)", ""),
    (re.compile(r"(?<![\w.])\.\./\.\./\.\./"), "a path three levels up", ""),
    # (not in YAML manifests, and not the MPI Operator's paths inside a container image, which
    # kft-manifest and tools/image/ write: /home/mpiuser/ and /root/.ssh)
    (re.compile(r"/home/(?!mpiuser/)[A-Za-z0-9_.-]+/|(?<![\w.])/root/(?!\.ssh\b)"), "a home directory", "no-yaml"),
]
if parent not in ("/", ""):
    patterns.append((re.compile(re.escape(parent.rstrip("/") + "/")), "this machine's parent directory " + parent, ""))


def files():
    for top in SCANNED:
        path = os.path.join(repo, top)
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, names in os.walk(path):
            dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.startswith("build")]
            for n in names:
                yield os.path.join(root, n)


problems = []
this = os.path.abspath(__file__)
count = 0
for path in files():
    if os.path.abspath(path) == this:
        continue
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (UnicodeDecodeError, OSError):
        continue  # binary (images)
    count += 1
    for lineno, line in enumerate(text.splitlines(), 1):
        for rx, what, only in patterns:
            if only == "no-yaml" and path.endswith((".yaml", ".yml")):
                continue
            if rx.search(line):
                problems.append(f"{os.path.relpath(path, repo)}:{lineno}: names {what}: {line.strip()[:160]}")
print(f"self_contained: scanned {count} files under {', '.join(SCANNED)}")

# The validator's self-test from a copy with no siblings: schemas found inside the copy or not at all.
lonely = tempfile.mkdtemp(prefix="kft-alone-")
try:
    copy = os.path.join(lonely, "clone", "tests", "manifest")
    shutil.copytree(os.path.join(repo, "tests", "manifest"), copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if k != "KFT_SCHEMAS_DIR"}
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    p = subprocess.run([python, os.path.join(copy, "test_validator.py")], capture_output=True, text=True,
                       env=env, cwd=lonely, timeout=600)
    tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or ["(no output)"]
    if p.returncode != 0:
        problems.append(f"validator self-test from a copy in {lonely}/clone exited {p.returncode}: {tail[0]}")
    else:
        print(f"self_contained: validator self-test passes from a lone copy: {tail[0]}")
finally:
    shutil.rmtree(lonely, ignore_errors=True)

for p in problems:
    print("FAIL", p)
print(f"self_contained: {len(problems)} problem(s)")
sys.exit(1 if problems else 0)

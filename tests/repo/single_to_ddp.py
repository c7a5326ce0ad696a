#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""docs/ddp.md shows the diff between examples/10-single-to-ddp/single.cpp and ddp.cpp as it is,
and the two programs differ in three places only (join the job, wrap the model, shard the data):
3 lines removed, 5 added (the include with the join).

    python3 tests/repo/single_to_ddp.py [REPO]          # check
    python3 tests/repo/single_to_ddp.py [REPO] --print  # the diff block, for the page

Exit 0 when the page's ```diff block is the files' unified diff and the counts hold; 1 naming
what differs.
"""
import difflib
import os
import re
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
repo = os.path.abspath(args[0] if args else os.path.join(os.path.dirname(__file__), "..", ".."))
ex = os.path.join(repo, "examples", "10-single-to-ddp")
try:
    single = open(os.path.join(ex, "single.cpp"), encoding="utf-8").read().splitlines()
    ddp = open(os.path.join(ex, "ddp.cpp"), encoding="utf-8").read().splitlines()
    page = open(os.path.join(repo, "docs", "ddp.md"), encoding="utf-8").read()
except OSError as e:
    sys.exit(f"single_to_ddp: {e.filename}: {e.strerror}")

diff = list(difflib.unified_diff(single, ddp, "single.cpp", "ddp.cpp", n=3, lineterm=""))
if "--print" in sys.argv:
    print("```diff\n" + "\n".join(diff) + "\n```")
    sys.exit(0)
removed = [l for l in diff[2:] if l.startswith("-")]
added = [l for l in diff[2:] if l.startswith("+")]
problems = []
if len(removed) != 3 or len(added) != 5:
    problems.append(f"the programs differ in {len(removed)} removed and {len(added)} added lines (want 3 and 5: "
                    "join the job, wrap the model, shard the data)")
blocks = re.findall(r"```diff\n(.*?)\n```", page, re.S)
want = "\n".join(diff)
if want not in blocks:
    problems.append("docs/ddp.md has no ```diff block equal to the files' unified diff "
                    "(python3 tests/repo/single_to_ddp.py --print gives it)")
for p in problems:
    print(f"single_to_ddp: {p}")
sys.exit(1 if problems else 0)

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every KFT_* option or cache variable kft's build declares is a row of docs/building.md's tables.

    python3 tests/package/options_doc.py [REPO]

Scans CMakeLists.txt and *.cmake files of kft's own build (a directory with its own project(),
such as a test's consumer project, is a separate build and is skipped) for option(KFT_...) and
set(KFT_... CACHE ...). A name built from a loop variable (KFT_WITH_${_comp}) must match a
documented name by its fixed prefix. Prints each undocumented name; exit 1 when there is one.
"""
import os
import re
import sys

repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
doc_path = os.path.join(repo, "docs", "building.md")
with open(doc_path, encoding="utf-8") as f:
    rows = [line for line in f if line.startswith("|")]
documented = set()
for row in rows:
    documented.update(re.findall(r"`(KFT_[A-Z0-9_]+)", row))

decl = re.compile(r"^\s*(?:option\(\s*(KFT_[A-Za-z0-9_${}]+)|set\(\s*(KFT_[A-Za-z0-9_${}]+)\s[^)]*\bCACHE\b)", re.M)
declared = {}
for root, dirs, files in os.walk(repo):
    rel = os.path.relpath(root, repo)
    dirs[:] = [d for d in dirs if not d.startswith((".", "build", "_"))]
    if rel != "." and os.path.exists(os.path.join(root, "CMakeLists.txt")):
        with open(os.path.join(root, "CMakeLists.txt"), encoding="utf-8") as f:
            if re.search(r"^\s*project\(", f.read(), re.M):
                dirs[:] = []
                continue
    for name in files:
        if name == "CMakeLists.txt" or name.endswith(".cmake"):
            path = os.path.join(root, name)
            with open(path, encoding="utf-8") as f:
                text = f.read()
            for m in decl.finditer(text):
                declared.setdefault(m.group(1) or m.group(2), os.path.relpath(path, repo))

missing = []
for name, where in sorted(declared.items()):
    if "${" in name:
        prefix = name.split("${")[0]
        if not any(d.startswith(prefix) for d in documented):
            missing.append(f"{name} ({where}): no documented name starts with {prefix}")
    elif name not in documented:
        missing.append(f"{name} ({where})")
for m in missing:
    print(f"options_doc: not in a table of docs/building.md: {m}")
print(f"options_doc: {len(declared)} options declared, {len(missing)} undocumented")
if len(declared) < 5:
    sys.exit(f"options_doc: found only {len(declared)} declarations under {repo}: is this kft's tree?")
sys.exit(1 if missing else 0)

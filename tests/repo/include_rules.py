#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The layers of include/kft/, checked over the #include lines (docs/architecture.md).

    python3 tests/repo/include_rules.py [REPO]

Each folder may include only the folders listed for it; a header below the process groups
never reads the process environment (no core/environment.hpp, no getenv/environ). init.hpp sits
above everything (it may include every folder) and no header of kft includes it: only kft's
users do. Prints every violation with its file and line; exit 1 when there is one.
"""
import os
import re
import sys

repo = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", ".."))
root = os.path.join(repo, "include", "kft")

# folder -> the folders (or single headers) it may include, besides itself and config.hpp.
CORE = ["core/"]
ALLOWED = {
    "core/": CORE,
    "kernels/": CORE,
    "async/": CORE,
    "discovery/": CORE,
    "rendezvous/": CORE + ["discovery/world_info.hpp"],
    "topology/": CORE + ["discovery/world_info.hpp", "rendezvous/"],
    # a transport: vocabulary, kernels, async work, the store it meets through, the contract
    "transport/": CORE + ["kernels/", "async/", "rendezvous/store.hpp", "transport/concepts.hpp",
                          "transport/checks.hpp", "transport/typed_collectives.hpp"],
    # algorithms over the contract: never a backend
    "collectives/": CORE + ["kernels/", "async/", "transport/concepts.hpp", "transport/checks.hpp"],
    # code that combines transports
    "group/": CORE + ["kernels/", "async/", "discovery/", "rendezvous/", "topology/", "transport/", "collectives/"],
    "manifest/": CORE,
    "ddp/": CORE + ["kernels/", "async/", "transport/concepts.hpp", "transport/checks.hpp",
                    "transport/typed_collectives.hpp", "group/process_group.hpp"],
    # a framework's modules on the DDP layer (libtorch): the DDP layer and what it may include
    "libtorch/": CORE + ["kernels/", "async/", "transport/concepts.hpp", "transport/checks.hpp",
                         "transport/typed_collectives.hpp", "group/process_group.hpp", "ddp/"],
}
# Headers that may read the environment: the ones that exist to turn it into settings
# (core/timeout.hpp: KFT_TIMEOUT, the one default every transport's deadlines derive from;
# core/log.hpp: KFT_LOG_LEVEL from an environment its callers above group/ pass).
ENV_READERS_OK = ("core/environment.hpp", "core/parse.hpp", "core/timeout.hpp", "core/log.hpp", "discovery/", "rendezvous/", "topology/", "group/",
                  "ddp/", "manifest/", "kft.hpp", "init.hpp")
# The top of the stack: kft::init() joins the job (discovery, the store or MPI, the group). It may
# include everything; nothing in include/kft/ may include it.
TOP = ("init.hpp",)
include_rx = re.compile(r'^\s*#\s*include\s*<kft/([^>]+)>')
env_rx = re.compile(r'\bgetenv\s*\(|\benviron\b|environment::process\s*\(')

problems = []
headers = 0
for dirpath, _, names in os.walk(root):
    for n in sorted(names):
        if not n.endswith((".hpp", ".cuh")):
            continue
        path = os.path.join(dirpath, n)
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        headers += 1
        folder = rel.split("/")[0] + "/" if "/" in rel else ""
        if folder.startswith("transport/") or rel.startswith("transport/"):
            folder = "transport/"
        allowed = ALLOWED.get(folder)
        backend = "/".join(rel.split("/")[:2]) + "/" if rel.startswith("transport/") and rel.count("/") >= 2 else None
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
        for no, line in enumerate(lines, 1):
            m = include_rx.match(line)
            if m and m.group(1) in TOP and rel not in TOP:
                problems.append(f"include/kft/{rel}:{no}: includes <kft/{m.group(1)}>, the top of the stack "
                                f"(only kft's users include it)")
            if m and allowed is not None:
                inc = m.group(1)
                ok = inc == "config.hpp" or inc.startswith(folder) and folder != "transport/" or any(
                    inc == a or (a.endswith("/") and inc.startswith(a)) for a in allowed)
                if backend and inc.startswith(backend):
                    ok = True  # a backend's own files
                if folder == "transport/" and inc.startswith("transport/") and not backend and inc.count("/") == 1:
                    ok = True  # the contract headers include each other
                if not ok:
                    problems.append(f"include/kft/{rel}:{no}: {folder} may not include <kft/{inc}>")
            code = line.split("//", 1)[0]
            if env_rx.search(code) and not rel.startswith(ENV_READERS_OK):
                problems.append(f"include/kft/{rel}:{no}: reads the process environment below the process groups: "
                                f"{line.strip()}")
            if m and m.group(1) == "core/environment.hpp" and not rel.startswith(ENV_READERS_OK):
                problems.append(f"include/kft/{rel}:{no}: includes core/environment.hpp below the process groups")
for p in problems:
    print("FAIL", p)
print(f"include_rules: {headers} headers, {len(problems)} violation(s)")
sys.exit(1 if problems else 0)

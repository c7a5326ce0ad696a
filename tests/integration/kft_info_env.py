#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""kft-info under fixed launcher environments. Malformed ones must exit 2 with a one-line
message naming the variable and its value, never crash or print a world; disagreeing ones
must print the decision and every other source that disagreed."""
import os
import subprocess
import sys

KFT_INFO = sys.argv[1]

# (environment, expected exit code, text the message must contain[, kft-info options])
CASES = [
    ({"RANK": "abc", "WORLD_SIZE": "2"}, 2, 'RANK="abc" is not an integer'),
    ({"RANK": "2", "WORLD_SIZE": "2"}, 2, 'RANK="2" is not below WORLD_SIZE=2'),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, 2, 'RANK="-1" is negative'),
    ({"RANK": "0", "WORLD_SIZE": "99999999999999999999"}, 2, 'WORLD_SIZE="99999999999999999999" is out of range'),
    ({"TORCHELASTIC_RUN_ID": "x", "WORLD_SIZE": "2"}, 2, 'RANK="" is not set'),
    ({"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "3"}, 2, 'OMPI_COMM_WORLD_RANK="3" is not below',
     ["--mpi=off"]),
    # Launcher says 3 ranks, MPI (initialised outside mpirun: a singleton) says 1.
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "3"}, 2,
     'OMPI_COMM_WORLD_SIZE="3" but MPI_COMM_WORLD has 1 rank: Open MPI\'s mpirun started the job', ["--mpi=on"], "mpi"),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[01-03"},
     2, 'SLURM_STEP_NODELIST="node[01-03" is not a Slurm host list'),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "3", "SLURM_STEP_ID": "0", "SLURM_TASKS_PER_NODE": "2(x3),1"},
     2, 'SLURM_TASKS_PER_NODE="2(x3),1" adds up to 7 tasks'),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "0", "PET_NPROC_PER_NODE": "auto"}, 2, "kftrun"),
    ({"PET_NNODES": "2", "PET_NODE_RANK": "5", "PET_NPROC_PER_NODE": "1"}, 2, 'PET_NODE_RANK="5" is not below PET_NNODES=2'),
    ({"K_MPI_JOB_ROLE": "launcher"}, 2, "not a rank itself"),
    ({"KFT_DISCOVERY": "pbs"}, 2, 'KFT_DISCOVERY="pbs" is not a discovery backend'),
]

# Start from a clean environment so the test's own launcher (ctest under srun, say) does not leak in.
# Sanitizer settings (suppressions, options) do pass: a sanitized build runs this test too.
base = {k: v for k, v in os.environ.items()
        if k in ("PATH", "HOME", "LANG", "LD_LIBRARY_PATH") or k.endswith("SAN_OPTIONS")}
failures = 0
built = subprocess.run([KFT_INFO, "--json"], env=base, capture_output=True, text=True, timeout=30)
components = __import__("json").loads(built.stdout)["kft"]["components"]
for extra, code, text, *rest in CASES:
    options = rest[0] if rest else []
    if len(rest) > 1 and not components[rest[1]]:
        print(f"skip {extra}: kft-info built without {rest[1]}")
        continue
    for args in (options, options + ["--json"]):
        p = subprocess.run([KFT_INFO, *args], env={**base, **extra}, capture_output=True, text=True, timeout=30)
        ok = p.returncode == code and text in p.stderr and p.stdout == "" and p.stderr.startswith("kft-info ERROR: ") and p.stderr.count("\n") == 1
        print(f"{'ok  ' if ok else 'FAIL'} exit={p.returncode} {extra} {' '.join(args)}\n     {p.stderr.strip()}")
        failures += not ok
# (environment, text the report must contain): disagreeing sources are shown side by side.
SHOWS = [
    ({"RANK": "2", "WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "r", "SLURM_PROCID": "0", "SLURM_NTASKS": "1",
      "SLURM_STEP_ID": "0"},
     ["backend:      torchrun", "rank:         2 of 3",
      "slurm       Slurm job step environment (SLURM_PROCID, ...)       rank 0 of 1",
      "says rank 0 of 1, torchrun says rank 2 of 3: torchrun takes precedence"]),
    ({"RANK": "2", "WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "r", "KFT_DISCOVERY": "single"},
     ["backend:      single", "forced by KFT_DISCOVERY=single"]),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"},  # batch shell: no step
     ["backend:      single", "rank:         0 of 1"]),
    # The interface Gloo would use between nodes: the route to the store's host, or KFT_SOCKET_IFNAME.
    ({}, ["gloo:         between nodes over lo 127.0.0.1 (the route to 127.0.0.1)"], "gloo"),
    ({"KFT_SOCKET_IFNAME": "=lo"}, ["gloo:         between nodes over lo 127.0.0.1 (KFT_SOCKET_IFNAME==lo)"], "gloo"),
    ({"KFT_SOCKET_IFNAME": "nosuch0"},
     ['gloo:         kft: gloo interface: KFT_SOCKET_IFNAME="nosuch0" matches no interface with an IPv4 address here '
      '(this host has: lo 127.0.0.1'], "gloo"),
]
for extra, texts, *needs in SHOWS:
    if needs and not components.get(needs[0]):
        print(f"skip {extra}: kft-info built without {needs[0]}")
        continue
    p = subprocess.run([KFT_INFO, "--mpi=off"] if components["mpi"] else [KFT_INFO], env={**base, **extra},
                       capture_output=True, text=True, timeout=30)
    missing = [t for t in texts if t not in p.stdout]
    ok = p.returncode == 0 and not missing
    print(f"{'ok  ' if ok else 'FAIL'} exit={p.returncode} {extra}" + (f"\n     missing: {missing}\n{p.stdout}" if missing else ""))
    failures += not ok

# --output: %r becomes the rank, the file holds exactly the JSON line, nothing else is left in
# the directory; an unwritable path exits 1 naming it and writes nothing.
import json, tempfile
with tempfile.TemporaryDirectory() as d:
    env = {**base, "RANK": "2", "WORLD_SIZE": "3", "TORCHELASTIC_RUN_ID": "r"}
    p = subprocess.run([KFT_INFO, "--topology=off", "--output", os.path.join(d, "info-%r-100%%.json")], env=env,
                       capture_output=True, text=True, timeout=30)
    files = sorted(os.listdir(d))
    ok = p.returncode == 0 and p.stdout == "" and files == ["info-2-100%.json"]
    if ok:
        with open(os.path.join(d, files[0])) as f:
            text = f.read()
        ok = text.endswith("}\n") and text.count("\n") == 1 and json.loads(text)["world"]["rank"] == 2
    print(f"{'ok  ' if ok else 'FAIL'} --output with %r: exit={p.returncode} files={files} {p.stderr.strip()}")
    failures += not ok
    missing = os.path.join(d, "no-such-dir", "x-%r.json")
    p = subprocess.run([KFT_INFO, "-o", missing], env=env, capture_output=True, text=True, timeout=30)
    ok = (p.returncode == 1 and os.path.join(d, "no-such-dir") in p.stderr and "No such file" in p.stderr
          and sorted(os.listdir(d)) == files)
    print(f"{'ok  ' if ok else 'FAIL'} --output into a missing directory: exit={p.returncode} {p.stderr.strip()}")
    failures += not ok
print(f"kft_info_env: {failures} failure(s)")
sys.exit(1 if failures else 0)

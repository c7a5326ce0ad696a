#!/usr/bin/python3
# SPDX-License-Identifier: Apache-2.0
"""kft-manifest end to end: every generated variant validates against the real CRDs, arguments
survive YAML and shell quoting, bad input is refused before anything is written, and the
generated jobs run: the TrainJob's command under the PET_* environment the Trainer injects (two
"pods"), the MPIJob launcher's command with a hostfile in the operator's format, and the sbatch
script on the real Slurm cluster the suite starts.

    manifest_test.py <build dir> <scenario>

Run with Debian's /usr/bin/python3 (python3-yaml, python3-jsonschema).
"""
import itertools
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from k8s_failure import exit_classes, job_failure, jobset_action  # noqa: E402

BUILD = os.path.abspath(sys.argv[1])
SCENARIO = sys.argv[2]
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
TOOL = os.path.join(BUILD, "tools", "kft-manifest")
VALIDATE = os.path.join(HERE, "validate.py")
PY = "/usr/bin/python3"


def fail(msg, *context):
    print("FAIL:", msg)
    for c in context:
        print("  ", str(c)[:4000])
    sys.exit(1)


def expect(cond, msg, *context):
    if not cond:
        fail(msg, *context)


def tool(*args, check=True):
    try:
        p = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        fail(f"kft-manifest {' '.join(a[:80] for a in args)} did not finish within 60 s")
    if check and p.returncode != 0:
        fail(f"kft-manifest {' '.join(args)} exited {p.returncode}", p.stderr)
    return p


def validate(text, what):
    p = subprocess.run([PY, VALIDATE, "-"], input=text, capture_output=True, text=True)
    expect(p.returncode == 0, f"{what} validates against the CRDs", p.stdout + p.stderr, text)


# ---- scenarios -------------------------------------------------------------------------------

BASE = ["--name", "train-1", "--image", "registry.example/kft:1.0"]
PROGRAM = ["--", "./train", "--epochs", "3"]


def matrix():
    """Every combination of the options users set validates, for every output kind."""
    axes = {
        "shape": [["--nodes", "1", "--nproc-per-node", "1"], ["--nodes", "4", "--nproc-per-node", "8"]],
        "gpus": [[], ["--gpus-per-node", "8"], ["--gpus-per-node", "2", "--gpu-resource", "amd.com/gpu"]],
        "res": [[], ["--cpus", "16", "--memory", "64Gi"], ["--cpus", "500m", "--cpu-limit", "2", "--memory", "512Mi"]],
        "sched": [[], ["--queue", "team-a", "--priority-class", "high"],
                  ["--gang", "coscheduling"], ["--gang", "volcano", "--scheduler-name", "volcano"]],
        "life": [[], ["--max-restarts", "3", "--active-deadline", "3600", "--ttl", "600"]],
        "meta": [[], ["--env", "A=1", "--env", "MODE=on", "--label", "team=ml", "--annotation", "example.com/owner=me",
                      "--image-pull-policy", "IfNotPresent", "--namespace", "research"]],
    }
    files = []
    with tempfile.TemporaryDirectory() as d:
        for combo in itertools.product(*axes.values()):
            flags = [f for part in combo for f in part]
            for kind in ("trainjob", "mpijob", "runtime"):
                path = os.path.join(d, f"{len(files):04d}-{kind}.yaml")
                with open(path, "w") as f:  # the flags, for the failure message
                    f.write(f"# {kind} {' '.join(flags)}\n" + tool(kind, *BASE, *flags, *PROGRAM).stdout)
                files.append(path)
        # one validator process for all of them (it converts the CRDs once)
        p = subprocess.run([PY, VALIDATE, *files], capture_output=True, text=True)
        bad = [l for l in p.stdout.splitlines() if not l.startswith("ok")]
        expect(p.returncode == 0, "every generated variant validates against the CRDs", "\n".join(bad[:20]) + p.stderr,
               open(bad[0].split(":")[0]).read() if bad and os.path.exists(bad[0].split(":")[0]) else "")
    print(f"matrix: {len(files)} generated manifests validate")


def negative_validator():
    """The validator is not a rubber stamp: known-bad edits of a generated TrainJob fail it."""
    good = yaml.safe_load(tool("trainjob", *BASE, "--nodes", "2", *PROGRAM).stdout)
    cases = [
        (lambda d: d["spec"]["trainer"].__setitem__("numProcPerNode", "auto"), "numProcPerNode"),
        (lambda d: d["spec"].__setitem__("podTemplateOverrides", [{"targetJobs": [{"name": "node"}]}]), "podTemplateOverrides"),
        (lambda d: d["spec"]["trainer"]["resourcesPerNode"].__setitem__("requests", {"memory": "4Gix"}), "4Gix"),
    ]
    for mutate, fragment in cases:
        doc = json.loads(json.dumps(good))
        mutate(doc)
        p = subprocess.run([PY, VALIDATE, "-"], input=yaml.safe_dump(doc), capture_output=True, text=True)
        expect(p.returncode == 1 and fragment in p.stdout, f"the validator rejects {fragment}", p.stdout + p.stderr)
    print("negative_validator: 3 known-bad manifests rejected")


ODD_ARGS = ["--msg", "a b", "it's", 'say "hi"', "yes", "no", "on", "off", "null", "~", "1:2", "#x", "- y",
            "$HOME", "`id`", "a\\b", "tab\there", "", "3", "0x10", "true", "*", "{a: 1}", "[1]", "%p", "ünï"]


def roundtrip():
    """Arguments with spaces, quotes, colons and YAML's yes/no/on come back unchanged."""
    argv = ["./train", *ODD_ARGS]
    env = ["--env", "YES=yes", "--env", "COLON=a: b", "--env", "QUOTE=it's \"q\""]
    tj = yaml.safe_load(tool("trainjob", *BASE, *env, "--", *argv).stdout)
    expect(tj["spec"]["trainer"]["command"] == ["kftrun", "--", *argv], "TrainJob command round-trips",
           tj["spec"]["trainer"]["command"])
    values = {e["name"]: e.get("value") for e in tj["spec"]["trainer"]["env"]}
    expect(values == {"YES": "yes", "COLON": "a: b", "QUOTE": "it's \"q\""}, "env values stay strings", values)
    mj = yaml.safe_load(tool("mpijob", *BASE, "--", *argv).stdout)
    launcher = mj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
    expect(launcher == ["mpirun", "-np", "1", *argv], "MPIJob launcher command round-trips", launcher)
    # sbatch: the script's own shell gives the program back its argv
    with tempfile.TemporaryDirectory() as d:
        script = tool("sbatch", "--name", "rt", *env, "--", *argv).stdout
        last = script.rstrip("\n").splitlines()[-1]
        expect(last.startswith("srun --mpi=pmix "), "the script ends with srun --mpi=pmix", last)
        probe = os.path.join(d, "probe.sh")
        with open(probe, "w") as f:
            f.write(script.replace("srun --mpi=pmix ", f"{PY} -c 'import json,sys,os; print(json.dumps([sys.argv[1:], "
                                   f"os.environ[\"YES\"], os.environ[\"COLON\"], os.environ[\"QUOTE\"]]))' ", 1))
        p = subprocess.run(["bash", probe], capture_output=True, text=True)
        expect(p.returncode == 0, "the generated script runs", p.stderr, script)
        got = json.loads(p.stdout)
        expect(got == [argv, "yes", "a: b", "it's \"q\""], "sbatch argv and env round-trip through the shell", got)
    print(f"roundtrip: {len(argv)} arguments and 3 env values survive YAML and shell")


def bad_input():
    """Refused before anything is written, naming the option, exit 2."""
    cases = [
        (["trainjob", "--name", "Train", "--image", "i", "--", "x"], "--name"),
        (["trainjob", "--name", "n" * 50, "--nodes", "100", "--image", "i", "--", "x"], "too long"),
        (["mpijob", "--name", "m" * 60, "--nodes", "20", "--image", "i", "--", "x"], "too long"),
        (["trainjob", "--name", "a", "--nodes", "0", "--image", "i", "--", "x"], "--nodes"),
        (["trainjob", "--name", "a", "--nproc-per-node", "-2", "--image", "i", "--", "x"], "--nproc-per-node"),
        (["trainjob", "--name", "a", "--nproc-per-node", "auto", "--image", "i", "--", "x"], "--nproc-per-node"),
        (["trainjob", "--name", "a", "--memory", "4Gix", "--image", "i", "--", "x"], "--memory"),
        (["trainjob", "--name", "a", "--cpus", "lots", "--image", "i", "--", "x"], "--cpus"),
        (["trainjob", "--name", "a", "--env", "PET_NNODES=2", "--image", "i", "--", "x"], "reserved"),
        (["mpijob", "--name", "a", "--env", "OMPI_MCA_btl=tcp", "--image", "i", "--", "x"], "reserved"),
        (["trainjob", "--name", "a", "--gpus-per-node", "2", "--gpu-resource", "", "--image", "i", "--", "x"], "--gpu-resource"),
        (["trainjob", "--name", "a", "--image", "i"], "no program"),
        (["trainjob", "--name", "a", "--image", "", "--", "x"], "--image"),
        (["trainjob", "--name", "a", "--image", "i", "--gang", "sometimes", "--", "x"], "--gang"),
        (["sbatch", "--name", "a", "--time", "soon", "--", "x"], "--time"),
        (["sbatch", "--name", "a", "--launcher", "ssh", "--", "x"], "--launcher"),
        (["sbatch", "--name", "a", "--memory", "1.5G", "--", "x"], "--memory"),
        (["trainjob", "--name", "a", "--label", "bad key=v", "--image", "i", "--", "x"], "--label"),
    ]
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "out.yaml")
        for args, fragment in cases:
            p = tool(*args, "-o", out, check=False)
            expect(p.returncode == 2, f"exit 2 for {args}", p.returncode, p.stderr)
            expect(fragment in p.stderr, f"the message for {args} names {fragment!r}", p.stderr)
            expect(not os.path.exists(out) and os.listdir(d) == [], f"nothing written for {args}", os.listdir(d))
        job_file = os.path.join(d, "job.yaml")
        with open(job_file, "w") as f:
            f.write("name: a\nimage: i\nnprocs-per-node: 2\ncommand: [x]\n")
        p = tool("trainjob", "--job-file", job_file, check=False)
        expect(p.returncode == 2 and "nprocs-per-node" in p.stderr, "a misspelt job-file field is refused", p.stderr)
        # A device that never ends, read with a bound (not until memory runs out).
        p = tool("trainjob", "--job-file", "/dev/zero", check=False)
        expect(p.returncode == 2 and "/dev/zero" in p.stderr and "larger than 16 MiB" in p.stderr,
               "an endless job file is refused after 16 MiB", p.returncode, p.stderr[-500:])
        # -o into a directory that does not exist: exit 2 naming it, nothing written anywhere.
        missing = os.path.join(d, "no-such-dir", "out.yaml")
        p = tool("trainjob", "--name", "a", "--image", "i", "-o", missing, "--", "x", check=False)
        expect(p.returncode == 2 and "no-such-dir" in p.stderr and sorted(os.listdir(d)) == ["job.yaml"],
               "-o into a missing directory is refused, nothing written", p.returncode, p.stderr, os.listdir(d))
    print(f"bad_input: {len(cases) + 3} bad inputs refused with exit 2, nothing written")


def job_file():
    """One job file yields all outputs; flags override it."""
    with tempfile.TemporaryDirectory() as d:
        jf = os.path.join(d, "job.yaml")
        with open(jf, "w") as f:
            f.write("name: from-file\nimage: reg/kft:2\nnodes: 2\nnproc-per-node: 4\ngpus-per-node: 4\n"
                    "env: {MODE: fast}\nlabel: {team: ml}\ncommand: [./train, --lr, '0.1']\n")
        tj = yaml.safe_load(tool("trainjob", "--job-file", jf, "--nodes", "3").stdout)
        expect(tj["metadata"]["name"] == "from-file" and tj["spec"]["trainer"]["numNodes"] == 3 and
               tj["spec"]["trainer"]["command"][-3:] == ["./train", "--lr", "0.1"], "job file read, --nodes overrides", tj)
        mj = yaml.safe_load(tool("mpijob", "--job-file", jf).stdout)
        expect(mj["spec"]["slotsPerWorker"] == 4 and mj["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"] == 2,
               "the same file gives the MPIJob", mj["spec"])
        sb = tool("sbatch", "--job-file", jf).stdout
        expect("#SBATCH --nodes=2" in sb and "#SBATCH --gpus-per-node=4" in sb and "./train --lr 0.1" in sb,
               "and the sbatch script", sb)
        out = os.path.join(d, "tj.yaml")
        tool("trainjob", "--job-file", jf, "-o", out)
        expect(os.listdir(d) == ["job.yaml", "tj.yaml"] or sorted(os.listdir(d)) == ["job.yaml", "tj.yaml"],
               "-o writes the file and nothing else", os.listdir(d))
    print("job_file: one file, three outputs, flags override")


BIG = "a" * (10 << 20)  # 10 MB


def bad_yaml_types():
    """A job file of the wrong YAML types, bad syntax or huge values: exit 2, one line naming the
    file, the field and its line (1-based), no value echoed in full, nothing written."""
    head = "name: a\nimage: i\n"
    # (file content, field named, line, kinds): the type cases fail the same way for every output
    everyone = ("trainjob", "runtime", "mpijob", "sbatch")
    cases = [
        (head + "[a, b]: 1\ncommand: [x]\n", "key", 3, everyone),                      # a key that is a sequence
        (head + "{x: 1}: 2\ncommand: [x]\n", "key", 3, everyone),                      # a key that is a mapping
        (head + "~: 2\ncommand: [x]\n", "key", 3, everyone),                           # a null key
        (head + "env:\n  FOO: [1, 2]\ncommand: [x]\n", "env.FOO", 4, everyone),       # env value a list
        (head + "env:\n  FOO:\ncommand: [x]\n", "env.FOO", 4, everyone),              # env value null
        (head + "env: {~: 2}\ncommand: [x]\n", "env", 3, everyone),                    # env name null
        (head + "env:\n  [A]: 1\ncommand: [x]\n", "env", 4, everyone),                 # env name a list
        (head + "env: [A=1]\ncommand: [x]\n", "env", 3, everyone),                     # a list for a mapping
        (head + "env:\ncommand: [x]\n", "env", 3, everyone),                           # null for a mapping
        (head + "env:\n  A: 1\n  A: 2\ncommand: [x]\n", "env.A", 5, everyone),        # duplicate env name
        (head + "command:\n  - x\n  - [y]\n", "command[1]", 5, everyone),             # command entry a list
        (head + "command: [x, ~]\n", "command[1]", 3, everyone),                       # command entry null
        (head + "command:\n  - x\n  -\n", "command[1]", 5, everyone),                 # an empty entry
        (head + "command:\n  - x\n  -   # nothing\n\n  # more\n  - y\n", "command[1]", 5, everyone),
        (head + "command: ./train --epochs 3\n", "command", 3, everyone),             # a scalar for a list
        (head + "command: {a: b}\n", "command", 3, everyone),                          # a mapping for a list
        (head + "label:\n  team: {a: b}\ncommand: [x]\n", "label.team", 4, everyone),  # label value a map
        (head + "label:\n  team: ml\n  team: ai\ncommand: [x]\n", "label.team", 5, everyone),
        (head + "annotation:\n  example.com/o: [me]\ncommand: [x]\n", "annotation.example.com/o", 4, everyone),
        ("name:\nimage: i\ncommand: [x]\n", "name", 1, everyone),                      # null for a scalar
        ("name: [a]\nimage: i\ncommand: [x]\n", "name", 1, everyone),                  # a list for a scalar
        ("name: a\nimage: {i: 1}\ncommand: [x]\n", "image", 2, everyone),              # a mapping for a scalar
        (head + "name: b\ncommand: [x]\n", "name", 3, everyone),                       # duplicate field
        (head + "nodes: [1]\ncommand: [x]\n", "nodes", 3, everyone),                   # a list for an integer
        (head + "nodes:\ncommand: [x]\n", "nodes", 3, everyone),                       # null for an integer
        (head + "nodes: lots\ncommand: [x]\n", "nodes", 3, everyone),                  # not an integer
        (head + "nodes: 99999999999\ncommand: [x]\n", "nodes", 3, everyone),           # not an int
        (head + "ttl: 1.5\ncommand: [x]\n", "ttl", 3, everyone),
        (head + "gang: [volcano]\ncommand: [x]\n", "gang", 3, everyone),
        (head + "gang: sometimes\ncommand: [x]\n", "gang", 3, everyone),
        (head + "nprocs-per-node: 2\ncommand: [x]\n", "nprocs-per-node", 3, everyone),  # unknown field
        ("name: a\nimage: [i\ncommand: [x]\n", "", 3, everyone),                        # YAML syntax error
        ("name: a\nimage: i\n  nodes: 2\n", "", 3, everyone),                           # bad indentation
        ("- name: a\n- image: i\n", "", 1, everyone),                                   # not a mapping
        (head + "command: [x]\n---\nname: b\n", "", 5, everyone),                       # two documents
        # yaml-cpp 0.7's LoadAll loops for ever, allocating, on a ',' where a node should start
        # (found by fuzz.manifest_job; tools/kft-manifest stops it first)
        (", name: a\nimage: i\ncommand: [x]\n", "", 1, everyone),
        ("\n\n  , nodes: 2\n", "", 3, everyone),
        # values the checks refuse, from the file: the message still says where
        ("name: Train\nimage: i\ncommand: [x]\n", "name", 1, ("trainjob", "mpijob")),
        (head + "nodes: 0\ncommand: [x]\n", "nodes", 3, everyone),
        (head + "memory: 4Gix\ncommand: [x]\n", "memory", 3, everyone),
        (head + "env:\n  A: 1\n  PET_NNODES: 2\ncommand: [x]\n", "env.PET_NNODES", 5, ("trainjob", "mpijob")),
        (head + "label:\n  bad key: v\ncommand: [x]\n", "label.bad key", 4, ("trainjob", "mpijob")),
        (head + "time: soon\ncommand: [x]\n", "time", 3, ("sbatch",)),
        # 10 MB values: refused, echoed only in part
        (f"name: {BIG}\nimage: i\ncommand: [x]\n", "name", 1, ("trainjob",)),
        (f"name: a\nimage: i\nmemory: 1{BIG}\ncommand: [x]\n", "memory", 3, ("mpijob",)),
        (f"name: a\ntime: 1{'1' * (10 << 20)}x\ncommand: [x]\n", "time", 2, ("sbatch",)),
        (f"name: a\nimage: i\nenv:\n  ? 1{'E' * (10 << 20)}\n  : 1\ncommand: [x]\n", "env.1E", 4, ("trainjob",)),
        (f"name: a\nimage: i\nlabel:\n  team: {BIG}\ncommand: [x]\n", "label.team", 4, ("trainjob",)),
        (f"name: a\nimage: i\ncommand: [x, [{BIG}]]\n", "command[1]", 3, ("trainjob",)),
        (f"name: a\nimage: i\nenv: {{A: [{', '.join(['1'] * 100000)}]}}\ncommand: [x]\n", "env.A", 3, ("trainjob",)),
    ]
    runs = 0
    with tempfile.TemporaryDirectory() as d:
        jf = os.path.join(d, "job.yaml")
        out = os.path.join(d, "out.yaml")
        for text, field, line, kinds in cases:
            with open(jf, "w") as f:
                f.write(text)
            what = text[:120] + (f"... ({len(text)} bytes)" if len(text) > 120 else "")
            for kind in kinds:
                p = tool(kind, "--job-file", jf, "-o", out, check=False)
                runs += 1
                err = p.stderr[:4000]
                expect("terminate called" not in p.stderr and p.returncode == 2,
                       f"{kind}: exit 2, no crash, for {what!r}", p.returncode, err)
                expect(len(p.stderr) < 1000, f"{kind}: a short message for {what!r} ({len(p.stderr)} bytes)", err)
                expect(p.stderr.count("\n") == 1 and p.stderr.endswith("\n"), f"{kind}: one line for {what!r}", err)
                expect(jf in p.stderr, f"{kind}: the message names the file for {what!r}", err)
                expect(f"line {line}," in p.stderr, f"{kind}: the message says line {line} for {what!r}", err)
                expect(not field or f": {field}" in p.stderr, f"{kind}: the message names {field!r} for {what!r}", err)
                expect(sorted(os.listdir(d)) == ["job.yaml"], f"{kind}: nothing written for {what!r}", os.listdir(d))
        # the same values from flags still name the flag (and are not echoed in full either)
        p = tool("trainjob", "--name", "a" * 100000, "--image", "i", "-o", out, "--", "x", check=False)
        expect(p.returncode == 2 and "--name=" in p.stderr and "(100000 bytes)" in p.stderr and len(p.stderr) < 1000,
               "a 100 kB --name is refused, echoed in part", p.returncode, p.stderr[:2000])
        # and a good file is still read, flags overriding (a flag fixes the file's bad value)
        with open(jf, "w") as f:
            f.write("---\nname: Train\nimage: i\nnodes: 2\ncommand: [x, 'null', '']\n---\n")
        p = tool("trainjob", "--job-file", jf, "--name", "ok", check=False)
        expect(p.returncode == 0, "a flag overrides the file's bad value", p.stderr)
        tj = yaml.safe_load(p.stdout)
        expect(tj["spec"]["trainer"]["command"] == ["kftrun", "--", "x", "null", ""], "quoted null and '' kept",
               tj["spec"]["trainer"]["command"])
    print(f"bad_yaml_types: {len(cases)} malformed job files, {runs} runs, each exit 2 naming file, field and line")


def free_port():
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run_world(commands, envs, ranks, out_dir, timeout=60):
    """Runs the job's commands; each rank's kft-info wrote its JSON to out_dir/rank-<r>.json (a file per
    rank: mpirun relays output through a terminal that splits a long line in 2 KiB pieces, which
    interleave between ranks under load)."""
    procs = [subprocess.Popen(c, env=e, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for c, e in zip(commands, envs)]
    errs = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        errs.append(err)
        expect(p.returncode == 0, "the job's command exits 0", p.returncode, err)
    files = sorted(os.listdir(out_dir))
    expect(files == [f"rank-{r}.json" for r in range(ranks)], f"one JSON file per rank 0..{ranks - 1}", files, errs)
    worlds = []
    for f in files:
        with open(os.path.join(out_dir, f)) as fh:
            worlds.append(json.load(fh)["world"])
    expect(sorted(w["rank"] for w in worlds) == list(range(ranks)), f"ranks 0..{ranks - 1} each once",
           [w["rank"] for w in worlds], errs)
    expect(all(w["world_size"] == ranks for w in worlds), "everyone agrees on the size", worlds)
    return worlds


def trainjob_env():
    """The TrainJob's command, run under the PET_* variables the Trainer would inject, on two "pods"."""
    kft_info = os.path.join(BUILD, "tools", "kft-info")
    with tempfile.TemporaryDirectory() as out_dir:
        trainjob_env_in(kft_info, out_dir)


def trainjob_env_in(kft_info, out_dir):
    tj = yaml.safe_load(tool("trainjob", *BASE, "--nodes", "2", "--nproc-per-node", "2", "--", kft_info,
                             "--output", os.path.join(out_dir, "rank-%r.json")).stdout)
    cmd = tj["spec"]["trainer"]["command"]
    expect(cmd[0] == "kftrun", "the pod runs kftrun", cmd)
    port = free_port()
    envs = []
    for node in range(2):
        e = dict(os.environ, PATH=os.path.join(BUILD, "tools") + os.pathsep + os.environ["PATH"])
        # what torch.go injects (PET_MASTER_ADDR would be <job>-node-0-0.<job>; here both pods are this host)
        e.update(PET_NNODES=str(tj["spec"]["trainer"]["numNodes"]),
                 PET_NPROC_PER_NODE=str(tj["spec"]["trainer"]["numProcPerNode"]), PET_NODE_RANK=str(node),
                 PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), JOB_COMPLETION_INDEX=str(node),
                 KFT_RDZV_TOKEN="from-the-secret")
        envs.append(e)
    worlds = run_world([cmd, cmd], envs, 4, out_dir)
    expect({w["node_rank"] for w in worlds} == {0, 1}, "two nodes", worlds)
    print("trainjob_env: the TrainJob's command formed a 4-rank, 2-node world under PET_* variables")


def mpijob_launcher():
    """The MPIJob launcher's command, with a hostfile in the operator's format."""
    kft_info = os.path.join(BUILD, "tools", "kft-info")
    with tempfile.TemporaryDirectory() as d:
        out_dir = os.path.join(d, "out")
        os.mkdir(out_dir)
        mj = yaml.safe_load(tool("mpijob", *BASE, "--nodes", "2", "--nproc-per-node", "2", "--", kft_info,
                                 "--output", os.path.join(out_dir, "rank-%r.json")).stdout)
        cmd = mj["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]
        slots = mj["spec"]["slotsPerWorker"]
        hostfile = os.path.join(d, "hostfile")
        with open(hostfile, "w") as f:  # <job>-worker-<i>.<job>.<ns>.svc slots=N, here one machine
            f.write(f"localhost slots={slots * 2}\n")
        e = dict(os.environ, OMPI_MCA_orte_default_hostfile=hostfile, OMPI_MCA_orte_keep_fqdn_hostnames="true",
                 OMPI_MCA_orte_set_default_slots=str(slots), OMPI_ALLOW_RUN_AS_ROOT="1",
                 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
        run_world([cmd], [e], 4, out_dir)
    print("mpijob_launcher: mpirun from the MPIJob started 4 ranks from the hostfile's slots")


def sbatch_slurm():
    """The generated script, submitted to the suite's Slurm cluster (two virtual nodes)."""
    if not os.environ.get("SLURM_CONF"):
        print("SKIP: no Slurm cluster (SLURM_CONF unset)")
        sys.exit(77)
    example = os.path.join(BUILD, "examples", "01-discover")
    with tempfile.TemporaryDirectory() as d:
        os.chmod(d, 0o755)
        out = os.path.join(d, "job-%j.out")
        script = tool("sbatch", "--name", "kft-sbatch", "--nodes", "2", "--nproc-per-node", "2", "--time", "5",
                      "--output", out, "--env", "KFT_DISCOVERY=slurm", "--", example).stdout
        path = os.path.join(d, "job.sbatch")
        with open(path, "w") as f:
            f.write(script)
        p = subprocess.run(["sbatch", "--parsable", path], capture_output=True, text=True)
        expect(p.returncode == 0, "sbatch accepted the script", p.stderr, script)
        job_id = p.stdout.strip().split(";")[0]
        deadline = time.time() + 90
        state = ""
        while time.time() < deadline:
            q = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
            state = q.split("JobState=")[1].split()[0] if "JobState=" in q else "GONE"
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "GONE"):
                break
            time.sleep(0.3)
        text = open(out.replace("%j", job_id)).read() if os.path.exists(out.replace("%j", job_id)) else ""
        expect(state == "COMPLETED", f"the job completed (state {state})", text, script)
        lines = sorted(l for l in text.splitlines() if l.startswith("rank "))
        expect(len(lines) == 4 and all("decided by slurm" in l for l in lines) and
               any("node 1 of 2" in l for l in lines), "4 ranks on 2 nodes ran the example", text)
    print("sbatch_slurm: the generated script ran 4 ranks on 2 Slurm nodes")


def failure_rules():
    """The runtime's rules send each of kftrun's exit classes to the intended JobSet action."""
    text = tool("runtime", "--runtime", "kft-torch", "--image", "r/kft:1", "--max-restarts", "3").stdout
    validate(text, "the runtime with its failure rules")
    rt = yaml.safe_load(text)
    job = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    expect(job["template"]["spec"].get("restartPolicy") == "Never" and job.get("backoffLimit") == 0,
           "the node Job: restartPolicy Never (podFailurePolicy needs it), backoffLimit 0", job)
    x = exit_classes()
    intended = {
        "worker_failed": "RestartJobSet", "rank_lost": "RestartJobSet", "hang": "RestartJobSet",
        "usage": "FailJobSet", "cannot_start": "FailJobSet",
        "node_lost": "RestartJobSetAndIgnoreMaxRestarts", "preempted": "RestartJobSetAndIgnoreMaxRestarts",
        "sigint": "RestartJobSet", "sighup": "RestartJobSet",
    }
    expect(set(intended) == set(x) - {"success"}, "every class of exit_codes.hpp has an intended action here",
           sorted(x), sorted(intended))
    for name, action in intended.items():
        reason, message = job_failure(job, exit_code=x[name])
        got = jobset_action(rt, reason, message)
        expect(got == action, f"kftrun exit {x[name]} ({name}) -> {action}", got, reason, message)
        print(f"ok: exit {x[name]} ({name}): Job {reason} -> JobSet {got}")
    reason, message = job_failure(job, condition="DisruptionTarget", exit_code=137)
    got = jobset_action(rt, reason, message)
    expect(got == "RestartJobSetAndIgnoreMaxRestarts", "a pod killed after its grace with DisruptionTarget (137) "
           "restarts without counting", got, reason, message)
    print(f"ok: DisruptionTarget, exit 137: Job {reason} -> JobSet {got}")
    # The comment at the top lists the same mapping.
    for name, action in intended.items():
        expect(f"#   {x[name]} " in text and action in text.split(f"#   {x[name]} ")[1].split("\n")[0],
               f"the runtime's header comment says exit {x[name]} -> {action}", text[:1500])
    # --no-failure-rules: the runtime of before (no rules, no podFailurePolicy).
    plain = yaml.safe_load(tool("runtime", "--runtime", "kft-torch", "--image", "r/kft:1", "--no-failure-rules").stdout)
    pjob = plain["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]
    expect("failurePolicy" not in plain["spec"]["template"]["spec"] and "podFailurePolicy" not in pjob and
           "restartPolicy" not in pjob["template"]["spec"], "--no-failure-rules leaves them out", plain)
    # MPIJob: no exit-code rules exist there; the launcher's backoffLimit is written explicitly.
    mpi = yaml.safe_load(tool("mpijob", *BASE, *PROGRAM).stdout)
    expect(mpi["spec"]["runPolicy"].get("backoffLimit") == 0, "an MPIJob's backoffLimit is 0 unless --max-restarts",
           mpi["spec"]["runPolicy"])
    mpi = yaml.safe_load(tool("mpijob", *BASE, "--max-restarts", "2", *PROGRAM).stdout)
    expect(mpi["spec"]["runPolicy"].get("backoffLimit") == 2, "and --max-restarts sets it", mpi["spec"]["runPolicy"])


def templates():
    """k8s-templates/ are exactly what the tool writes today."""
    gen = os.path.join(REPO, "k8s-templates", "generate.sh")
    with tempfile.TemporaryDirectory() as d:
        p = subprocess.run(["bash", gen, TOOL, d], capture_output=True, text=True)
        expect(p.returncode == 0, "k8s-templates/generate.sh ran", p.stderr)
        made = sorted(f for f in os.listdir(d))
        expect(made, "it wrote templates", made)
        for name in made:
            committed = os.path.join(REPO, "k8s-templates", name)
            expect(os.path.exists(committed), f"k8s-templates/{name} is committed", name)
            new = open(os.path.join(d, name)).read()
            expect(open(committed).read() == new,
                   f"k8s-templates/{name} differs from the tool's output: rerun bash k8s-templates/generate.sh", name)
            if name.endswith(".yaml"):
                validate(new, name)
    print(f"templates: {len(made)} templates match the tool and validate")


SCENARIOS = {f.__name__: f for f in [matrix, negative_validator, roundtrip, bad_input, bad_yaml_types, job_file,
                                     failure_rules, trainjob_env, mpijob_launcher, sbatch_slurm, templates]}

if __name__ == "__main__":
    SCENARIOS[SCENARIO]()

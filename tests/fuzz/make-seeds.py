#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Writes the fuzz targets' seed corpora (tests/fuzz/corpus/<target>/): a few small, realistic
inputs each. Run it after changing a seed here; the files are committed.

    python3 tests/fuzz/make-seeds.py [CORPUS_DIR]

Only seeds live here. Inputs libFuzzer finds stay in the build directory; a crash worth keeping
goes to tests/fuzz/regressions/<target>/ (docs/fuzzing.md).
"""
import os
import struct
import sys

out = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus"))


def write(target, name, data):
    d = os.path.join(out, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def env(**v):
    return "".join(f"{k}={x}\n" for k, x in v.items())


# ---- discovery_env: NAME=value lines, @host=, @hostfile -------------------------------------
write("discovery_env", "srun-step", env(
    SLURM_PROCID=3, SLURM_NTASKS=4, SLURM_LOCALID=1, SLURM_NODEID=1, SLURM_JOB_NUM_NODES=2,
    SLURM_STEP_NODELIST="n[1-2]", SLURM_TASKS_PER_NODE="2(x2)", SLURM_STEP_ID=0, SLURM_JOB_ID=12)
    + "@host=n2\n")
write("discovery_env", "srun-step-uneven", env(
    SLURM_PROCID=6, SLURM_STEP_NUM_TASKS=7, SLURM_NTASKS=8, SLURM_LOCALID=0, SLURM_NODEID=2,
    SLURM_STEP_NUM_NODES=3, SLURM_STEP_NODELIST="gpu[07-08],cpu1", SLURM_STEP_TASKS_PER_NODE="3(x2),1",
    SLURM_STEPID=1, SLURM_JOB_ID=4242, MASTER_ADDR="gpu07", MASTER_PORT=29400))
write("discovery_env", "sbatch-shell", env(SLURM_PROCID=0, SLURM_LOCALID=0, SLURM_NTASKS=4, SLURM_JOB_ID=12,
                                           SLURM_JOB_NODELIST="node[01-04,7],gpu-[1-2]"))
write("discovery_env", "torchrun-worker", env(
    RANK=5, WORLD_SIZE=8, LOCAL_RANK=1, LOCAL_WORLD_SIZE=4, GROUP_RANK=1, GROUP_WORLD_SIZE=2,
    MASTER_ADDR="10.0.0.1", MASTER_PORT=29500, TORCHELASTIC_RUN_ID="job42", KFT_LAUNCHER="kftrun"))
write("discovery_env", "torchrun-under-srun", env(
    RANK=2, WORLD_SIZE=3, TORCHELASTIC_RUN_ID="r", LOCAL_RANK=2, LOCAL_WORLD_SIZE=3, SLURM_PROCID=0,
    SLURM_NTASKS=1, SLURM_STEP_ID=0, SLURM_LOCALID=0, SLURM_NODEID=0, SLURM_STEP_NODELIST="n1",
    SLURM_TASKS_PER_NODE=1))
write("discovery_env", "openmpi", env(OMPI_COMM_WORLD_RANK=2, OMPI_COMM_WORLD_SIZE=4, OMPI_COMM_WORLD_LOCAL_RANK=0,
                                      OMPI_COMM_WORLD_LOCAL_SIZE=2, OMPI_MCA_orte_num_nodes=2))
write("discovery_env", "pmi-hydra", env(PMI_RANK=1, PMI_SIZE=2, MPI_LOCALRANKID=1, MPI_LOCALNRANKS=2))
write("discovery_env", "kubeflow-pod", env(
    PET_NNODES=2, PET_NODE_RANK=1, PET_NPROC_PER_NODE=1, PET_MASTER_ADDR="mnist-node-0-0.mnist",
    PET_MASTER_PORT=29500, JOB_COMPLETION_INDEX=1) + "@host=mnist-node-0-1\n")
write("discovery_env", "jobset-pod", env(JOB_COMPLETION_INDEX=0, KFT_NNODES=2, KFT_SUBDOMAIN="svc")
      + "@host=big-job-workers-1-0\n")
write("discovery_env", "mpijob-worker", env(K_MPI_JOB_ROLE="worker") + "@host=pi-worker-1\n@hostfile\n"
      "# MPI Operator hostfile\npi-launcher.pi.default.svc slots=1\npi-worker-0.pi.default.svc slots=1\n"
      "pi-worker-1.pi.default.svc slots=1\n")
write("discovery_env", "forced", env(KFT_DISCOVERY="slurm", RANK=0, WORLD_SIZE=1, SLURM_PROCID=0, SLURM_NTASKS=1,
                                     SLURM_STEP_ID=0))

# ---- slurm_lists: one list per file, given to both expanders --------------------------------
for i, s in enumerate(["node[01-04,7],gpu-[1-2]", "r[1-2]n[1-2]-ib", "n[098-101]", "x[3],y", "cpu1",
                       "2(x3),1", "4", "1,3(x2)", "16(x128)"]):
    write("slurm_lists", f"seed-{i}", s)
# A long name: the caps are on names' characters as much as on their number.
write("slurm_lists", "long-name", "rack-" + "a" * 400 + "-node[001-128]")


# ---- store_server: byte 0 (bit 0: hello first), then frames ---------------------------------
def frame(payload):
    return struct.pack("<I", len(payload)) + payload


def u8(v): return struct.pack("<B", v)
def u32(v): return struct.pack("<I", v)
def i64(v): return struct.pack("<q", v)
def s(x): return u32(len(x)) + x.encode()


HELLO, SET, GET, WAIT, ADD, CAS, ERASE, PING, KEYS, SET_OWNED, MULTI_SET, MULTI_GET = range(1, 13)
write("store_server", "set-get", b"\x01" + frame(u8(SET) + s("a") + s("1")) + frame(u8(GET) + s("a") + u32(0)))
write("store_server", "add-keys", b"\x01" + frame(u8(ADD) + s("n") + i64(5)) + frame(u8(ADD) + s("n") + i64(-2))
      + frame(u8(KEYS) + s("")) + frame(u8(PING)))
write("store_server", "cas-erase", b"\x01" + frame(u8(CAS) + s("k") + u8(0) + s("") + s("v1"))
      + frame(u8(CAS) + s("k") + u8(1) + s("v1") + s("v2")) + frame(u8(ERASE) + s("k")))
write("store_server", "wait-timeout", b"\x01" + frame(u8(WAIT) + u32(2) + s("x") + s("y") + u32(10)) + frame(u8(PING)))
write("store_server", "get-waits", b"\x01" + frame(u8(GET) + s("never") + u32(100000)))
write("store_server", "add-on-text", b"\x01" + frame(u8(SET) + s("t") + s("abc")) + frame(u8(ADD) + s("t") + i64(1)))
write("store_server", "wrong-token", b"\x00" + frame(u8(HELLO) + s("not-the-token") + s("intruder")))
write("store_server", "no-hello", b"\x00" + frame(u8(SET) + s("a") + s("1")))
write("store_server", "hello-by-hand", b"\x00" + frame(u8(HELLO) + s("t") + s("me")) + frame(u8(PING)))
write("store_server", "bad-frame", b"\x01" + u32(0))
write("store_server", "multi-set-get", b"\x01" + frame(u8(MULTI_SET) + u32(3) + s("a") + s("1") + s("b") + s("2") + s("a") + s("3"))
      + frame(u8(MULTI_GET) + u32(2) + s("a") + s("b") + u32(0)) + frame(u8(MULTI_GET) + u32(2) + s("a") + s("z") + u32(10)))
write("store_server", "wait-woken", b"\x01" + frame(u8(SET_OWNED) + s("o") + s("1")) + frame(u8(WAIT) + u32(1) + s("o") + u32(50))
      + frame(u8(ERASE) + s("o")) + frame(u8(MULTI_GET) + u32(1) + s("o") + u32(20)))
write("store_server", "batch-over-limit", b"\x01" + frame(u8(MULTI_GET) + u32((1 << 20) + 1)) + frame(u8(PING)))

# ---- store_wire: byte 0 = script length, script (one read per byte: 0 u8, 1 u32, 2 i64, 3 str), payload
write("store_wire", "set", bytes([3, 0, 3, 3]) + u8(SET) + s("key") + s("value"))
write("store_wire", "add", bytes([3, 0, 3, 2]) + u8(ADD) + s("n") + i64(-7))
write("store_wire", "wait", bytes([5, 0, 1, 3, 3, 1]) + u8(WAIT) + u32(2) + s("a") + s("b") + u32(1000))
write("store_wire", "short", bytes([2, 0, 3]) + u8(GET) + u32(100) + b"ab")
write("store_wire", "multi-set", bytes([6, 0, 1, 3, 3, 3, 3]) + u8(MULTI_SET) + u32(2) + s("a") + s("1") + s("b") + s("2"))

# ---- manifest_job: YAML job files -------------------------------------------------------------
write("manifest_job", "cpu", """name: cpu-2nodes
image: ghcr.io/example/kft-train:0.1.0
nodes: 2
nproc-per-node: 4
cpus: "4"
memory: 8Gi
command: [/opt/kft/examples/03-allreduce]
""")
write("manifest_job", "gpu", """name: gpu-2x8
namespace: research
image: ghcr.io/example/kft-train:0.1.0
image-pull-policy: IfNotPresent
nodes: 2
nproc-per-node: 8
gpus-per-node: 8
cpus: 32
cpu-limit: 40
memory: 256Gi
env: {NCCL_DEBUG: WARN, OMP_NUM_THREADS: "4"}
label: {team: vision}
annotation: {example.com/owner: alice}
max-restarts: 1
ttl: 3600
active-deadline: 7200
command: [/opt/kft/bin/train, --epochs, "10"]
""")
write("manifest_job", "kueue", """name: queued
image: reg/kft:1
runtime: kft-torch-gang
queue: team-a
priority-class: high-priority
gang: coscheduling
scheduler-name: scheduler-plugins-scheduler
command:
  - ./train
""")
write("manifest_job", "sbatch", """name: gpu-2x8
nodes: 2
nproc-per-node: 8
gpus-per-node: 8
cpus-per-task: 4
launcher: mpirun
time: "02:00:00"
output: gpu-2x8-%j.out
memory: 64Gi
command: [/opt/kft/bin/train, --epochs, "10"]
""")
write("manifest_job", "mpijob", """name: mpi-gpu-2x8
image: reg/kft:1
nodes: 2
ssh-mount-path: /var/run/ssh-keys
command: [mpi-prog]
""")
# Shapes a careless reader trips over: flow maps, anchors and merges, nulls, tags, two documents.
write("manifest_job", "shapes", """name: &n shapes
image: *n
env: {A: "1", B: x}
label: {<<: {team: a}}
nodes: !!int 3
ttl: ~
command: [./train, {x: 1}]
""")
write("manifest_job", "two-documents", "name: first\ncommand: [a]\n---\nname: second\n")
# ---- kftrun_args / manifest_args: one argument per line -----------------------------------------
def argv(*a):
    return "".join(f"{x}\n" for x in a)


write("kftrun_args", "single", argv("--nproc-per-node", "4", "--", "./train", "--epochs", "3"))
write("kftrun_args", "two-nodes", argv("--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.1",
                                       "--master-port", "29400", "--timeout", "90s", "--rdzv-timeout", "20",
                                       "--heartbeat-timeout", "3", "--", "./train"))
write("kftrun_args", "torchrun-forms", argv("--nproc_per_node=auto", "--max_restarts=2", "--rdzv_id=job-7",
                                            "--log_dir", "logs", "--tee", "--monitor_interval", "0.5",
                                            "--term-grace", "0", "--standalone", "prog"))
write("kftrun_args", "bad", argv("--nnodes", "2", "--node-rank", "2", "--timeout", "1.5h", "--bind", "numa",
                                 "--", "x"))
write("kftrun_args", "elastic", argv("--nnodes", "2:4", "--node-rank", "7", "--master-addr", "10.0.0.1",
                                     "--rdzv-last-call", "1.5", "--max-restarts", "3", "--", "./train"))
write("manifest_args", "trainjob", argv("trainjob", "--name", "cpu-2nodes", "--image", "reg/kft:1", "--nodes", "2",
                                        "--nproc-per-node", "4", "--cpus", "500m", "--memory", "16Gi",
                                        "--env", "A=1", "--label", "team=a", "--queue", "q", "--gang", "volcano",
                                        "--", "./train", "--epochs", "3"))
write("manifest_args", "mpijob", argv("mpijob", "--name", "mpi-gpu", "--image", "reg/kft:1", "--nodes", "2",
                                      "--gpus-per-node", "8", "--ssh-mount-path", "/var/run/ssh", "--ttl", "600",
                                      "--active-deadline", "3600", "--max-restarts", "1", "--", "prog"))
write("manifest_args", "sbatch", argv("sbatch", "--name", "gpu-2x8", "--nodes", "2", "--nproc-per-node", "8",
                                      "--launcher", "mpirun", "--time", "02:00:00", "--output", "x-%j.out",
                                      "--cpus-per-task", "4", "--", "/opt/train"))
write("manifest_args", "runtime", argv("runtime", "--name", "kft-torch", "--image", "reg/kft:1",
                                       "--annotation", "a=b", "--priority-class", "high"))

print(f"make-seeds: wrote the seed corpora under {out}")

#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# Writes every template in this folder with kft-manifest. A test (tests/manifest, "templates")
# fails when a committed template differs from what the tool writes today, so after changing
# the tool run:   bash k8s-templates/generate.sh build/tools/kft-manifest k8s-templates
set -euo pipefail
tool=${1:?usage: generate.sh <kft-manifest> <output dir>}
out=${2:?usage: generate.sh <kft-manifest> <output dir>}
# No --image: the templates name kft-manifest's default, the image tools/image/build.sh builds
# (localhost/kft:<version>); after pushing it to a registry, pass --image (docs/kubernetes.md, "The image").
mk() { local file=$1 sub=$2; shift 2; "$tool" "$sub" -o "$out/$file" "$@"; }

# The runtime every TrainJob below refers to (kftrun reads the PET_* variables it injects).
mk runtime-kft-torch.yaml runtime --runtime kft-torch --max-restarts 2 --ttl 3600
# Same, with gang scheduling through the scheduler-plugins coscheduling plugin.
mk runtime-kft-torch-gang.yaml runtime --runtime kft-torch-gang --gang coscheduling \
  --scheduler-name scheduler-plugins-scheduler --max-restarts 2
# CPU: 2 nodes x 4 processes.
mk trainjob-cpu-2nodes.yaml trainjob --name cpu-2nodes --nodes 2 --nproc-per-node 4 \
  --cpus 4 --memory 8Gi -- /opt/kft/examples/03-allreduce
# GPU: 2 nodes x 8 GPUs, one process per GPU.
mk trainjob-gpu-2x8.yaml trainjob --name gpu-2x8 --nodes 2 --nproc-per-node 8 \
  --gpus-per-node 8 --cpus 32 --memory 256Gi --env NCCL_DEBUG=WARN -- /opt/kft/bin/train --epochs 10
# Kueue: the same CPU job, queued and prioritised; the gang runtime.
mk trainjob-kueue.yaml trainjob --name queued --runtime kft-torch-gang --nodes 2 \
  --nproc-per-node 4 --cpus 4 --memory 8Gi --queue team-a --priority-class high-priority \
  --active-deadline 7200 -- /opt/kft/examples/03-allreduce
# GPU MPIJob: 2 workers x 8 GPUs, mpirun from the launcher.
mk mpijob-gpu-2x8.yaml mpijob --name mpi-gpu-2x8 --nodes 2 --nproc-per-node 8 \
  --gpus-per-node 8 --cpus 32 --memory 256Gi --max-restarts 1 --ttl 3600 -- /opt/kft/bin/train --epochs 10
# Slurm: the same GPU job as a batch script.
mk gpu-2x8.sbatch sbatch --name gpu-2x8 --nodes 2 --nproc-per-node 8 --gpus-per-node 8 --cpus-per-task 4 \
  --time 02:00:00 --output gpu-2x8-%j.out -- /opt/kft/bin/train --epochs 10

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Every GPU check of kft in one run (a few minutes on one GPU), printing what it measured:
#  - a NCCL communicator of 1 rank; 2 ranks as threads and as 2 processes (NCCL refuses two
#    ranks of one communicator on one GPU: then its answer is printed as a SKIP line);
#  - every dtype x op x count, in place and out of place, against a host reference;
#  - the deadline paths: a stalled collective gives timeout_error within its deadline + 1 s
#    (the abort runs in the background and ends once the stream is let go), a rank missing at
#    initialisation gives it at its deadline (and, with two GPUs, a rank that never calls);
#  - hierarchical allreduce NCCL+NCCL 1x1 and NCCL+MPI staged through pinned memory;
#  - allreduce bandwidth, 1 MiB .. 256 MiB, against cudaMemcpy device-to-device;
#  - the conformance suite (tests/conformance/) on NCCL: one rank per GPU;
#  - the DDP reducer over NCCL (device buckets, event-ordered side stream), with step times;
#  - all_reduce_perf on NCCL (bench/, --backend nccl) in nccl-tests' columns;
#  - kft's CUDA reduction kernels: every dtype x op x inputs against a host reference
#    (test_cuda_reduce), then their bandwidth beside cudaMemcpy D2D (bench/cuda_reduce_perf);
#  - the conformance suite on the CUDA IPC communicator (test_conformance_cuda_ipc starts its
#    ranks as processes: 2 and 3 here, KFT_CONFORMANCE_CUDA_IPC_RANKS picks others);
#  - the CUDA IPC communicator between 2, 3 and 4 processes (test_cuda_ipc starts them; they
#    share GPU 0 when there is one GPU), the hierarchical allreduce over two of them (4 ranks
#    as 2 nodes x 2) and the DDP reducer over it, then its all_reduce_perf (bench/cuda_ipc_perf), again
#    under NVIDIA's MPS daemon when nvidia-cuda-mps-control is there (processes sharing a GPU
#    then run together instead of time-sliced);
#  - the trainer's device optimizer (cuda_sgd) against the host sgd (test_cuda_optim);
#  - under MPS, the DDP reducer's hidden fraction over CUDA IPC with a GPU backward pass
#    (bench/ddp_overlap_cuda, 2 and 4 processes; sleeping layers, then FMA-busy ones), and the
#    generic trainer on the GPU: examples/08-fashion-mnist-gpu (cuBLAS MLP) on 1 and 2 ranks
#    over CUDA IPC, 3 epochs, required to reach 0.85 test accuracy, each run printing its time
#    per step beside the step's cuBLAS products alone (data: $KFT_FMNIST_DIR, else Debian's
#    /usr/share/datasets/fashion-mnist; skipped, saying so, without it). Without MPS the two
#    ranks time-slice the GPU, and the output says so.
#
#   tests/gpu/run-gpu-checks.sh [BUILD_DIR]      (default: $KFT_BUILD_DIR, else build-gpu)
#
# Runs BUILD_DIR/tests/test_nccl when it exists; otherwise configures (tools/configure.sh) and
# builds it first. Exit status: 0 passed, 77 no CUDA device, anything else a failure.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-${KFT_BUILD_DIR:-$src/build-gpu}}
exe=$build/tests/test_nccl
conformance=$build/tests/test_conformance_nccl
ddp=$build/tests/test_ddp_nccl
kernels=$build/tests/test_cuda_reduce
ipc=$build/tests/test_cuda_ipc
ipc_conformance=$build/tests/test_conformance_cuda_ipc
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

echo "== GPUs"
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
  echo "(nvidia-smi not available)"

if [[ ! -x $exe ]]; then
  echo "== building $exe"
  if [[ ! -f $build/CMakeCache.txt ]]; then
    bash "$src/tools/configure.sh" "$build" -DKFT_WITH_MPI=AUTO -DKFT_WITH_HWLOC=AUTO || exit 1
  fi
  cmake --build "$build" --target test_nccl test_conformance_nccl test_ddp_nccl test_cuda_reduce test_cuda_ipc -j "$(nproc)" || exit 1
fi
[[ -x $ipc_conformance ]] || cmake --build "$build" --target test_conformance_cuda_ipc -j "$(nproc)" || true
[[ -x $build/bench/allreduce_perf ]] || cmake --build "$build" --target allreduce_perf -j "$(nproc)" || true
[[ -x $build/bench/cuda_reduce_perf ]] || cmake --build "$build" --target cuda_reduce_perf -j "$(nproc)" || true
[[ -x $build/bench/cuda_ipc_perf ]] || cmake --build "$build" --target cuda_ipc_perf -j "$(nproc)" || true
[[ -x $build/bench/ddp_overlap_cuda ]] || cmake --build "$build" --target ddp_overlap_cuda -j "$(nproc)" || true
[[ -x $build/tests/test_cuda_optim ]] || cmake --build "$build" --target test_cuda_optim -j "$(nproc)" || true
[[ -x $build/examples/08-fashion-mnist-gpu && -x $build/tools/kftrun ]] ||
  cmake --build "$build" --target 08-fashion-mnist-gpu kftrun -j "$(nproc)" || true

# The GPU trainer (examples/08) on 1 and 2 ranks; $1 says how the ranks share the GPU, the rest
# prefixes the commands (an environment for MPS). Sets trc on failure.
trc=0
trained=0
trainer() {
  local how=$1
  shift
  [[ -x $build/examples/08-fashion-mnist-gpu && -x $build/tools/kftrun ]] || return 0
  local data=${KFT_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
  if [[ ! -f $data/train-images-idx3-ubyte.gz ]]; then
    echo "SKIP the GPU trainer on Fashion-MNIST: no $data/train-images-idx3-ubyte.gz (set KFT_FMNIST_DIR)"
    return 0
  fi
  for p in 1 2; do
    echo "== the generic trainer on the GPU: Fashion-MNIST MLP (cuBLAS), $p rank(s) over CUDA IPC, $how"
    "$@" timeout 300 "$build/tools/kftrun" --nproc-per-node $p -- \
      "$build/examples/08-fashion-mnist-gpu" --data "$data" --epochs 3 --evals-per-epoch 1 --target 0.85 \
      --require-target || trc=$?
  done
}

start=$SECONDS
echo "== test_nccl: ranks as threads"
timeout 600 "$exe" --log_level=test_suite --report_level=short --color_output=false
rc=$?
if [[ $rc -eq 77 ]]; then
  echo "run-gpu-checks: skipped (no CUDA device)"
  exit 77
fi

echo "== test_nccl: 2 processes meeting through a file store"
store=$(mktemp -d)
logs=$(mktemp -d)
pids=()
for r in 0 1; do
  KFT_TEST_RANK=$r KFT_TEST_SIZE=2 KFT_TEST_STORE=$store/store timeout 120 "$exe" \
    --run_test=processes_from_the_environment --log_level=test_suite --color_output=false >"$logs/$r" 2>&1 &
  pids+=($!)
done
prc=0
for r in 0 1; do
  wait "${pids[$r]}" || prc=$?
  sed "s/^/[process $r] /" "$logs/$r"
done
rm -rf "$store" "$logs"

crc=0
if [[ -x $conformance ]]; then
  echo "== conformance on NCCL"
  timeout 300 "$conformance" --log_level=error --report_level=short --color_output=false
  crc=$?
fi

drc=0
if [[ -x $ddp ]]; then
  echo "== the DDP reducer over NCCL"
  timeout 300 "$ddp" --log_level=test_suite --report_level=short --color_output=false
  drc=$?
fi

brc=0
if [[ -x $build/bench/allreduce_perf ]]; then
  echo "== all_reduce_perf on NCCL (one rank), nccl-tests' columns"
  timeout 300 "$build/bench/allreduce_perf" --backend nccl -b 8 -e 1G -f 4 -n 20 -w 5 -c 1
  brc=$?
fi

krc=0
if [[ -x $kernels ]]; then
  echo "== kft's CUDA reduction kernels against a host reference"
  timeout 300 "$kernels" --log_level=test_suite --report_level=short --color_output=false
  krc=$?
fi

kbrc=0
if [[ -x $build/bench/cuda_reduce_perf ]]; then
  echo "== kft's CUDA reduction kernels beside cudaMemcpy device to device"
  timeout 300 "$build/bench/cuda_reduce_perf" -b 1M -e 1G -f 4 -k 2,4 -d float,half,bfloat16 -o sum,avg,min,max \
    ${KFT_GPU_CHECKS_JSON:+--json "$KFT_GPU_CHECKS_JSON"}
  kbrc=$?
fi

orc_opt=0
if [[ -x $build/tests/test_cuda_optim ]]; then
  echo "== the trainer's device optimizer (cuda_sgd) against the host sgd"
  timeout 120 "$build/tests/test_cuda_optim" --log_level=test_suite --report_level=short --color_output=false
  orc_opt=$?
fi

irc=0
if [[ -x $ipc ]]; then
  echo "== the CUDA IPC communicator between processes"
  timeout 900 "$ipc"
  irc=$?
fi

icrc=0
if [[ -x $ipc_conformance ]]; then
  echo "== conformance on the CUDA IPC communicator (ranks as processes)"
  KFT_CONFORMANCE_CUDA_IPC_RANKS=${KFT_CONFORMANCE_CUDA_IPC_RANKS:-2 3} timeout 600 "$ipc_conformance" \
    --log_level=error --report_level=short --color_output=false
  icrc=$?
fi

iprc=0
orc=0
if [[ -x $build/bench/cuda_ipc_perf ]]; then
  echo "== all_reduce_perf over CUDA IPC (2 and 4 processes), nccl-tests' columns"
  timeout 300 "$build/bench/cuda_ipc_perf" -p 2,4 -b 8 -e 256M -f 4 -n 20 -w 5 \
    ${KFT_GPU_CHECKS_IPC_JSON:+--json "$KFT_GPU_CHECKS_IPC_JSON"}
  iprc=$?
  mps=$(command -v nvidia-cuda-mps-control || ls /usr/local/nvidia/bin/nvidia-cuda-mps-control 2>/dev/null || true)
  if [[ $iprc -eq 0 && -n $mps ]]; then
    echo "== all_reduce_perf over CUDA IPC under MPS ($mps -d)"
    mps_dir=$(mktemp -d)
    if CUDA_MPS_PIPE_DIRECTORY=$mps_dir CUDA_MPS_LOG_DIRECTORY=$mps_dir "$mps" -d; then
      CUDA_MPS_PIPE_DIRECTORY=$mps_dir timeout 300 "$build/bench/cuda_ipc_perf" -p 2,4 -b 8 -e 512M -f 4 -n 20 -w 5 \
        ${KFT_GPU_CHECKS_IPC_JSON:+--json "$KFT_GPU_CHECKS_IPC_JSON"}
      iprc=$?
      if [[ -x $build/bench/ddp_overlap_cuda ]]; then
        echo "== the DDP reducer's hidden fraction over CUDA IPC under MPS (GPU backward: sleeping, then FMA)"
        CUDA_MPS_PIPE_DIRECTORY=$mps_dir timeout 300 "$build/bench/ddp_overlap_cuda" -p 2,4 \
          ${KFT_GPU_CHECKS_DDP_JSON:+--json "$KFT_GPU_CHECKS_DDP_JSON"} || orc=$?
        CUDA_MPS_PIPE_DIRECTORY=$mps_dir timeout 300 "$build/bench/ddp_overlap_cuda" -p 2,4 --backward fma \
          ${KFT_GPU_CHECKS_DDP_JSON:+--json "$KFT_GPU_CHECKS_DDP_JSON"} || orc=$?
      fi
      trainer "under MPS" env CUDA_MPS_PIPE_DIRECTORY=$mps_dir
      trained=1
      echo quit | CUDA_MPS_PIPE_DIRECTORY=$mps_dir "$mps"
    else
      echo "MPS did not start: skipped"
    fi
    rm -rf "$mps_dir"
  fi
fi

[[ $trained -eq 1 ]] || trainer "time-sliced (no MPS here)" env

echo "run-gpu-checks: threads exit $rc, processes exit $prc, conformance exit $crc, ddp exit $drc, bench exit $brc," \
  "kernels exit $krc, kernel bench exit $kbrc, optimizer exit $orc_opt, cuda ipc exit $irc," \
  "cuda ipc conformance exit $icrc, ipc bench exit $iprc," \
  "ddp overlap exit $orc, gpu trainer exit $trc, $((SECONDS - start)) s"
[[ $rc -eq 0 && $prc -eq 0 && $crc -eq 0 && $drc -eq 0 && $brc -eq 0 && $krc -eq 0 && $kbrc -eq 0 && $orc_opt -eq 0 &&
  $irc -eq 0 && $icrc -eq 0 && $iprc -eq 0 && $orc -eq 0 && $trc -eq 0 ]]

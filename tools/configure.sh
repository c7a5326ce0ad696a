#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Configures a kft build directory the way the README's commands do: warnings as errors, MPI,
# hwloc and Gloo required, CUDA and NCCL required when the CUDA toolkit is installed (then the GPU
# headers are compiled with nvcc; no GPU is needed for that).
#
#   tools/configure.sh BUILD_DIR [extra cmake args...]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$1; shift

gpu=(-DKFT_WITH_CUDA=OFF -DKFT_WITH_NCCL=OFF)
nvcc=$(command -v nvcc || true)
[[ -n "$nvcc" ]] || { [[ -x /usr/local/cuda/bin/nvcc ]] && nvcc=/usr/local/cuda/bin/nvcc; } || true
if [[ -n "$nvcc" ]]; then
  gpu=(-DKFT_WITH_CUDA=ON -DKFT_WITH_NCCL=ON -DCMAKE_CUDA_COMPILER="$nvcc"
       -DCUDAToolkit_ROOT="$(dirname "$(dirname "$nvcc")")")
else
  echo "configure: no CUDA toolkit (nvcc) found: CUDA and NCCL components off, GPU headers not compiled"
fi
# Debug information: line tables only (-g1: backtraces and perf name functions and lines; no
# variables). Full -g made the suite's build about 40% slower on 2 cores (bench/collectives/all_reduce.cpp:
# 82-89 s with -g, 51 s with -g1, 48 s without; examples/08's main.cu 116 s against 92 s).
# A debugging session passes its own: tools/configure.sh BUILD -DCMAKE_BUILD_TYPE=Debug.
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKFT_WERROR=ON \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -g1 -DNDEBUG" -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG -Xcompiler=-g1" \
  -DKFT_WITH_MPI=ON -DKFT_WITH_HWLOC=ON -DKFT_WITH_GLOO=ON "${gpu[@]}" "$@"

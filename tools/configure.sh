#!/usr/bin/env bash
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
cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKFT_WERROR=ON \
  -DKFT_WITH_MPI=ON -DKFT_WITH_HWLOC=ON -DKFT_WITH_GLOO=ON "${gpu[@]}" "$@"

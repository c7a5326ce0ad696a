#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's "main job" command: data-parallel training of an MLP on Fashion-MNIST with kft's
# DDP trainer, on every core of this machine over shared memory, started by kftrun. It installs
# the Debian packages it needs (the dataset is Debian's dataset-fashion-mnist), builds the
# example, measures one rank's throughput for the weak-scaling figure, then trains.
#
#   bash examples/run-demo.sh [extra options for 05-fashion-mnist, e.g. --epochs 8]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${KFT_BUILD_DIR:-$src/build-demo}
ranks=${KFT_DEMO_RANKS:-$(nproc)}

bash "$src/tools/install-deps.sh" --build
bash "$src/tools/configure.sh" "$build" -DKFT_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target 05-fashion-mnist kftrun

exe="$build/examples/05-fashion-mnist"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
echo "== one rank, 300 steps, 1 BLAS thread: the baseline of the weak-scaling efficiency"
"$exe" --threads 1 --max-steps 300 --evals-per-epoch 1 --quiet --log-json "$log" "$@" >/dev/null
rate=$(sed -n 's/.*"event":"summary".*"samples_per_s":\([0-9.]*\).*/\1/p' "$log" | tail -1)
echo "   $rate samples/s"
echo "== kftrun --nproc-per-node $ranks: the MLP on Fashion-MNIST, data-parallel over shared memory"
"$build/tools/kftrun" --nproc-per-node "$ranks" -- "$exe" --threads 1 --baseline-rate "$rate" --require-target "$@"

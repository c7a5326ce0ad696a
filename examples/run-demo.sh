#!/usr/bin/env bash
# The README's "main job" command. The DDP demo does not exist yet; until it does, this runs
# the best end-to-end thing there is: the same binary under mpirun and with no launcher, each rank
# telling who it is (example 01) and kft-info showing what one rank sees in full.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${KFT_BUILD_DIR:-$src/build-demo}

bash "$src/tools/install-deps.sh" --build
bash "$src/tools/configure.sh" "$build" -DKFT_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target 01-discover kft-info

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== mpirun -np 3: example 01 on every rank"
mpirun -np 3 --oversubscribe "$build/examples/01-discover" | sort
echo "== no launcher: example 01 as a single process"
"$build/examples/01-discover"
echo "== kft-info under mpirun -np 2, rank 0's full report"
mpirun -np 2 --oversubscribe sh -c 'if [ "$OMPI_COMM_WORLD_RANK" = 0 ]; then exec "$0"; else exec "$0" >/dev/null; fi' \
  "$build/tools/kft-info"

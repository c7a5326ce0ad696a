#!/usr/bin/env bash
# The README's "main job" command. The DDP demo does not exist yet; until it does, this runs
# the best end-to-end thing there is: kftrun (kft's launcher) starting ranks that discover who
# they are, meet through the job's store and allreduce through shared memory, the same binary
# under mpirun and alone, and kft-info's full report of one rank.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${KFT_BUILD_DIR:-$src/build-demo}

bash "$src/tools/install-deps.sh" --build
bash "$src/tools/configure.sh" "$build" -DKFT_BUILD_TESTS=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target 01-discover 02-rendezvous 03-allreduce kft-info kftrun

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
echo "== kftrun --nproc-per-node 3: example 01 (who am I?) on every rank"
"$build/tools/kftrun" --nproc-per-node 3 -- "$build/examples/01-discover" | sort
echo "== kftrun --nproc-per-node 3: example 02 (meet through the store)"
"$build/tools/kftrun" --nproc-per-node 3 -- "$build/examples/02-rendezvous"
echo "== kftrun --nproc-per-node 2: example 03 (allreduce through shared memory)"
"$build/tools/kftrun" --nproc-per-node 2 -- "$build/examples/03-allreduce"
echo "== mpirun -np 3: example 01 again, no change to the binary"
mpirun -np 3 --oversubscribe "$build/examples/01-discover" | sort
echo "== no launcher: example 01 as a single process"
"$build/examples/01-discover"
echo "== kft-info under kftrun on every rank (they group by host through the store), rank 0's full report"
"$build/tools/kftrun" --nproc-per-node 2 -- sh -c 'if [ "$RANK" = 0 ]; then exec "$0"; else exec "$0" >/dev/null; fi' "$build/tools/kft-info"

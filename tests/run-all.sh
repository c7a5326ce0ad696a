#!/usr/bin/env bash
# The README's test command: installs what the tests need, builds everything with warnings
# as errors, and runs the whole suite with CTest (unit, MPI, torchrun, a real Slurm cluster
# started and stopped by the suite, package consumption, header checks).
#
#   bash tests/run-all.sh [ctest args...]      e.g. -L unit, -R srun
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${KFT_BUILD_DIR:-$src/build-tests}

bash "$src/tools/install-deps.sh"
bash "$src/tools/configure.sh" "$build"
cmake --build "$build" -j "$(nproc)"
cd "$build"
# Tests start real launchers and daemons; each has a timeout and they clean up after themselves.
exec ctest --output-on-failure --timeout 300 -j 2 "$@"

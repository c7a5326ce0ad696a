#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The README's test command: installs what the tests need, builds everything with warnings
# as errors, and runs the whole suite with CTest (unit, MPI, torchrun, a real Slurm cluster
# started and stopped by the suite, package consumption, header checks, the fault matrix,
# fuzzing), then the ASan+UBSan and TSan subsets (tests/sanitizers/run.sh).
#
#   bash tests/run-all.sh [ctest args...]      e.g. -L unit, -R srun
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${KFT_BUILD_DIR:-$src/build-tests}

# Where the time goes: each part's seconds, printed as a table at the end (docs/building.md).
parts=()
t0=$(date +%s) last=$t0
part() { local now; now=$(date +%s); parts+=("$1|$((now - last))"); last=$now; }

bash "$src/tools/install-deps.sh"
part "install packages"
bash "$src/tools/configure.sh" "$build"
part "configure"
cmake --build "$build" -j "$(nproc)"
part "build (main)"
cd "$build"
# Tests start real launchers and daemons; each has a timeout and they clean up after themselves.
rc=0
(cd "$build" && ctest --output-on-failure --timeout 300 -j 2 "$@") || rc=$?
part "ctest (main)"
# The whole run (no CTest arguments) also runs the sanitizer subsets (docs/reliability.md),
# each with its own build directory and CTest summary. KFT_SANITIZERS=0 leaves them out.
if [[ $# -eq 0 && "${KFT_SANITIZERS:-1}" != 0 ]]; then
  for mode in asan tsan; do
    bash "$src/tests/sanitizers/run.sh" "$mode" "$build-$mode" || rc=1
    part "sanitizers: $mode (build + ctest)"
  done
fi
echo
echo "run-all: where the time went ($(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
for p in "${parts[@]}"; do printf '  %-36s %6d s\n' "${p%%|*}" "${p##*|}"; done
printf '  %-36s %6d s (%d min)\n' "total" "$(( $(date +%s) - t0 ))" "$(( ($(date +%s) - t0 + 59) / 60 ))"
exit $rc

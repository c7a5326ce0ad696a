#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kft's sanitizer runs: builds kft's tests and tools with a sanitizer and runs them with CTest.
#
#   tests/sanitizers/run.sh asan [BUILD_DIR] [PHASE]   AddressSanitizer + UndefinedBehaviorSanitizer
#   tests/sanitizers/run.sh tsan [BUILD_DIR] [PHASE]   ThreadSanitizer
#
# PHASE is `all` (the default: build, then test), `build` or `test`: tests/run-all.sh builds
# the subsets under SCHED_IDLE while the main suite runs (most of its tests wait on processes
# and sockets, leaving CPU idle), then tests them.
#
# By default each runs the subset CI runs (the store, the shm transport across threads and
# processes, the process groups and progress engine, the DDP reducer, kftrun, parsing); with
# KFT_SANITIZE_ALL=1 the asan run builds and runs the whole suite but the fuzz targets and the
# benches (measured on 2 cores: build about 20 min, 175 tests in 20 min).
# A finding stops the test that hit it (halt_on_error): fix it; a suppression in
# tests/sanitizers/*.supp needs a comment saying why it is not kft's bug.
set -euo pipefail
mode=${1:?usage: run.sh asan|tsan [BUILD_DIR] [all|build|test]}
phase=${3:-all}
case "$phase" in all|build|test) ;; *) echo "run.sh: unknown phase \"$phase\" (all, build or test)" >&2; exit 2 ;; esac
src=$(cd "$(dirname "$0")/../.." && pwd)
here="$src/tests/sanitizers"
case "$mode" in
  asan)
    flag="address,undefined"
    targets=(test_parse test_slurm_lists test_discovery test_store test_shm_collectives test_groups test_ddp
             kftrun kft-info shm_worker ddp_worker status_worker)
    tests='^(test_parse|test_slurm_lists|test_discovery|test_store|test_shm_collectives|test_groups|test_ddp)$|^kftrun\.|^shm\.process\.|^ddp\.process\.|^kft_info\.'
    # Programs that initialise Open MPI: checked for memory errors and UB, but not for leaks.
    # Open MPI unloads its components at MPI_Finalize, so what they keep until exit has stacks
    # of "<unknown module>" that no suppression can name (OMPI's own dlclose switch does not
    # reach every process mpirun and srun start).
    mpi_tests='^kft_info\.(env|mpich_launcher|mpirun|topology\.host_id|srun_pmix|salloc_mpirun)|^shm\.process\.sweep_mpirun$|^ddp\.process\.equivalence_group$'
    ;;
  tsan)
    flag="thread"
    targets=(test_store test_shm_collectives test_groups kftrun kft-info status_worker)
    # kftrun's tests that start real agents: the store thread beside the agent's loop.
    tests='^(test_store|test_shm_collectives|test_groups)$|^kftrun\.'
    mpi_tests=''
    ;;
  *) echo "run.sh: unknown mode \"$mode\" (asan or tsan)" >&2; exit 2 ;;
esac
build=${2:-$src/build-$mode}

# Only kft's own binaries are instrumented; CUDA and the benches are not part of these runs.
# -Og -g1: line numbers in reports, and the cheapest build whose tests still run as fast as at
# -O1 (measured on 2 cores: test_groups.cpp under ASan compiles in 48 s at -O1, 28.5 s at -Og,
# 23.7 s at -O0; the asan subset's 62 tests ran in 58-60 s at -O1 and -Og, 98 s at -O0).
if [[ "$phase" != test ]]; then
bash "$src/tools/configure.sh" "$build" -DKFT_SANITIZE="$flag" -DKFT_WITH_CUDA=OFF -DKFT_WITH_NCCL=OFF \
  -DKFT_BUILD_BENCH=OFF -DKFT_FUZZ=OFF -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-Og -g1 -DNDEBUG" >/dev/null
start=$(date +%s)
if [[ "${KFT_SANITIZE_ALL:-0}" == 1 && "$mode" == asan ]]; then
  cmake --build "$build" -j "$(nproc)"
else
  cmake --build "$build" -j "$(nproc)" --target "${targets[@]}"
fi
echo "sanitizers ($mode): built in $(( $(date +%s) - start )) s"
fi
[[ "$phase" != build ]] || exit 0
[[ -f "$build/CTestTestfile.cmake" ]] || { echo "run.sh: $build holds no $mode build (run the build phase first)" >&2; exit 2; }
if [[ "${KFT_SANITIZE_ALL:-0}" == 1 && "$mode" == asan ]]; then
  tests='.'
  # ... and test_binding: hwloc unloads its PCI plugin when a topology is destroyed, so the
  # plugin's (libpciaccess's) allocations kept until exit have "<unknown module>" stacks too.
  mpi_tests='mpi|srun|salloc|kft_info|conformance_group|hierarchical|ddp\.process|trainer\.process|example\.|bench|^test_binding$'
fi

export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:abort_on_error=0:exitcode=86"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=87"
export LSAN_OPTIONS="suppressions=$here/lsan.supp:print_suppressions=0"
export TSAN_OPTIONS="halt_on_error=1:exitcode=88:second_deadlock_stack=1"
# Where it reaches, keep Open MPI's components loaded, so that their stacks have names.
export OMPI_MCA_mca_base_component_disable_dlclose=1
cd "$build"
start=$(date +%s)
rc=0
if [[ -n "$mpi_tests" ]]; then
  ctest --output-on-failure --timeout 600 -j 2 -R "$tests" -E "$mpi_tests" || rc=$?
  ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0" ctest --output-on-failure --timeout 600 -j 2 -R "$mpi_tests" || rc=$?
else
  ctest --output-on-failure --timeout 600 -j 2 -R "$tests" || rc=$?
fi
echo "sanitizers ($mode): ran in $(( $(date +%s) - start )) s"
exit $rc

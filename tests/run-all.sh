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
# Each row also has the CPU seconds its processes used (user + system, from bash's `times`):
# a part far below 2 CPU-seconds per second leaves the CPUs idle.
parts=() notes=()
cpu_file=$(mktemp)
trap 'rm -f "$cpu_file"' EXIT
children_cpu() {  # sets cpu: user + system seconds of the shell's finished children (`times`
  times > "$cpu_file"  # runs in this shell: in a $(...) subshell it would count the subshell's)
  cpu=$(tail -n 1 "$cpu_file" | awk '{ n = 0; for (i = 1; i <= 2; i++) { split($i, a, /[ms]/); n += a[1] * 60 + a[2] } printf "%d", n }')
}
children_cpu
t0=$(date +%s) last=$t0 last_cpu=$cpu
part() {
  local now; now=$(date +%s); children_cpu
  parts+=("$1|$((now - last))|$((cpu - last_cpu))"); last=$now last_cpu=$cpu
}

bash "$src/tools/install-deps.sh"
part "install packages"
# The tests' and examples' programs at -Og instead of -O2, those whose tests compute (the
# conformance sweeps: kft_suite_computes in tests/CMakeLists.txt) at -O1 with the vectorizer:
# measured on the 2-vCPU AMD EPYC VM, the test programs compiled in 511 CPU-s against about 810
# at -O1 (test_groups 13 s against 25), and ran as fast but for those (docs/building.md). As in
# the sanitizer builds (also -Og), GCC's "maybe uninitialized" guesses are not errors there. The
# tools keep their flags, as do the examples that ask for -O3. The benchmarks, whose tests here
# are smoke runs checking what they print (their numbers come from runs at their own -O3), are
# built at -O1 with the vectorizer: ddp_perf compiled in 25 s against 44 s at -O3.
# No debug information either (configure.sh's -g1 dropped): the suite prints no backtraces, and
# the line tables cost up to 13% of a unit's compile, measured in pairs on the same VM:
# test_groups.cpp 16.9 s against 14.7 s at -Og, test_trainer.cpp 14.2 against 13.7, example 05's
# main.cpp 66.1 against 64.7, kftrun's main.cpp and the bench harness no difference. A tree for
# debugging is configured by hand.
suite=(-DKFT_SUITE_OPTIMIZE="-Og;-Wno-maybe-uninitialized" -DKFT_SUITE_OPTIMIZE_COMPUTE="-O1;-ftree-vectorize"
       -DKFT_BENCH_OPTIMIZE="-O1;-ftree-vectorize"
       -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG" -DCMAKE_CUDA_FLAGS_RELWITHDEBINFO="-O2 -DNDEBUG")
# No GPU here: the CUDA programs are compiled and linked only (their tests skip), so without the
# optimiser (KFT_CUDA_BUILD_ONLY, docs/building.md).
nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || suite+=(-DKFT_CUDA_BUILD_ONLY=ON)
bash "$src/tools/configure.sh" "$build" "${suite[@]}"
part "configure"
cmake --build "$build" -j "$(nproc)"
part "build (main)"
cd "$build"
# The whole run (no CTest arguments) also runs the sanitizer subsets (docs/reliability.md),
# each with its own build directory and CTest summary. KFT_SANITIZERS=0 leaves them out.
# Their builds run beside the main suite, whose tests mostly wait on processes, sockets and
# daemons, under SCHED_IDLE: the compiler takes only the CPU those tests leave idle (at nice 19
# instead, test_conformance_shm took 64 s beside a build against 45 s under SCHED_IDLE and 34 s
# alone: a nice 19 task still gets the CPU whenever a test's rank yields).
sanitizers=0
[[ $# -eq 0 && "${KFT_SANITIZERS:-1}" != 0 ]] && sanitizers=1
san_log="$build-sanitizers-build.log"
# The container tests' image (when they are registered) is built first in the same way, so no
# test holds one of CTest's two slots for minutes waiting for idle CPU: containers.image and
# each container test run the same script first and find the image current.
image_script="$build/tests/containers/build-test-image.sh"
image_log="$build-image-build.log"
prebuild_image=0
[[ $# -eq 0 && -f "$image_script" ]] && prebuild_image=1
if ((sanitizers || prebuild_image)); then
  rm -f "$san_log.seconds"
  # It writes its wall and CPU seconds for the table.
  ( start=$(date +%s)
    # Its outcome is the fixture's to report (a failure or a skip shows there).
    ((prebuild_image)) && { bash "$image_script" > "$image_log" 2>&1 || true; }
    ((sanitizers)) || exit 0
    for mode in asan tsan; do
      chrt --idle 0 bash "$src/tests/sanitizers/run.sh" "$mode" "$build-$mode" build || exit 1
    done
    cpu_file="$san_log.times" && children_cpu && rm -f "$cpu_file"
    echo "$(( $(date +%s) - start )) $cpu" > "$san_log.seconds" ) > "$san_log" 2>&1 &
  san_pid=$!
fi
# Tests start real launchers and daemons; each has a timeout and they clean up after themselves.
# Two slots: three gave the same total (ctest 812 s against 829 s, and the sanitizer builds,
# which take the CPU the tests leave, then ran 23 s past it; docs/building.md).
rc=0
(cd "$build" && ctest --output-on-failure --timeout 300 -j 2 "$@") || rc=$?
part "ctest (main)"
((sanitizers || !prebuild_image)) || wait "$san_pid" || true
if ((sanitizers)); then
  san_rc=0
  wait "$san_pid" || san_rc=$?
  part "sanitizer builds: after ctest (main)"
  if [[ -f "$san_log.seconds" ]]; then
    read -r san_wall san_cpu _ < "$san_log.seconds"
    # bash counts a background job's CPU when it reaps it: at the `wait` above (this row holds
    # nothing else), or while it waited for ctest when the job ended first.
    i=$(( ${#parts[@]} - 1 ))
    IFS='|' read -r name wall cpu <<< "${parts[$i]}"
    ((cpu + 1 >= san_cpu)) || i=$((i - 1))
    IFS='|' read -r name wall cpu <<< "${parts[$i]}"
    cpu=$((cpu - san_cpu)); ((cpu >= 0)) || cpu=0
    parts[$i]="$name|$wall|$cpu"
    what="the sanitizer builds"; ((prebuild_image)) && what="the test image and the sanitizer builds"
    notes+=("$what ran ${san_wall} s (${san_cpu} CPU-s, not in the rows above) under SCHED_IDLE beside ctest (main)")
  fi
  if ((san_rc != 0)); then
    echo "run-all: the sanitizer builds failed ($san_log):"; tail -n 60 "$san_log"; rc=1
  else
    grep -h 'built in' "$san_log" || true
    # The two subsets run side by side (each CTest at -j 2): they share no port, daemon or lock
    # (Slurm and torchrun's fixed port are the asan subset's alone; kftrun's tests pick free
    # ports and mark their processes). Their outputs follow one another below.
    for mode in asan tsan; do
      rm -f "$build-$mode-test.rc"  # (a stale 0 from an earlier run must not pass this one)
      ( mode_rc=0
        bash "$src/tests/sanitizers/run.sh" "$mode" "$build-$mode" test > "$build-$mode-test.log" 2>&1 || mode_rc=$?
        echo "$mode_rc" > "$build-$mode-test.rc" ) &
    done
    wait
    for mode in asan tsan; do
      cat "$build-$mode-test.log"
      [[ "$(cat "$build-$mode-test.rc" 2>/dev/null)" == 0 ]] || rc=1
    done
    part "sanitizers: asan + tsan (ctest)"
  fi
fi
echo
echo "run-all: where the time went ($(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'))"
printf '  %-38s %6s   %s\n' "part" "wall" "CPU (user + system)"
for p in "${parts[@]}"; do IFS='|' read -r name wall cpu <<< "$p"; printf '  %-38s %6d s %6d s\n' "$name" "$wall" "$cpu"; done
printf '  %-38s %6d s (%d min)\n' "total" "$(( $(date +%s) - t0 ))" "$(( ($(date +%s) - t0 + 59) / 60 ))"
for n in "${notes[@]}"; do echo "  ($n)"; done
exit $rc

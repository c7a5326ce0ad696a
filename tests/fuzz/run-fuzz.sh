#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Runs one libFuzzer target the way CTest does (docs/fuzzing.md).
#
#   run-fuzz.sh fuzz    BINARY SEEDS_DIR WORK_DIR SECONDS [libFuzzer flags...]
#     Copies the committed seeds to WORK_DIR/corpus (the source tree is never written), fuzzes
#     for SECONDS; new inputs stay in WORK_DIR/corpus, a crash is WORK_DIR/crash-<sha1> (or
#     leak-, timeout-, oom-), and the run fails.
#   run-fuzz.sh regress BINARY REGRESSIONS_DIR [libFuzzer flags...]
#     Replays every file of REGRESSIONS_DIR once (no fuzzing); a missing or empty folder passes.
set -euo pipefail
mode=${1:?usage: run-fuzz.sh fuzz|regress BINARY DIR ...}
bin=${2:?binary}
# The limits a finding is measured against: 10 s for one input, 2 GiB of memory.
limits=(-timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=2048)
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}

case "$mode" in
  fuzz)
    seeds=${3:?seeds dir} work=${4:?work dir} seconds=${5:?seconds}
    shift 5
    rm -rf "$work/corpus" "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* "$work"/slow-unit-*
    mkdir -p "$work/corpus"
    cp -R "$seeds/." "$work/corpus/"
    echo "run-fuzz: $(basename "$bin") for ${seconds} s over $(find "$work/corpus" -type f | wc -l) seed(s); findings go to $work/"
    exec "$bin" "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$work/" "$@" \
      "$work/corpus"
    ;;
  regress)
    dir=${3:?regressions dir}
    shift 3
    inputs=()
    if [[ -d "$dir" ]]; then
      while IFS= read -r -d '' f; do inputs+=("$f"); done < <(find "$dir" -type f ! -name '.*' -print0 | sort -z)
    fi
    if ((${#inputs[@]} == 0)); then
      echo "run-fuzz: no regression inputs in $dir"
      exit 0
    fi
    echo "run-fuzz: replaying ${#inputs[@]} regression input(s) from $dir"
    exec "$bin" "${limits[@]}" "$@" "${inputs[@]}"
    ;;
  *)
    echo "run-fuzz: unknown mode $mode (fuzz or regress)" >&2
    exit 2
    ;;
esac

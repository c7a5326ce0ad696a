#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kft::init under MPICH's own launcher: examples/00-your-project's program compiled with plain
# mpicxx.mpich (include/ only, -DKFT_WITH_MPI=1, no CMake) and started by mpirun.mpich as 3 ranks
# must meet through MPI and sum 1+2+3; rank 0's report (KFT_LOG_LEVEL=info) must say so.
#
#   init_mpich.sh <kft source dir>        exit 77 (skip) when MPICH's compiler or launcher is absent
set -euo pipefail
src=${1:?usage: init_mpich.sh <kft source dir>}
cxx=$(command -v mpicxx.mpich || true)
run=$(command -v mpirun.mpich || true)
if [[ -z "$cxx" || -z "$run" ]]; then
  echo "SKIP: mpicxx.mpich or mpirun.mpich not found (Debian: apt-get install mpich libmpich-dev)"
  exit 77
fi
work=$(mktemp -d /tmp/kft-init-mpich-XXXXXX)
trap 'rm -rf "$work"' EXIT
"$cxx" -std=c++20 -O1 -Wall -Wextra -Werror -DKFT_WITH_MPI=1 -I"$src/include" -pthread \
  "$src/examples/00-your-project/main.cpp" -o "$work/app"
set +e
out=$(KFT_LOG_LEVEL=info timeout 120 "$run" -np 3 "$work/app" 2>&1)
rc=$?
set -e
echo "$out"
fail() { echo "FAIL: $*"; exit 1; }
[[ $rc -eq 0 ]] || fail "mpirun.mpich -np 3 exited with $rc"
grep -q '^rank 0 of 3: v\[0\] = 6$' <<<"$out" || fail "no 'rank 0 of 3: v[0] = 6' line (the sum of 1+2+3)"
grep -q '^kft\[rank 0\] INFO: joined as rank 0 of 3; discovery: mpi; bootstrap: MPI (MPICH' <<<"$out" ||
  fail "rank 0 did not report meeting through MPICH's MPI"
echo "PASS: kft::init under mpirun.mpich, 3 ranks"

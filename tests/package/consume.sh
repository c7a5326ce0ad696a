#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# kft consumed the ways users do, each in a fresh temporary directory outside the source and
# build trees (removed afterwards, also on failure). Registered by tests/package/CMakeLists.txt.
#
#   consume.sh MODE      MODE: header_only configure_minimal find_package find_package_components
#                              missing_component example add_subdirectory fetchcontent pkgconfig deb
#
# Environment (set by CTest): KFT_SRC (source tree), KFT_BUILD (configured build tree), KFT_CMAKE,
# KFT_GENERATOR, KFT_CXX, KFT_VERSION (the project's), KFT_COMPONENTS (built components, ','),
# KFT_TOOLS (the tools built, ',').
# Exit status 77: skipped (CTest SKIP_RETURN_CODE), with the reason on stdout.
set -euo pipefail
mode=${1:?usage: consume.sh MODE}
# Stop ourselves (SIGTERM: the traps below clean up, the .deb is purged) before CTest's TIMEOUT
# would kill us without a chance to: KFT_TEST_TIMEOUT is that limit in seconds.
if [[ -z "${KFT_CONSUME_TIMED:-}" && -n "${KFT_TEST_TIMEOUT:-}" ]]; then
  KFT_CONSUME_TIMED=1 exec timeout -s TERM "$((KFT_TEST_TIMEOUT - 30))" bash "$0" "$@"
fi
for v in KFT_SRC KFT_BUILD KFT_CMAKE KFT_GENERATOR KFT_CXX KFT_VERSION; do
  [[ -n "${!v:-}" ]] || { echo "consume.sh: $v is not set (run through CTest)" >&2; exit 2; }
done
cmake=$KFT_CMAKE
IFS=',' read -r -a components <<<"${KFT_COMPONENTS:-}"
IFS=',' read -r -a tools <<<"${KFT_TOOLS:-}"

tmp=$(mktemp -d /tmp/kft-package-XXXXXX)
cleanups=()
cleanup() {
  local rc=$?
  for ((i = ${#cleanups[@]} - 1; i >= 0; i--)); do eval "${cleanups[i]}" || rc=1; done
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

fail() { echo "FAIL ($mode): $*" >&2; exit 1; }
skip() { echo "SKIP ($mode): $*"; exit 77; }
# run LOG cmd...: runs a step with its output in LOG, shown when it fails.
run() {
  local log=$1; shift
  if ! "$@" >"$log" 2>&1; then
    tail -n 60 "$log" >&2
    fail "$* failed (log above)"
  fi
}
# A clean environment for programs that discover their job: nothing from a launcher around CTest.
clean_env=(env -i "PATH=$PATH" "HOME=${HOME:-/tmp}")

install_prefix() {  # install_prefix DIR: cmake --install of the build tree into DIR
  run "$tmp/install.log" "$cmake" --install "$KFT_BUILD" --prefix "$1"
}
# consumer SRC BUILD [cmake args...]: configures, builds.
consumer() {
  local src=$1 build=$2; shift 2
  run "$build.configure.log" "$cmake" -S "$src" -B "$build" -G "$KFT_GENERATOR" -DCMAKE_CXX_COMPILER="$KFT_CXX" "$@"
  run "$build.build.log" "$cmake" --build "$build"
}
copy_consumer() { cp -r "$KFT_SRC/tests/package/consumer" "$tmp/consumer"; }
expect_line() {  # expect_line OUTPUT REGEX WHAT
  grep -Eq -- "$2" <<<"$1" || fail "$3: expected /$2/ in: $1"
}

case "$mode" in
header_only)
  # include/ alone, plain g++ (no CMake, no kft/configured.hpp), then 1, 2 and 3 ranks.
  mkdir "$tmp/copy"
  cp -r "$KFT_SRC/include" "$tmp/copy/include"
  [[ ! -e "$tmp/copy/include/kft/configured.hpp" ]] || fail "include/kft/configured.hpp is in the source tree"
  cp "$KFT_SRC/tests/package/header_only.cpp" "$tmp/copy/main.cpp"
  run "$tmp/compile.log" "$KFT_CXX" -std=c++20 -I"$tmp/copy/include" -pthread -Wall -Wextra -Werror -O1 \
    "$tmp/copy/main.cpp" -o "$tmp/prog"
  out=$("${clean_env[@]}" timeout 60 "$tmp/prog") || fail "1 process: exit status $?: $out"
  expect_line "$out" "^rank 0 of 1 .*allreduce OK" "1 process"
  expect_line "$out" "mpi0_cuda0_nccl0_hwloc0_gloo0" "include/ alone has every component off"
  for n in 2 3; do
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    run_id="kft-header-only-$$-$n"
    pids=()
    for ((r = 0; r < n; r++)); do
      "${clean_env[@]}" RANK=$r WORLD_SIZE=$n LOCAL_RANK=$r LOCAL_WORLD_SIZE=$n MASTER_ADDR=127.0.0.1 \
        MASTER_PORT="$port" TORCHELASTIC_RUN_ID="$run_id" timeout 60 "$tmp/prog" >"$tmp/out.$n.$r" 2>&1 &
      pids+=($!)
    done
    for ((r = 0; r < n; r++)); do
      st=0
      wait "${pids[r]}" || st=$?
      ((st == 0)) || { cat "$tmp"/out."$n".* >&2; fail "$n ranks: rank $r exited with status $st"; }
    done
    for ((r = 0; r < n; r++)); do
      expect_line "$(cat "$tmp/out.$n.$r")" "^rank $r of $n \(torchrun, shared memory: 1 node x $n ranks.*allreduce OK" "$n ranks, rank $r"
    done
    left=$(find /dev/shm -maxdepth 1 -name "*$run_id*" -printf '%f ')
    [[ -z "$left" ]] || fail "$n ranks left /dev/shm entries behind: $left"
  done
  echo "header_only: include/ alone compiled with plain $KFT_CXX; 1, 2 and 3 ranks allreduced correctly"
  ;;

configure_minimal)
  # Headers only: no tests, tools, examples or benchmarks, and none of their packages (a REQUIRED
  # find_package of a disabled package fails the configuration).
  run "$tmp/configure.log" "$cmake" -S "$KFT_SRC" -B "$tmp/build" -G "$KFT_GENERATOR" -DCMAKE_CXX_COMPILER="$KFT_CXX" \
    -DKFT_BUILD_TESTS=OFF -DKFT_BUILD_TOOLS=OFF -DKFT_BUILD_EXAMPLES=OFF -DKFT_BUILD_BENCH=OFF \
    -DCMAKE_DISABLE_FIND_PACKAGE_CLI11=ON -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_yaml-cpp=ON -DCMAKE_DISABLE_FIND_PACKAGE_Boost=ON \
    -DCMAKE_DISABLE_FIND_PACKAGE_benchmark=ON -DCMAKE_DISABLE_FIND_PACKAGE_ZLIB=ON
  run "$tmp/build.log" "$cmake" --build "$tmp/build"
  run "$tmp/install.log" "$cmake" --install "$tmp/build" --prefix "$tmp/prefix"
  for f in include/kft/kft.hpp include/kft/configured.hpp share/cmake/kft/kftConfig.cmake \
           share/cmake/kft/kftConfigVersion.cmake share/cmake/kft/kftTargets.cmake share/pkgconfig/kft.pc \
           share/doc/kft/LICENSE share/doc/kft/NOTICE share/kft/k8s-templates/README.md; do
    [[ -f "$tmp/prefix/$f" ]] || fail "the headers-only install lacks $f"
  done
  [[ ! -e "$tmp/prefix/bin" ]] || fail "the headers-only install has tools: $(ls "$tmp/prefix/bin")"
  echo "configure_minimal: headers-only configure, build and install without CLI11, nlohmann-json, yaml-cpp, Boost"
  ;;

find_package)
  # The installed package, asked for nothing: kft::kft only, without MPI on the machine.
  install_prefix "$tmp/prefix"
  for f in include/kft/kft.hpp include/kft/configured.hpp share/cmake/kft/kftConfig.cmake share/cmake/kft/kftTargets.cmake \
           share/pkgconfig/kft.pc share/doc/kft/LICENSE share/doc/kft/NOTICE share/kft/k8s-templates/README.md; do
    [[ -f "$tmp/prefix/$f" ]] || fail "the install lacks $f"
  done
  for c in "${components[@]}"; do
    [[ -z "$c" || -f "$tmp/prefix/share/cmake/kft/kft_${c}Targets.cmake" ]] || fail "the install lacks kft_${c}Targets.cmake"
  done
  for t in "${tools[@]}"; do
    [[ -z "$t" ]] && continue
    [[ -x "$tmp/prefix/bin/$t" ]] || fail "the install lacks the tool bin/$t"
    "$tmp/prefix/bin/$t" --help >"$tmp/$t.help" 2>&1 || fail "installed $t --help failed: $(cat "$tmp/$t.help")"
  done
  copy_consumer
  consumer "$tmp/consumer" "$tmp/build" -DKFT_CONSUME=find_package -DCMAKE_PREFIX_PATH="$tmp/prefix" \
    -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON -DCMAKE_DISABLE_FIND_PACKAGE_Gloo=ON
  out=$("$tmp/build/consumer") || fail "consumer failed: $out"
  expect_line "$out" "consumer OK via find_package \(v[0-9_]+_mpi0_cuda0_nccl0_hwloc0_gloo0\)" "kft::kft alone is the portable core"
  echo "$out"
  ;;

find_package_components)
  [[ -n "${components[*]}" ]] || skip "this build has no component (configure with -DKFT_WITH_MPI=ON)"
  install_prefix "$tmp/prefix"
  copy_consumer
  wanted=()
  for c in "${components[@]}"; do [[ "$c" == mpi || "$c" == hwloc || "$c" == gloo ]] && wanted+=("$c"); done
  [[ -n "${wanted[*]}" ]] || skip "none of mpi, hwloc, gloo is built"
  list=$(IFS=';'; echo "${wanted[*]}")
  consumer "$tmp/consumer" "$tmp/build" -DKFT_CONSUME=find_package -DCMAKE_PREFIX_PATH="$tmp/prefix" "-DKFT_COMPONENTS=$list"
  out=$("$tmp/build/consumer") || fail "consumer failed: $out"
  for c in "${wanted[@]}"; do expect_line "$out" "_${c}1" "kft::$c turns its component on"; done
  echo "$out"
  ;;

missing_component)
  install_prefix "$tmp/prefix"
  copy_consumer
  if "$cmake" -S "$tmp/consumer" -B "$tmp/build" -G "$KFT_GENERATOR" -DCMAKE_CXX_COMPILER="$KFT_CXX" \
      -DKFT_CONSUME=find_package -DCMAKE_PREFIX_PATH="$tmp/prefix" -DKFT_COMPONENTS=rocm >"$tmp/log" 2>&1; then
    fail "find_package(kft COMPONENTS rocm) succeeded"
  fi
  grep -q "kft was installed without the 'rocm' component" "$tmp/log" || { cat "$tmp/log" >&2; fail "no clear message"; }
  grep "without the 'rocm'" "$tmp/log"
  ;;

example)
  # examples/00-your-project as a user copies it, against the installed prefix, run as 1 process.
  install_prefix "$tmp/prefix"
  cp -r "$KFT_SRC/examples/00-your-project" "$tmp/app"
  consumer "$tmp/app" "$tmp/build" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
  out=$("${clean_env[@]}" timeout 60 "$tmp/build/app") || fail "app failed (status $?): $out"
  expect_line "$out" "^rank 0 of 1: v\[0\] = 1$" "one process sums its own 1s"
  echo "$out"
  # Under the installed kftrun, 3 ranks: 1 + 2 + 3.
  if [[ ",${KFT_TOOLS:-}," == *,kftrun,* ]]; then
    out=$("${clean_env[@]}" timeout 120 "$tmp/prefix/bin/kftrun" --nproc-per-node 3 -- "$tmp/build/app" 2>&1) ||
      fail "kftrun --nproc-per-node 3 app failed (status $?): $out"
    expect_line "$out" "rank 0 of 3: v\[0\] = 6$" "3 ranks under the installed kftrun"
    echo "$out"
  fi
  ;;

add_subdirectory)
  copy_consumer
  consumer "$tmp/consumer" "$tmp/build" -DKFT_CONSUME=add_subdirectory -DKFT_SOURCE_DIR="$KFT_SRC"
  out=$("$tmp/build/consumer") || fail "consumer failed: $out"
  expect_line "$out" "consumer OK via add_subdirectory" "add_subdirectory"
  echo "$out"
  ;;

fetchcontent)
  # From a local git URL at the checkout's HEAD commit (what is committed, not the work tree).
  command -v git >/dev/null || skip "git is not installed"
  # The checkout may belong to another user (a CI copy): trust this one repository.
  export GIT_CONFIG_COUNT=1 GIT_CONFIG_KEY_0=safe.directory GIT_CONFIG_VALUE_0="$KFT_SRC"
  git -C "$KFT_SRC" rev-parse --git-dir >/dev/null 2>&1 || skip "$KFT_SRC is not a git checkout"
  head=$(git -C "$KFT_SRC" rev-parse HEAD) || fail "git rev-parse HEAD failed in $KFT_SRC"
  copy_consumer
  consumer "$tmp/consumer" "$tmp/build" -DKFT_CONSUME=fetchcontent -DKFT_SOURCE_DIR="$KFT_SRC" -DKFT_GIT_TAG="$head"
  fetched=$(git -C "$tmp/build/_deps/kft-src" rev-parse HEAD) || fail "no clone in _deps/kft-src"
  [[ "$fetched" == "$head" ]] || fail "FetchContent checked out $fetched, not $head"
  out=$("$tmp/build/consumer") || fail "consumer failed: $out"
  expect_line "$out" "consumer OK via fetchcontent" "fetchcontent"
  echo "$out (commit $head)"
  ;;

pkgconfig)
  command -v pkg-config >/dev/null || skip "pkg-config is not installed"
  install_prefix "$tmp/prefix"
  export PKG_CONFIG_PATH="$tmp/prefix/share/pkgconfig"
  version=$(pkg-config --modversion kft) || fail "pkg-config does not find kft in $PKG_CONFIG_PATH"
  [[ "$version" == "$KFT_VERSION" ]] || fail "kft.pc says version $version, the project $KFT_VERSION"
  flags=$(pkg-config --cflags --libs kft)
  incdir=$(pkg-config --variable=includedir kft)
  [[ "$(realpath "$incdir")" == "$(realpath "$tmp/prefix/include")" ]] ||
    fail "kft.pc's includedir $incdir is not the prefix's include directory"
  [[ "$flags" == *"-I$incdir"* ]] || fail "pkg-config --cflags does not name $incdir: $flags"
  copy_consumer
  # shellcheck disable=SC2086 # the flags are words
  run "$tmp/compile.log" "$KFT_CXX" -std=c++20 '-DKFT_CONSUME_MODE="pkg-config"' "$tmp/consumer/main.cpp" \
    -o "$tmp/consumer.bin" $flags
  out=$("$tmp/consumer.bin") || fail "consumer failed: $out"
  expect_line "$out" "consumer OK via pkg-config" "pkg-config"
  echo "pkg-config --cflags --libs kft: $flags"
  echo "$out"
  ;;

deb)
  [[ $(id -u) == 0 ]] || skip "needs root to install the .deb with dpkg"
  if ! command -v dpkg >/dev/null || ! command -v dpkg-deb >/dev/null; then
    skip "dpkg is not installed (not a Debian system)"
  fi
  cpack=$(dirname "$cmake")/cpack
  [[ -x "$cpack" ]] || cpack=$(command -v cpack) || skip "cpack is not installed"
  if dpkg-query -W -f '${Status}' kft 2>/dev/null | grep -q installed; then
    skip "a package named kft is already installed on this machine; not replacing it"
  fi
  [[ ! -e /usr/include/kft && ! -e /usr/share/cmake/kft ]] || skip "/usr already holds a kft that dpkg does not own"
  run "$tmp/cpack.log" "$cpack" -G DEB -B "$tmp/pkg" --config "$KFT_BUILD/CPackConfig.cmake"
  deb=$(find "$tmp/pkg" -maxdepth 1 -name 'kft_*.deb' | head -n 1)
  [[ -n "$deb" ]] || { cat "$tmp/cpack.log" >&2; fail "cpack made no kft_*.deb in $tmp/pkg"; }
  dpkg-deb --info "$deb" >"$tmp/info" || fail "dpkg-deb --info $deb failed"
  grep -q "^ Package: kft$" "$tmp/info" || fail "the package is not named kft: $(cat "$tmp/info")"
  grep -q "^ Version: $KFT_VERSION$" "$tmp/info" || fail "the package's version is not $KFT_VERSION: $(cat "$tmp/info")"
  grep -q "^ Maintainer: ." "$tmp/info" || fail "the package has no maintainer"
  grep -q "^ Architecture: $(dpkg --print-architecture)$" "$tmp/info" || fail "wrong architecture: $(cat "$tmp/info")"
  [[ -z "${tools[*]}" ]] || grep -q "^ Depends: .*libc6" "$tmp/info" || fail "the tools are packaged but libc6 is not a dependency"
  cleanups+=('dpkg -P kft >/dev/null 2>&1 || true')
  run "$tmp/dpkg-i.log" dpkg -i "$deb"
  dpkg -L kft >"$tmp/listed" || fail "dpkg -L kft failed after installing"
  for f in /usr/include/kft/kft.hpp /usr/include/kft/configured.hpp /usr/share/cmake/kft/kftConfig.cmake \
           /usr/share/pkgconfig/kft.pc /usr/share/doc/kft/LICENSE /usr/share/kft/k8s-templates/README.md; do
    grep -qx "$f" "$tmp/listed" || fail "the package does not hold $f"
  done
  for t in "${tools[@]}"; do
    [[ -z "$t" ]] && continue
    grep -qx "/usr/bin/$t" "$tmp/listed" || fail "the package does not hold /usr/bin/$t"
    "/usr/bin/$t" --help >"$tmp/$t.help" 2>&1 || fail "/usr/bin/$t --help failed: $(cat "$tmp/$t.help")"
  done
  # A consumer finds it in /usr without being told where.
  cp -r "$KFT_SRC/examples/00-your-project" "$tmp/app"
  consumer "$tmp/app" "$tmp/build" -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON
  grep -q "^kft_DIR:PATH=/usr/share/cmake/kft$" "$tmp/build/CMakeCache.txt" ||
    fail "the consumer did not find the packaged kft: $(grep '^kft_DIR' "$tmp/build/CMakeCache.txt")"
  out=$("${clean_env[@]}" timeout 60 "$tmp/build/app") || fail "app failed (status $?): $out"
  expect_line "$out" "^rank 0 of 1: v\[0\] = 1$" "the app built against the .deb"
  run "$tmp/dpkg-P.log" dpkg -P kft
  cleanups=()
  left=()
  while IFS= read -r f; do
    [[ -f "$f" || -L "$f" ]] && left+=("$f")
    # directories dpkg created for kft alone must go too
    [[ -d "$f" && "$f" == */kft* ]] && left+=("$f/")
  done <"$tmp/listed"
  ((${#left[@]} == 0)) || fail "dpkg -P kft left behind: ${left[*]}"
  echo "deb: $(basename "$deb") ($(grep -c . "$tmp/listed") paths) installed, consumed from /usr, purged without a trace"
  ;;

*)
  echo "consume.sh: unknown mode '$mode'" >&2
  exit 2
  ;;
esac

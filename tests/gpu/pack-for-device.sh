#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Packs the GPU checks for a machine that has a GPU but not kft's build dependencies (a lent
# device with CUDA and NCCL, but no Boost.Test, Open MPI, hwloc or Gloo): builds the programs
# that tests/gpu/run-gpu-checks.sh runs, here, and puts into one folder
#   - the programs, stripped, at their places in a build tree (PACK/build/tests/test_nccl, ...);
#   - the shared libraries they load, except those such a machine has (glibc, libstdc++, the
#     CUDA driver, NCCL, cuBLAS): PACK/lib;
#   - Open MPI's runtime (its plugins are found by path): PACK/openmpi.tar.gz, unpacked there
#     over / without replacing any file;
#   - Fashion-MNIST for the GPU trainer, when this machine has it: PACK/data;
#   - go.sh, which sets that up and runs the checks.
#
#   tests/gpu/pack-for-device.sh [BUILD_DIR [PACK_DIR]]
#       BUILD_DIR default build-gpu (configured here by tools/configure.sh when it has no cache;
#       the benchmarks without -march=native, since the device's CPU is another)
#       PACK_DIR default BUILD_DIR/device
#   then, on the device, from the repository's root:
#       bash PACK_DIR/go.sh              (runs tests/gpu/run-gpu-checks.sh on the packed tree)
#       bash PACK_DIR/go.sh CMD ARGS...  (runs CMD in that environment instead)
#
# PACK_DIR lies in an ignored folder (build-*/), so a device tool can carry it beside the working
# tree; the script prints its size, which such a tool may limit (64 MiB where it was written).
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-gpu}
pack=${2:-$build/device}
[[ $build = /* ]] || build=$PWD/$build
[[ $pack = /* ]] || pack=$PWD/$pack

die() {
  echo "pack-for-device: $*" >&2
  exit 1
}
command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]] || die "no CUDA toolkit (nvcc): nothing GPU to pack"

programs=(tests/test_nccl tests/test_conformance_nccl tests/test_ddp_nccl tests/test_cuda_reduce tests/test_cuda_ipc
  tests/test_conformance_cuda_ipc tests/test_cuda_optim bench/allreduce_perf bench/cuda_reduce_perf
  bench/cuda_ipc_perf bench/ddp_overlap_cuda examples/08-fashion-mnist-gpu tools/kftrun)

if [[ ! -f $build/CMakeCache.txt ]]; then
  echo "== configuring $build"
  bash "$src/tools/configure.sh" "$build" -DKFT_BENCH_NATIVE=OFF >/dev/null || die "configuring $build failed"
fi
grep -q '^KFT_WITH_NCCL:STRING=ON' "$build/CMakeCache.txt" || die "$build is configured without NCCL (KFT_WITH_NCCL=ON)"
if grep -q '^KFT_BENCH_NATIVE:BOOL=ON' "$build/CMakeCache.txt"; then
  echo "pack-for-device: note: $build builds the benchmarks with -march=native; the device's CPU may lack" \
    "what this one has (reconfigure with -DKFT_BENCH_NATIVE=OFF)" >&2
fi
targets=()
for p in "${programs[@]}"; do targets+=("$(basename "$p")"); done
echo "== building ${#targets[@]} programs in $build"
cmake --build "$build" --target "${targets[@]}" -j "$(nproc)" || die "the build failed"

rm -rf "$pack"
mkdir -p "$pack/build" "$pack/lib"
for p in "${programs[@]}"; do
  [[ -x $build/$p ]] || die "$build/$p was not built"
  mkdir -p "$pack/build/$(dirname "$p")"
  strip -o "$pack/build/$p" "$build/$p"
done
# Helpers the tests start by path beside them.
for f in "$build"/tests/*worker* ; do
  [[ -x $f && -f $f ]] || continue
  strip -o "$pack/build/tests/$(basename "$f")" "$f"
done

# The libraries the programs load, but those the device has: glibc's, the compiler's runtime
# (newer there), the CUDA driver, NCCL (the device's own, as in production) and cuBLAS (large;
# the device's CUDA toolkit has it).
keep_out='^(linux-vdso|ld-linux|libc|libm|libdl|libpthread|librt|libresolv|libutil|libgcc_s|libstdc\+\+|libcuda|libnccl|libcublas|libcublasLt)\.so'
declare -A seen=()
for f in $(find "$pack/build" -type f); do
  while read -r name _ path _; do
    [[ $path = /* ]] || continue
    [[ $name =~ $keep_out ]] && continue
    [[ -n ${seen[$name]:-} ]] && continue
    seen[$name]=1
    cp -L "$path" "$pack/lib/$name"
  done < <(ldd "$f")
done
strip --strip-unneeded "$pack"/lib/*.so* 2>/dev/null || true

# Open MPI finds its plugins and help files by path: its Debian packages' files, to unpack on
# the device without replacing anything there.
if command -v dpkg-query >/dev/null && dpkg-query -W libopenmpi3 >/dev/null 2>&1; then
  pkgs=(libopenmpi3 openmpi-common)
  for p in libpmix2 libpmix2t64 libprrte3; do dpkg-query -W "$p" >/dev/null 2>&1 && pkgs+=("$p"); done
  dpkg -L "${pkgs[@]}" | while read -r f; do [[ -f $f && $f != /usr/share/doc/* && $f != /usr/share/man/* ]] && echo "$f"; done |
    tar -czf "$pack/openmpi.tar.gz" -T - 2>/dev/null
fi

data=${KFT_FMNIST_DIR:-/usr/share/datasets/fashion-mnist}
if [[ -f $data/train-images-idx3-ubyte.gz ]]; then
  mkdir -p "$pack/data"
  cp "$data"/*-ubyte.gz "$pack/data/"
else
  echo "pack-for-device: no Fashion-MNIST in $data: the GPU trainer will be skipped there (set KFT_FMNIST_DIR)" >&2
fi

cat >"$pack/go.sh" <<'EOF'
#!/usr/bin/env bash
# Written by tests/gpu/pack-for-device.sh: sets up the packed GPU checks on the device and runs
# tests/gpu/run-gpu-checks.sh on them (or the command given).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/@SRC_FROM_PACK@" && pwd)
[[ -f $here/openmpi.tar.gz ]] && tar -xzf "$here/openmpi.tar.gz" -C / --skip-old-files 2>/dev/null
ldconfig 2>/dev/null || true
# cuBLAS: the CUDA toolkit's, else a Python wheel's.
blas=$(ls -d /usr/local/cuda*/targets/x86_64-linux/lib /usr/local/cuda*/lib64 2>/dev/null |
  while read -r d; do [[ -e $d/libcublas.so.13 ]] && echo "$d"; done | head -1)
[[ -n $blas ]] || blas=$(python3 -c 'import nvidia.cublas, os; print(os.path.join(nvidia.cublas.__path__[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=$here/lib${blas:+:$blas}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_plm_rsh_agent=false
[[ -d $here/data ]] && export KFT_FMNIST_DIR=${KFT_FMNIST_DIR:-$here/data}
missing=$(for f in "$here"/build/*/*; do ldd "$f" 2>/dev/null | grep 'not found'; done | sort -u)
if [[ -n $missing ]]; then
  echo "go.sh: libraries not found on this machine:" >&2
  echo "$missing" >&2
  exit 1
fi
if [[ $# -gt 0 ]]; then
  "$@"
else
  bash "$src/tests/gpu/run-gpu-checks.sh" "$here/build"
fi
EOF
sed -i "s|@SRC_FROM_PACK@|$(realpath --relative-to="$pack" "$src")|" "$pack/go.sh"
chmod +x "$pack/go.sh"
size=$(du -sb "$pack" | cut -f1)
echo "pack-for-device: $pack: $(find "$pack/build" -type f | wc -l) programs, $(ls "$pack/lib" | wc -l) libraries," \
  "$((size / 1048576)) MiB"

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Installs the Debian 12 packages kft's build, tests and demo use. Idempotent: installs only
# what is missing, and runs apt-get update only then. Needs root (or sudo).
#
#   tools/install-deps.sh            # everything (build + tests)
#   tools/install-deps.sh --build    # only what building and the demo need
#   tools/install-deps.sh --bench    # build + tests + the benchmarks' peers and plots
#   tools/install-deps.sh --build --bench   # build + benchmarks, no test packages
# The test suite never needs the --bench packages (plots only).
set -euo pipefail

build_pkgs=(cmake ninja-build g++ pkg-config git
            libcli11-dev nlohmann-json3-dev libhwloc-dev openmpi-bin libopenmpi-dev
            libyaml-cpp-dev                            # kft-manifest's YAML reading and writing
            libgloo-dev                                # CPU collectives between nodes without MPI
            libopenblas-dev zlib1g-dev                 # example 05's BLAS and gzip reading
            dataset-fashion-mnist)                     # example 05's data (the README's main job)
test_pkgs=(libboost-test-dev
           slurmd slurmctld slurm-client libpmix-dev   # a real Slurm cluster on localhost
           python3-torch                               # torchrun (Debian's /usr/bin/python3)
           fortunes                                    # example 09's text (/usr/share/games/fortunes) and its test
           procps iproute2                             # pgrep/ps and ss (Slurm script), ip/tc (netns hosts)
           iptables                                    # a blackholed link between netns hosts (fault tests)
           mpich libmpich-dev                          # mpirun.mpich: a launcher that is not kft's MPI (mix-up tests); MPICH peer of bench/scripts/shm_peers.py
           python3-jsonschema python3-yaml             # manifest validation against the real CRDs
           libbenchmark-dev                            # bench/ddp_micro, Google Benchmark (smoke-tested)
           libtorch-dev                                # kft::libtorch: example 07 and its tests (PyTorch's C++ frontend)
           clang libclang-rt-14-dev                    # libFuzzer targets (tests/fuzz; the runtime is its own package)
           podman runc mmdebstrap                      # kft's image and the manifests' pods as containers (tests/containers)
           netavark aardvark-dns)                      # podman's pod network and its DNS (only Recommends of podman's)

bench_pkgs=(python3-matplotlib)                        # bench/scripts/plot_perf.py (Debian's /usr/bin/python3)

only_build=0 bench=0
for arg in "$@"; do
  case "$arg" in
    --build) only_build=1 ;;
    --bench) bench=1 ;;
    *) echo "install-deps: unknown argument $arg (use --build and/or --bench)" >&2; exit 2 ;;
  esac
done
pkgs=("${build_pkgs[@]}")
((only_build)) || pkgs+=("${test_pkgs[@]}")
((bench == 0)) || pkgs+=("${bench_pkgs[@]}")

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f '${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]} == 0)); then
  echo "install-deps: all ${#pkgs[@]} packages present"
  exit 0
fi
sudo=""
if [[ $(id -u) != 0 ]]; then
  command -v sudo >/dev/null || { echo "install-deps: need root to install: ${missing[*]}" >&2; exit 1; }
  sudo=sudo
fi
echo "install-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-deps: done"

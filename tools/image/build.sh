#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds kft's OCI image from Debian packages only: a Debian 12 minbase root filesystem made by
# mmdebstrap from the mirror this machine's apt uses (no registry image), the runtime packages
# kft's tools and examples load (Open MPI, hwloc, Gloo, OpenBLAS, yaml-cpp, the ssh pieces the
# MPI Operator's layout needs, Debian's Fashion-MNIST), and kft's own tools and examples built
# here without CUDA. `podman import` turns it into an image. Nothing is pulled from a registry.
#
#   tools/image/build.sh [--tag NAME] [--build-dir DIR] [--reuse DIR] [--rootfs-cache FILE] [--output FILE]
#
#   --tag           image name (default localhost/kft:<version>, what kft-manifest and
#                   k8s-templates/ name by default)
#   --build-dir     where kft's CPU-only tools and examples are built (default build-image)
#   --reuse         take each program from this existing build directory instead when it links
#                   no CUDA library (the examples of a CUDA build do not; its kftrun does), so
#                   only the rest is compiled again (the test suite passes its own build)
#   --rootfs-cache  keep the Debian root filesystem (a tar) here and reuse it while the
#                   package list is unchanged (its name carries a hash of the list)
#   --output        also write the image as an OCI archive (for `podman load` or a registry push)
#   --skip-if-refused  exit 77 (after building) when this host refuses to run the image's
#                   containers (the test suite's fixture: the container tests then skip)
#
# Two builds with one --build-dir take turns (a lock in it). An image whose label
# org.kft.inputs matches what this run would put in it (the root filesystem's key and the
# staged programs' hashes) is kept, not imported again: tests/run-all.sh builds the test image
# beside the suite, and the suite's fixture (the same command) then only checks it.
#
# What is where in the image:
#   /usr/local/bin/{kftrun,kft-info,kft-manifest}
#   /opt/kft/examples/{01-discover,02-rendezvous,03-allreduce,04-nodes,05-fashion-mnist}
#   /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist)
#   user mpiuser (uid 1000): sshd for the MPI Operator's non-root layout,
#     /home/mpiuser/.sshd_config (port 2222, host key = the mounted id_rsa), ssh clients on port
#     2222 with no known-hosts file; no host keys are baked into the image.
# Needs root (or a user podman can build for), mmdebstrap and podman (Debian: apt-get install
# mmdebstrap podman runc). Prints the image's size at the end.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
version=$(sed -n 's/^#define KFT_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\)$/\2/p' "$src/include/kft/config.hpp" | paste -sd.)
[[ "$version" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || { echo "image: cannot read kft's version from include/kft/config.hpp (got '$version')" >&2; exit 1; }
tag=localhost/kft:$version build=$src/build-image reuse="" cache="" output="" skip_if_refused=0
while (($#)); do
  case "$1" in
    --tag|--build-dir|--reuse|--rootfs-cache|--output)
      (($# >= 2)) || { echo "image: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --tag) tag=$2 ;; --build-dir) build=$2 ;; --reuse) reuse=$2 ;; --rootfs-cache) cache=$2 ;; --output) output=$2 ;;
      esac
      shift 2 ;;
    --skip-if-refused) skip_if_refused=1; shift ;;
    -h|--help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "image: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for tool in mmdebstrap podman cmake; do
  command -v "$tool" >/dev/null || { echo "image: '$tool' not found (Debian: apt-get install mmdebstrap podman runc cmake)" >&2; exit 1; }
done
# podman's settings for this build alone (runc, cgroupfs, file events), unless the caller has its own.
if [[ -z "${CONTAINERS_CONF:-}" ]]; then
  export CONTAINERS_CONF=$src/tools/image/containers.conf
fi

# The runtime packages: what the binaries below load (ldd), mpirun and ssh for the MPI Operator's
# launcher and workers, the dataset for example 05, procps for the operator's probes and people.
packages=(libhwloc15 libopenmpi3 openmpi-bin openssh-client openssh-server libgloo0
          libopenblas0-pthread libyaml-cpp0.7 dataset-fashion-mnist procps)
sources=""
for f in /etc/apt/sources.list.d/debian.sources /etc/apt/sources.list; do
  [[ -s "$f" ]] && grep -qv '^\s*#' "$f" && { sources=$f; break; }
done
[[ -n "$sources" ]] || { echo "image: no Debian apt sources found (/etc/apt/sources.list.d/debian.sources or /etc/apt/sources.list)" >&2; exit 1; }

step() { printf 'image: [%s] %s\n' "$(date +%T)" "$*"; }
mkdir -p "$build"
exec 9>"$build/.image-build.lock"
if ! flock -n 9; then
  step "waiting for the other image build in $build (lock $build/.image-build.lock)"
  flock -w 1800 9 || { echo "image: the other build in $build still holds its lock after 1800 s" >&2; exit 1; }
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# 1. kft's tools and examples, CPU only (the image has no CUDA), installed into a staging tree.
programs=(tools/kftrun tools/kft-info tools/kft-manifest examples/01-discover examples/02-rendezvous
          examples/03-allreduce examples/04-nodes examples/05-fashion-mnist)
stage=$work/stage
mkdir -p "$stage/usr/local/bin" "$stage/opt/kft/examples"
place() {  # place <built program> <path in the build tree>
  case "$2" in
    tools/*) install -s -m 0755 "$1" "$stage/usr/local/bin/" ;;
    *) install -s -m 0755 "$1" "$stage/opt/kft/examples/" ;;
  esac
}
targets=()
for p in "${programs[@]}"; do
  # (ldd's output in a variable: with pipefail, `ldd | grep -q` fails when grep stops reading early)
  if [[ -n "$reuse" && -x "$reuse/$p" ]] && libs=$(ldd "$reuse/$p") && ! grep -Eq 'libcuda|libnccl|libcublas|not found' <<<"$libs"; then
    place "$reuse/$p" "$p"
  else
    targets+=("$(basename "$p")")
  fi
done
if ((${#targets[@]})); then
  step "building ${targets[*]} (CPU only) in $build${reuse:+; the other programs from $reuse}"
  bash "$src/tools/configure.sh" "$build" -DKFT_WITH_CUDA=OFF -DKFT_WITH_NCCL=OFF -DKFT_WITH_LIBTORCH=OFF \
    -DKFT_BUILD_TESTS=OFF -DKFT_BUILD_BENCH=OFF >"$work/configure.log" 2>&1 ||
    { cat "$work/configure.log" >&2; echo "image: configuring $build failed" >&2; exit 1; }
  cmake --build "$build" --target "${targets[@]}"
  for p in "${programs[@]}"; do
    [[ " ${targets[*]} " == *" $(basename "$p") "* ]] && place "$build/$p" "$p"
  done
else
  step "every program taken from $reuse (none links CUDA)"
fi
install -m 0644 "$src/LICENSE" "$src/NOTICE" "$stage/opt/kft/"

# 2. The Debian root filesystem (cached by the hash of the package list and the sources).
key=$( { printf '%s\n' "${packages[@]}"; cat "$sources"; } | sha256sum | cut -c1-16)
# What the image would hold: that root filesystem and these files (stripped, so the same build
# gives the same bytes). An image that already carries this label is kept.
inputs=$( { echo "$key"; cd "$stage" && find . -type f -print0 | LC_ALL=C sort -z | xargs -0 sha256sum; } | sha256sum | cut -c1-16)
current=0
if [[ "$(podman image inspect --format '{{index .Labels "org.kft.inputs"}}' "$tag" 2>/dev/null)" == "$inputs" ]]; then
  current=1
  step "$tag already holds these programs on this root filesystem (org.kft.inputs=$inputs): kept"
fi
rootfs=$work/rootfs.tar
if ((current)); then
  :
elif [[ -n "$cache" && -s "$cache.$key" ]]; then
  step "reusing the Debian root filesystem $cache.$key"
  rootfs=$cache.$key
else
  step "making a Debian 12 minbase root filesystem with ${#packages[@]} runtime packages (mmdebstrap)"
  mmdebstrap --variant=minbase --mode=root --format=tar --quiet \
    --aptopt='APT::Install-Recommends "false"' \
    --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/info/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --include="$(IFS=,; echo "${packages[*]}")" \
    --customize-hook='rm -f "$1"/etc/ssh/ssh_host_*' \
    --customize-hook='chroot "$1" useradd --create-home --uid 1000 --shell /bin/bash mpiuser' \
    --customize-hook='mkdir -p "$1"/run/sshd' \
    --customize-hook='printf "%s\n" "PidFile /home/mpiuser/sshd.pid" "HostKey /home/mpiuser/.ssh/id_rsa" "StrictModes no" "Port 2222" > "$1"/home/mpiuser/.sshd_config && chroot "$1" chown mpiuser:mpiuser /home/mpiuser/.sshd_config' \
    --customize-hook='printf "%s\n" "Host *" "    Port 2222" "    StrictHostKeyChecking no" "    UserKnownHostsFile /dev/null" "    LogLevel ERROR" > "$1"/etc/ssh/ssh_config.d/kft.conf' \
    bookworm "$rootfs" "$sources"
  if [[ -n "$cache" ]]; then
    mkdir -p "$(dirname "$cache")"
    rm -f "$cache".*
    cp "$rootfs" "$cache.$key"
  fi
fi

# 3. kft on top, and the image. tar appends the staging tree to a copy of the root filesystem.
if ((!current)); then
step "adding kft and importing $tag"
cp "$rootfs" "$work/image.tar"
# Only the paths the root filesystem lacks (a second entry for ./usr would be refused).
tar -tf "$rootfs" | sed 's#/$##' | LC_ALL=C sort >"$work/existing"
(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort) | LC_ALL=C comm -23 - "$work/existing" >"$work/new"
tar --owner=0 --group=0 --no-recursion -C "$stage" -rf "$work/image.tar" -T "$work/new"
podman import \
  --change 'ENV PATH=/usr/local/bin:/usr/local/sbin:/usr/bin:/usr/sbin:/bin:/sbin' \
  --change 'WORKDIR /opt/kft' \
  --change 'CMD ["/bin/bash"]' \
  --change 'LABEL org.opencontainers.image.title=kft' \
  --change "LABEL org.opencontainers.image.version=$version" \
  --change 'LABEL org.opencontainers.image.licenses=Apache-2.0' \
  --change 'LABEL org.opencontainers.image.description="kft tools and examples on Debian 12"' \
  --change "LABEL org.kft.inputs=$inputs" \
  --message "kft $version: Debian 12 minbase + runtime packages + kft's tools and examples" \
  "$work/image.tar" "$tag" >/dev/null
fi
# Every program finds its libraries inside the image (a runtime package missing from the list
# above would show here, not in a pod).
refused=0
missing=$(podman run --rm --network none "$tag" sh -c \
  'for f in /usr/local/bin/* /opt/kft/examples/*; do [ -x "$f" ] && ldd "$f" | sed -n "s#^\s*\(.*not found\)#$f: \1#p"; done' 2>&1) ||
  { refused=1; step "this host refuses to run the image's containers, so its libraries are not checked: $missing"; }
if grep -q 'not found' <<<"$missing"; then
  echo "image: libraries missing in $tag (the image is removed):" >&2
  echo "$missing" >&2
  podman rmi --force "$tag" >/dev/null 2>&1 || true
  exit 1
fi
if [[ -n "$output" ]]; then
  rm -f "$output"
  podman save --format oci-archive -o "$output" "$tag"
fi
size=$(podman image inspect --format '{{.Size}}' "$tag")
step "$( ((current)) && echo kept || echo built ) $tag: $((size / 1000000)) MB ($(podman image inspect --format '{{.Id}}' "$tag" | cut -c1-12))"
if ((refused && skip_if_refused)); then
  echo "SKIP: containers cannot run here (see above): the container tests skip"
  exit 77
fi

#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Draws the DDP timeline picture of docs/ddp.md: two steps of bench/ddp_overlap on 2 ranks
# with KFT_TIMELINE set (one Chrome-trace JSON per rank), turned into a Gantt chart by
# bench/ddp/plot_timeline.py (matplotlib, Debian's /usr/bin/python3).
#
#   bash bench/ddp/ddp_timeline.sh [BUILD_DIR] [OUT.png]    (defaults: build-tests, docs/images/ddp_timeline.png)
#
# Builds kftrun and ddp_overlap in BUILD_DIR when they are missing (configuring it with
# tools/configure.sh if needed); the traces stay in a temporary directory, printed at the end.
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$src/build-tests}
out=${2:-$src/docs/images/ddp_timeline.png}
if ! /usr/bin/python3 -c 'import matplotlib' 2>/dev/null; then
  echo "ddp_timeline: needs Debian's python3-matplotlib (bash tools/install-deps.sh --bench)" >&2
  exit 2
fi
if [[ ! -x $build/bench/ddp_overlap || ! -x $build/tools/kftrun ]]; then
  [[ -f $build/CMakeCache.txt ]] || bash "$src/tools/configure.sh" "$build"
  cmake --build "$build" --target ddp_overlap kftrun -j "$(nproc)"
fi
traces=$(mktemp -d)
KFT_TIMELINE=$traces "$build/tools/kftrun" --nproc-per-node 2 -- "$build/bench/ddp_overlap" \
  --layers 8 --layer-bytes 2M --cap 4M --steps 3 --ratios 2
/usr/bin/python3 "$src/bench/ddp/plot_timeline.py" "$traces" "$out" --steps 2
echo "ddp_timeline: wrote $out from the traces in $traces"

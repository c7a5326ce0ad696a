#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# with-image.sh IMAGE_SCRIPT COMMAND...: makes sure the container tests' image is current, then
# runs COMMAND. IMAGE_SCRIPT is the build script CMake writes (build-test-image.sh): it keeps an
# image that is current, waits for a build of it already running (tests/run-all.sh starts one
# beside the suite), and builds it otherwise. Exits 77 when this host refuses containers.
set -uo pipefail
script=${1:?usage: with-image.sh IMAGE_SCRIPT COMMAND...}
shift
out=$(bash "$script" 2>&1)
rc=$?
if ((rc == 77)); then
  tail -n 5 <<<"$out"
  exit 77
elif ((rc != 0)); then
  echo "$out"
  echo "with-image: the image build ($script) failed with status $rc" >&2
  exit 1
fi
tail -n 1 <<<"$out"
exec "$@"

#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Checks over the registered tests' properties, read from CTest itself.

    python3 tests/repo/ctest_properties.py CTEST BUILD_DIR

A PASS_REGULAR_EXPRESSION or FAIL_REGULAR_EXPRESSION is one regular expression per test: CMake
splits a value at every ';', and CTest passes a test when any one of the pieces matches, so a
';' written inside an expression silently turns it into alternatives that each check less.
Prints every test at fault; exit 1 when there is one.
"""
import json
import subprocess
import sys

if len(sys.argv) != 3:
    sys.exit("usage: ctest_properties.py CTEST BUILD_DIR")
ctest, build = sys.argv[1], sys.argv[2]
proc = subprocess.run([ctest, "--show-only=json-v1"], cwd=build, capture_output=True, text=True, timeout=120)
if proc.returncode != 0:
    sys.exit(f"ctest_properties: {ctest} --show-only=json-v1 in {build} exited {proc.returncode}: {proc.stderr[-2000:]}")
tests = json.loads(proc.stdout)["tests"]
bad = []
for t in tests:
    for prop in t.get("properties", []):
        if prop["name"] in ("PASS_REGULAR_EXPRESSION", "FAIL_REGULAR_EXPRESSION") and len(prop["value"]) > 1:
            bad.append(f"{t['name']}: {prop['name']} is {len(prop['value'])} expressions (a ';' inside it?): "
                       + " | ".join(repr(v) for v in prop["value"]))
with_regex = sum(1 for t in tests for p in t.get("properties", []) if p["name"] == "PASS_REGULAR_EXPRESSION")
for line in bad:
    print(line)
print(f"ctest_properties: {len(tests)} tests, {with_regex} with a pass expression, {len(bad)} split by ';'")
sys.exit(1 if bad else 0)

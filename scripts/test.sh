#!/usr/bin/env bash
# Builds every flavour and runs every test: README's test command and CI's.
#   1. release build: unit, integration (Python websockets, Node ws), conformance, fuzz corpus
#      replay, benchmark smoke runs
#   2. ASan+UBSan build: the same tests but the benchmarks
#   3. TSan build: the pool tests
#   4. clang + libFuzzer: each fuzz target for a bounded time
# Set WSPUSH_SKIP_SANITIZERS=1 or WSPUSH_SKIP_FUZZ=1 for a quicker local loop.
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=$(nproc)
stage() { printf '\n===== %s =====\n' "$*"; }

check_uring_ran() {  # io_uring tests skip (exit 77) where io_uring is missing: say so loudly
  /usr/bin/python3 - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
cases = [c for c in ET.parse(sys.argv[1]).getroot().iter("testcase") if "uring" in c.get("name", "")]
skipped = [c.get("name") for c in cases if c.get("status") in ("notrun", "skipped") or c.find("skipped") is not None]
print(f"io_uring tests: {len(cases) - len(skipped)} ran, {len(skipped)} skipped")
if skipped:
    print("skipped (io_uring unavailable here?):", ", ".join(skipped))
PY
}

stage "release build"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build -j"$jobs"
stage "release tests"
ctest --test-dir build --output-on-failure -j2 --timeout 600 --output-junit junit.xml
check_uring_ran build/junit.xml

if [ "${WSPUSH_SKIP_SANITIZERS:-0}" != 1 ]; then
  stage "ASan+UBSan build"
  cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DWSPUSH_SANITIZE=address -DWSPUSH_BENCH=OFF >/dev/null
  cmake --build build-asan -j"$jobs"
  stage "ASan+UBSan tests"
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j2 --timeout 900

  stage "TSan build (pool)"
  cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWSPUSH_ONLY_POOL=ON -DWSPUSH_SANITIZE=thread >/dev/null
  cmake --build build-tsan -j"$jobs"
  stage "TSan tests (pool)"
  TSAN_OPTIONS=halt_on_error=1 ctest --test-dir build-tsan --output-on-failure --timeout 600
fi

if [ "${WSPUSH_SKIP_FUZZ:-0}" != 1 ]; then
  stage "fuzz build (clang-14, libFuzzer)"
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_COMPILER=clang-14 \
    -DCMAKE_CXX_COMPILER=clang++-14 -DWSPUSH_FUZZ=ON >/dev/null
  cmake --build build-fuzz -j"$jobs"
  stage "fuzz runs (bounded)"
  ctest --test-dir build-fuzz --output-on-failure --timeout 300
fi
stage "all tests passed"

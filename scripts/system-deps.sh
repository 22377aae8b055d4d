#!/usr/bin/env bash
# The Debian packages the build and the tests need beyond a Rust toolchain, installed when
# missing (the README's `make run` / `make test` call this first; the Dockerfile installs the
# same): libisal-dev (ISA-L, the gzip of the Storage Write requests), haproxy (the load
# balancer the fleet tests put in front of several gateways), and chromium with
# chromium-driver (the headless browser the console's tests drive over WebDriver), and iproute2
# (`ss`: a test reads the gateway's listen backlog). Postgres, psql, promtool and a
# Java runtime are installed by the scripts that use them.
set -euo pipefail

missing=()
need_package() { # package probe-command...
  local package="$1"
  shift
  if ! "$@" >/dev/null 2>&1; then missing+=("$package"); fi
}

need_package libisal-dev test -e /usr/include/isa-l.h
need_package haproxy command -v haproxy
need_package chromium command -v chromium
need_package chromium-driver command -v chromedriver
need_package iproute2 command -v ss

if [ "${#missing[@]}" -eq 0 ]; then exit 0; fi
echo "[system-deps] installing Debian packages: ${missing[*]}" >&2
sudo=""
[ "$(id -u)" = 0 ] || sudo="sudo"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null

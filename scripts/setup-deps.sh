#!/usr/bin/env bash
# System packages the build needs beyond the toolchain: cJSON for the CLI (libcjson-dev).
# Installs them with apt-get when they are missing and this runs as root; otherwise says what
# to install and goes on (the CLI then builds without file input/output and --json, and the
# tests of those skip). Idempotent.
set -euo pipefail
missing=()
[ -f /usr/include/cjson/cJSON.h ] || missing+=(libcjson-dev)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "setup-deps: installing ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null ||
    { apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; } ||
    echo "setup-deps: could not install ${missing[*]}; the CLI builds without file I/O and --json" >&2
else
  echo "setup-deps: please install ${missing[*]} (e.g. sudo apt-get install ${missing[*]});" \
       "until then the CLI builds without file I/O and --json" >&2
fi

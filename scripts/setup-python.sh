#!/usr/bin/env bash
# Creates .venv with what the Python side needs (torch, numpy, pytest) and installs the
# convpool package from python/ in editable mode. Idempotent: a second run changes nothing.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
if [ ! -x "$root/.venv/bin/python" ]; then
  "$py" -m venv "$root/.venv"
fi
"$root/.venv/bin/python" -m pip install -q --disable-pip-version-check -r "$root/python/requirements.txt"
"$root/.venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$root"

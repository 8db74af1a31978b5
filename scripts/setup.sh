#!/usr/bin/env bash
# Create .venv/ (if missing) and install the development requirements into it.
# Re-installs only when requirements-dev.txt or setup.cfg changed since the last run.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.datapipes-installed
want=$(cat requirements-dev.txt setup.cfg | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  .venv/bin/python -m pip install --quiet --upgrade pip
  .venv/bin/python -m pip install --quiet -r requirements-dev.txt
  echo "$want" > "$stamp"
fi

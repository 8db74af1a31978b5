#!/usr/bin/env bash
# Set up .venv/ and run the whole test suite (extra arguments go to pytest).
# VENV, PYTHON and REQUIREMENTS pick another environment (see scripts/setup.sh; .ci/run uses them).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec "${VENV:-.venv}/bin/python" -m pytest "$@"

#!/usr/bin/env bash
# Set up .venv/ and run the demo on generated sample data (extra arguments go to the demo).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m datapipes demo "$@"

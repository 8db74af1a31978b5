#!/usr/bin/env bash
# Create .venv-bench/ (if missing): the development requirements (torch pinned to the 2.13.0 CPU
# build) plus the peers of benchmarks/requirements.txt. Re-installs only when one of the requirement
# files or setup.cfg changed since the last run. Usage: bash benchmarks/setup.sh
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.venv-bench
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.datapipes-installed
want=$(cat requirements-dev.txt setup.cfg benchmarks/requirements.txt benchmarks/setup.sh | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  pip=("$VENV/bin/python" -m pip install --quiet)
  "${pip[@]}" --upgrade pip
  # requirements-dev.txt pins torch==2.13.0 (the CPU build): an unpinned torch is a multi-GB CUDA one.
  "${pip[@]}" -r requirements-dev.txt
  # The peers' own dependencies, with torch pinned again in the same command so pip cannot move it.
  "${pip[@]}" torch==2.13.0 "urllib3>=1.25" requests
  # The peers themselves without their dependency metadata (torchdata asks for any torch >= 2).
  "${pip[@]}" --no-deps -r benchmarks/requirements.txt
  "$VENV/bin/python" - <<'PY'
import torch
assert torch.__version__.startswith("2.13.0"), f"torch moved to {torch.__version__}"
import torch.utils.data.datapipes  # noqa: F401  (ships with torch)
import torchdata.nodes  # noqa: F401
import spdl.pipeline  # noqa: F401
print(f"benchmark environment ready: torch {torch.__version__}")
PY
  echo "$want" > "$stamp"
fi

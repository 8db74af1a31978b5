#!/usr/bin/env bash
# Set up .venv/ and run the whole test suite (extra arguments go to pytest).
# VENV, PYTHON and REQUIREMENTS pick another environment (see scripts/setup.sh; .ci/run uses them).
#
# The suite runs on every CPU at once (pytest-xdist, one worker a usable CPU and one more, at most 8:
# many tests wait on child processes, servers or sleeps, and the extra worker uses the CPU they
# leave; each worker imports torch and holds its own process pools, and past 8 the suite's longest
# tests set its time; DATAPIPES_TEST_WORKERS overrides, 0 runs it in this process; a later -n among
# the arguments wins too). Tests that share a
# machine-wide resource stay on one worker (tests/xdist_scheduling.py groups them; --dist loadgroup).
#
# Bytecode is written (__pycache__, ignored by git) even where the machine sets
# PYTHONDONTWRITEBYTECODE: the suite starts hundreds of interpreters (spawned and forkserver workers,
# scripts run in a child process, Sphinx, mypy), and each would otherwise compile the package and
# the tests again, about half a second of CPU each. For the same reason mypy keeps its cache outside
# the checkout (~/.cache/datapipes-mypy, one folder per interpreter, mypy and torch release), so that a fresh
# clone type-checks from a warm cache: mypy reuses an entry whose source hashes the same.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
unset PYTHONDONTWRITEBYTECODE
if [ -z "${DATAPIPES_MYPY_CACHE:-}" ]; then
  DATAPIPES_MYPY_CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/datapipes-mypy/$("${VENV:-.venv}/bin/python" -c \
    'import sys, importlib.metadata as m; print(sys.implementation.cache_tag, "mypy", m.version("mypy"), "torch", m.version("torch"), sep="-")')
  export DATAPIPES_MYPY_CACHE
fi
workers=${DATAPIPES_TEST_WORKERS:-$(( $(nproc) + 1 ))}
[ "${DATAPIPES_TEST_WORKERS:-}" ] || [ "$workers" -le 8 ] || workers=8
exec "${VENV:-.venv}/bin/python" -m pytest -n "$workers" --dist loadgroup "$@"

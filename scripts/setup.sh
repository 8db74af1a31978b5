#!/usr/bin/env bash
# Create a virtualenv (if missing) and install the development requirements into it.
# Re-installs only when the requirements or setup.cfg changed since the last run.
#
# Defaults build .venv/ with python3 and requirements-dev.txt (torch 2.13.0, the CPU build on this
# machine's disk). CI builds its other environments with the same script:
#   VENV=.venv-3.12 PYTHON=$(pyenv prefix 3.12.1)/bin/python bash scripts/setup.sh
#   VENV=.venv-torch-oldest REQUIREMENTS=requirements-oldest.txt bash scripts/setup.sh
#
# torch and what it pulls (several GB for a CUDA build) are kept as wheels in a wheelhouse outside
# the checkout (DATAPIPES_WHEELHOUSE, default ~/.cache/datapipes-wheels) and installed from there,
# so building an environment again, in a fresh clone too, downloads torch only once. (pip's own
# HTTP cache cannot be relied on for this: a registry that answers "no-store" leaves it empty.)
# Under CI=true the wheelhouse is read but never filled: a CI machine starts empty and is thrown
# away, so wheels kept there would only take 2-3 GB of its disk per torch build; torch is then
# installed straight from the registry with --no-cache-dir.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
REQUIREMENTS=${REQUIREMENTS:-requirements-dev.txt}
WHEELHOUSE=${DATAPIPES_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/datapipes-wheels}
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
stamp=$VENV/.datapipes-installed
want=$(cat "$REQUIREMENTS" requirements-test.txt setup.cfg | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  pip=("$VENV/bin/python" -m pip)
  "${pip[@]}" install --quiet --upgrade pip
  torch=$(grep -E '^torch[=<>!~ ]' "$REQUIREMENTS" | head -n 1)
  if [ -d "$WHEELHOUSE" ] &&
    "${pip[@]}" install --quiet --no-index --find-links "$WHEELHOUSE" "$torch" 2>/dev/null; then
    :
  elif [ "${CI:-}" = true ]; then
    echo "setup: installing $torch for $("$VENV/bin/python" -V) from the registry (not kept)"
    "${pip[@]}" install --quiet --no-cache-dir "$torch"
  else
    echo "setup: downloading $torch for $("$VENV/bin/python" -V) into $WHEELHOUSE (once)"
    mkdir -p "$WHEELHOUSE"
    "${pip[@]}" download --quiet -d "$WHEELHOUSE" "$torch"
    "${pip[@]}" install --quiet --no-index --find-links "$WHEELHOUSE" "$torch"
  fi
  "${pip[@]}" install --quiet -r "$REQUIREMENTS"
  echo "$want" > "$stamp"
fi

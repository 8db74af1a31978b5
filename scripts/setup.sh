#!/usr/bin/env bash
# Create a virtualenv (if missing) and install the development requirements into it.
# Re-installs only when a requirements file, setup.cfg or pyproject.toml changed since the last run.
#
# Defaults build .venv/ with python3 and requirements-dev.txt (torch 2.13.0, the CPU build on this
# machine's disk). CI builds its other environments with the same script:
#   VENV=~/.cache/datapipes-envs/3.12-<hash> PYTHON=$(pyenv prefix 3.12.1)/bin/python bash scripts/setup.sh
#   VENV=... REQUIREMENTS=requirements-oldest.txt bash scripts/setup.sh
#
# Every package is installed from a wheelhouse outside the checkout (DATAPIPES_WHEELHOUSE, default
# ~/.cache/datapipes-wheels), offline first: building an environment again, in a fresh clone or for
# another interpreter that shares wheels with it, downloads nothing that an earlier run already has.
# Only when the offline install cannot be satisfied does the script ask the registry: pip resolves
# the requirements (--dry-run --report), the wheels of that resolution are fetched into the wheelhouse
# (an sdist is built into a wheel once, there), and the offline install runs again. (pip's own HTTP
# cache cannot be relied on for this: a registry that answers "no-store" leaves it empty.)
#
# An environment may be kept outside the checkout (.ci/run keeps its extra ones under
# ~/.cache/datapipes-envs): when its requirements are in but it was made for another checkout, only
# the project's editable install is redone, pointing it at this one.
#
# Packages are installed without compiling their bytecode (--no-compile): pip would compile every
# module of torch and the rest (35 of the 50 s a new .venv took), where a run imports a fraction of
# them and writes their .pyc as it goes (scripts/test.sh lets it).
#
# DATAPIPES_KEEP_WHEELS=0 keeps nothing: packages come straight from the registry with --no-cache-dir
# (.ci/run sets it when the disk is short; a CUDA build of torch with what it pulls is 3-5 GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
REQUIREMENTS=${REQUIREMENTS:-requirements-dev.txt}
WHEELHOUSE=${DATAPIPES_WHEELHOUSE:-${XDG_CACHE_HOME:-$HOME/.cache}/datapipes-wheels}
here=$(pwd -P)
say() { echo "setup: $*" >&2; }

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
pip=("$VENV/bin/python" -m pip)
stamp=$VENV/.datapipes-installed
checkout=$VENV/.datapipes-checkout
want=$(cat requirements*.txt setup.cfg pyproject.toml | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  if [ "$(cat "$checkout" 2>/dev/null)" != "$here" ]; then
    # setuptools is one of the requirements, so the editable build needs nothing from outside.
    "${pip[@]}" install --quiet --no-deps --no-build-isolation --no-index -e .
    echo "$here" > "$checkout"
  fi
  exit 0
fi

offline() {
  [ -d "$WHEELHOUSE" ] || return 1
  # pip itself first (the interpreter's bundled one may predate a wheel's metadata), when it is there.
  "${pip[@]}" install --quiet --no-index --find-links "$WHEELHOUSE" --upgrade pip 2>/dev/null || true
  "${pip[@]}" install --quiet --no-compile --no-index --find-links "$WHEELHOUSE" -r "$REQUIREMENTS"
}

# fetch: resolve the requirements against the registry and put the wheels of that resolution (and
# the project's build requirements, for its editable install) into the wheelhouse.
fetch() {
  local report list
  report=$(mktemp) list=$(mktemp)
  "${pip[@]}" install --quiet --dry-run --ignore-installed --report "$report" -r "$REQUIREMENTS"
  "$VENV/bin/python" - "$report" > "$list" <<'EOF'
import json, sys
# Every package of the resolution but the project itself (a local folder, installed editable).
for item in json.load(open(sys.argv[1]))["install"]:
    if "dir_info" not in item.get("download_info", {}):
        print(f"{item['metadata']['name']}=={item['metadata']['version']}")
EOF
  echo "setuptools>=70.1" >> "$list"
  printf '%s\n' wheel pip >> "$list"
  mkdir -p "$WHEELHOUSE"
  say "fetching $(wc -l < "$list") packages for $("$VENV/bin/python" -V) into $WHEELHOUSE (what it lacks)"
  "${pip[@]}" wheel --quiet --no-deps --find-links "$WHEELHOUSE" -w "$WHEELHOUSE" -r "$list"
  rm -f "$report" "$list"
}

if [ "${DATAPIPES_KEEP_WHEELS:-1}" = 0 ]; then
  say "installing $REQUIREMENTS for $("$VENV/bin/python" -V) from the registry (nothing kept)"
  "${pip[@]}" install --quiet --no-compile --no-cache-dir -r "$REQUIREMENTS"
elif ! offline 2>/dev/null; then
  fetch
  offline
fi
echo "$here" > "$checkout"
echo "$want" > "$stamp"

#!/usr/bin/env bash
# Print the path of a free-threaded CPython 3.13 (3.13t, built with --disable-gil), building it first
# if this machine has none yet. .ci/run runs the suite on it; by hand:
#   VENV=.venv-3.13t PYTHON=$(bash scripts/freethreaded-python.sh) \
#     REQUIREMENTS=requirements-freethreaded.txt bash scripts/test.sh
#
# Where it comes from: Debian's python3.13 source package (its upstream tarball; Debian's patches are
# for Debian's own packaging and are not applied), fetched with apt-get through a private source list
# (deb-src lines for sid and trixie; the newest 3.13 of the two is taken), so the machine's own apt
# configuration is left alone. pyenv would build from python.org's sources, which these machines
# cannot reach. It is configured with --disable-gil and nothing else (no PGO: a build takes 3-5
# minutes on 2 cores instead of 20), against the development headers of bookworm's packages; any of
# those missing is installed with apt-get first (as root).
#
# Where it goes: once per machine, outside the checkout, so every later run and every fresh clone
# reuses it: ${DATAPIPES_PYTHON_CACHE:-${XDG_CACHE_HOME:-~/.cache}/datapipes-python}/cpython-3.13t.
# It is installed into a staging folder and moved into place only when complete, so an interrupted
# build is never taken for a finished one. Everything else it writes goes to a temporary folder,
# removed at the end. Progress goes to stderr; stdout is the interpreter's path alone.
set -euo pipefail
minor=3.13
cache=${DATAPIPES_PYTHON_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/datapipes-python}
prefix=$cache/cpython-${minor}t
python=$prefix/bin/python${minor}t

works() { [ -x "$python" ] && "$python" -c 'import sys, ssl, zlib, bz2, lzma, ctypes; sys.exit(sys._is_gil_enabled())' 2>/dev/null; }

if works; then
  echo "$python"
  exit 0
fi

say() { echo "freethreaded-python: $*" >&2; }
work=$(mktemp -d)
mkdir -p "$cache"
stage=$(mktemp -d "$cache/.stage.XXXXXX")  # beside the prefix: moved into place in one rename
trap 'rm -rf "$work" "$stage"' EXIT

# The headers the modules the suite needs are built against (ssl and zlib for pip, bz2 and lzma for
# the compression pipes, ctypes, sqlite3); build-essential for the compiler.
needed=(build-essential pkg-config libssl-dev zlib1g-dev libbz2-dev liblzma-dev libffi-dev libsqlite3-dev
        libreadline-dev libncurses-dev uuid-dev tk-dev libexpat1-dev)
missing=()
for p in "${needed[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing build dependencies: ${missing[*]}"
  apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >&2
fi

# The source package, through a private source list and package lists (nothing under /etc changes).
mkdir -p "$work/lists/partial" "$work/src"
printf 'deb-src http://deb.debian.org/debian %s main\n' sid trixie > "$work/sources.list"
apt=(apt-get -q -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o "Dir::State::Lists=$work/lists" -o APT::Sandbox::User=root)
say "fetching Debian's python$minor source package"
"${apt[@]}" update >&2
# Newest first; a version whose files the mirror no longer holds (sid moves fast) gives way to the next.
versions=$(apt-cache -o "Dir::Etc::SourceList=$work/sources.list" -o Dir::Etc::SourceParts=/dev/null \
  -o "Dir::State::Lists=$work/lists" showsrc "python$minor" | sed -n 's/^Version: //p' | sort -Vru)
fetched=
for v in $versions; do
  if (cd "$work/src" && "${apt[@]}" source --download-only "python$minor=$v" >"$work/fetch.log" 2>&1); then
    fetched=$v
    break
  fi
  say "python$minor $v could not be fetched; trying the next version"
  rm -f "$work"/src/*
done
if [ -z "$fetched" ]; then
  cat "$work/fetch.log" >&2
  say "no python$minor source package could be fetched (versions listed: ${versions:-none})"
  exit 1
fi
tarball=$(ls "$work"/src/python"$minor"_*.orig.tar.* | head -n 1)
tar -xf "$tarball" -C "$work/src"
srcdir=$(find "$work/src" -maxdepth 1 -type d -name 'Python-*' | head -n 1)
say "building $(basename "$srcdir") with --disable-gil into $prefix"

(
  cd "$srcdir"
  ./configure --prefix="$prefix" --disable-gil --with-ensurepip=install >"$work/configure.log" 2>&1 ||
    { tail -n 40 "$work/configure.log" >&2; exit 1; }
  make -j"$(nproc)" >"$work/make.log" 2>&1 || { tail -n 60 "$work/make.log" >&2; exit 1; }
  make install DESTDIR="$stage" >"$work/install.log" 2>&1 || { tail -n 40 "$work/install.log" >&2; exit 1; }
)
rm -rf "$prefix"
mv "$stage$prefix" "$prefix"
if ! works; then
  say "the build at $prefix does not run free-threaded with ssl, zlib, bz2, lzma and ctypes"
  exit 1
fi
say "built $("$python" -VV | head -n 1)"
echo "$python"

#!/usr/bin/env bash
# The GPU path checked on a GPU, in one command: the GPU tests, the GPU benchmark and the
# end-to-end benchmark on all the host's CPUs.
#
#   bash scripts/device-check.sh                  # on a CUDA host (a few minutes on 16 CPUs)
#   bash scripts/device-check.sh --device cpu     # smoke run without a GPU: tiny sizes, well under a minute
#
# Options:
#   --device D     cuda (the default: the current CUDA device), cuda:N (the benchmarks' device; the
#                  tests use the current one), or cpu for the smoke run
#   --python PATH  run everything with this interpreter as it is (datapipes from this tree) instead of
#                  .venv/, which scripts/setup.sh builds or updates first (DEVICE_CHECK_PYTHON too).
#                  Without it, where setup.sh fails (a host with no package registry) or .venv's
#                  torch cannot serve (no CUDA for a CUDA device), a python3 on PATH whose torch can
#                  is used instead, and the log says so.
#
# Parts, run in turn; a failing part does not stop the next:
#   1. pytest -m gpu tests: every GPU test (they skip cleanly without CUDA), then, on a CUDA device,
#      the other tests of the modules that behave differently where CUDA is present
#      (tests/iter/test_device.py, tests/test_demo.py, tests/test_loader.py; slow ones left out);
#   2. benchmarks/gpu_overlap.py with its defaults (--device cpu: 40 images, 1 repeat);
#   3. benchmarks/end_to_end.py --cores <the host's CPU count> (every system given every core: the
#      many-core figures of the process stage), --concurrency <CPU count>,2 (threaded peers get a
#      thread per CPU; datapipes' thread stage also runs with 2), 2000 images, 3 repeats, tuned
#      malloc; --device cpu: 64 images, 1 repeat, 3 systems. It prints each run's figures as it
#      goes, and a run cut short by the time limit still tabulates the runs that completed.
# Each part runs under a time limit (SIGINT, then SIGKILL) inside a budget of DEVICE_CHECK_BUDGET_S
# seconds for all the parts (default 380: the check fits in 7 minutes with the set-up of a built .venv).
#
# Everything goes to stdout; with $OUT set, also to $OUT/device-check.log, with the tests' JUnit
# XML ($OUT/gpu-tests.xml, $OUT/device-tests.xml) and end_to_end.py's figures ($OUT/end_to_end.json).
#
# Exit status: 0 when every part ran to its end and every test passed; 1 otherwise. A benchmark
# target missed (the script's own exit status 1) is listed in the summary, not counted as a failure:
# it is a figure to report, not a broken path.
set -uo pipefail
cd "$(dirname "$0")/.."

device=cuda
python_opt=${DEVICE_CHECK_PYTHON:-}
while [ $# -gt 0 ]; do
  case "$1" in
    --device) device=${2:?--device needs a value}; shift 2 ;;
    --device=*) device=${1#*=}; shift ;;
    --python) python_opt=${2:?--python needs a value}; shift 2 ;;
    --python=*) python_opt=${1#*=}; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "device-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$device" in
  cpu|cuda|cuda:[0-9]*) ;;
  *) echo "device-check.sh: --device $device: expected cuda, cuda:N or cpu" >&2; exit 2 ;;
esac

if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
fi

# Whether interpreter $1 imports torch (and, with a second argument, whether that torch sees CUDA).
torch_ok() {
  "$1" -c "import sys, torch; sys.exit(0 if ${2:+torch.cuda.is_available() and} True else 1)" >/dev/null 2>&1
}

choose_python() {
  if [ -n "$python_opt" ]; then
    PY=$python_opt
    return
  fi
  PY=
  # Few retries: where no registry can be reached (a lent GPU host), fail fast and fall back.
  if PIP_RETRIES=${PIP_RETRIES:-1} PIP_TIMEOUT=${PIP_TIMEOUT:-10} bash scripts/setup.sh; then
    PY=.venv/bin/python
  else
    echo "device-check: scripts/setup.sh failed (no package registry here?)"
  fi
  local want_cuda=
  [ "$device" != cpu ] && want_cuda=cuda
  # (unquoted on purpose: no second argument for --device cpu)
  if { [ -z "$PY" ] || ! torch_ok "$PY" $want_cuda; } && torch_ok python3 $want_cuda; then
    echo "device-check: ${PY:-.venv} has no torch${want_cuda:+ that sees CUDA}; using $(command -v python3) as it is"
    PY=python3
  fi
  if [ -z "$PY" ]; then
    echo "device-check: no Python to run with: build .venv (bash scripts/setup.sh) or pass --python PATH" >&2
    exit 1
  fi
}

# Seconds left of the budget, keeping $1 seconds for the parts after this one.
budget_left() {
  echo $(( deadline - SECONDS - $1 ))
}

declare -a summary=()
failed=0

# run_part NAME CAP RESERVE KIND CMD...: CMD under min(CAP, budget left - RESERVE) seconds.
# KIND "tests": any non-zero status fails the check; "bench": status 1 is a target missed.
run_part() {
  local name=$1 cap=$2 reserve=$3 kind=$4
  shift 4
  local limit start rc verdict
  limit=$(budget_left "$reserve")
  [ "$limit" -gt "$cap" ] && limit=$cap
  echo
  echo "=== $name (limit ${limit} s)"
  echo "\$ $*"
  if [ "$limit" -lt 10 ]; then
    summary+=("$(printf '%-44s %s' "$name" "NOT RUN: no time left in the budget")")
    failed=1
    return
  fi
  start=$SECONDS
  timeout -s INT -k 15 "$limit" "$@"
  rc=$?
  case "$kind:$rc" in
    *:0) verdict="ok" ;;
    *:124|*:137) verdict="TIMED OUT after ${limit} s"; failed=1 ;;
    bench:1) verdict="ran; a target missed (see its output)" ;;
    *) verdict="FAILED (exit status $rc)"; failed=1 ;;
  esac
  summary+=("$(printf '%-44s %-4s s  %s' "$name" "$(( SECONDS - start ))" "$verdict")")
}

main() {
  echo "device-check: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), host ${HOSTNAME:-?}, --device $device"
  choose_python
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # datapipes from this tree, whatever the interpreter
  export PYTHONUNBUFFERED=1
  "$PY" - "$device" <<'PY' || exit 1
import os, platform, sys

import torch

import datapipes

want = sys.argv[1]
usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
print(f"python {sys.version.split()[0]} ({sys.executable}), {platform.platform()}")
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}), datapipes from {os.path.dirname(datapipes.__file__)}")
print(f"CPUs: {os.cpu_count()} ({usable} usable by this process)")
if torch.cuda.is_available():
    i = torch.cuda.current_device()
    p = torch.cuda.get_device_properties(i)
    print(f"GPU: {torch.cuda.device_count()} visible; current cuda:{i} {p.name}, {p.total_memory / 2**30:.0f} GiB, "
          f"{p.multi_processor_count} SMs, compute capability {p.major}.{p.minor}")
else:
    print("GPU: none (torch.cuda.is_available() is False)")
if want != "cpu" and not torch.cuda.is_available():
    sys.exit(f"device-check: --device {want} needs CUDA, and this torch sees none: use --device cpu for a "
             f"smoke run, or --python with an interpreter whose torch has CUDA")
PY
  if command -v nvidia-smi >/dev/null 2>&1 && [ "$device" != cpu ]; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | sed 's/^/nvidia-smi: /'
  fi

  local ncpu junit=() junit2=() e2e_json=()
  ncpu=$("$PY" -c "import os; print(len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count())")
  if [ -n "${OUT:-}" ]; then
    junit=(--junitxml "$OUT/gpu-tests.xml")
    junit2=(--junitxml "$OUT/device-tests.xml")
    e2e_json=(--json "$OUT/end_to_end.json")
  fi
  deadline=$(( SECONDS + ${DEVICE_CHECK_BUDGET_S:-380} ))
  local pytest=("$PY" -m pytest -q -rs -p no:cacheprovider)

  run_part "1. GPU tests (pytest -m gpu)" 120 150 tests "${pytest[@]}" -m gpu tests ${junit[@]+"${junit[@]}"}
  if [ "$device" != cpu ]; then
    run_part "1b. device modules' other tests, with CUDA" 60 140 tests "${pytest[@]}" -m "not gpu and not slow" \
      tests/iter/test_device.py tests/test_demo.py tests/test_loader.py ${junit2[@]+"${junit2[@]}"}
    run_part "2. benchmarks/gpu_overlap.py" 110 90 bench "$PY" benchmarks/gpu_overlap.py --device "$device"
    # Every threaded peer (and the natural pipe) gets as many threads as the host has CPUs, as the
    # peers' own docs size them; datapipes' thread stage also runs at concurrency 2 beside it.
    local conc=2
    [ "$ncpu" -gt 2 ] && conc="$ncpu,2"
    run_part "3. benchmarks/end_to_end.py --cores $ncpu" 300 0 bench "$PY" benchmarks/end_to_end.py \
      --images 2000 --repeats 3 --malloc tuned --cores "$ncpu" --concurrency "$conc" --wait-idle 5 \
      ${e2e_json[@]+"${e2e_json[@]}"}
  else
    run_part "2. benchmarks/gpu_overlap.py (smoke)" 60 30 bench "$PY" benchmarks/gpu_overlap.py --device cpu \
      --images 40 --repeats 1 --concurrency 2
    run_part "3. benchmarks/end_to_end.py (smoke)" 60 0 bench "$PY" benchmarks/end_to_end.py --images 64 --repeats 1 \
      --malloc tuned --concurrency 2 --wait-idle 0 --only datapipes,dataloader0,limit ${e2e_json[@]+"${e2e_json[@]}"}
  fi

  echo
  echo "=== summary (--device $device, $SECONDS s in all)"
  printf '  %s\n' "${summary[@]}"
  if [ "$failed" -eq 0 ]; then
    echo "device-check: PASSED"
  else
    echo "device-check: FAILED"
  fi
  return "$failed"
}

if [ -n "${OUT:-}" ]; then
  main 2>&1 | tee "$OUT/device-check.log"
  exit "${PIPESTATUS[0]}"
fi
main 2>&1

"""Free-threaded CPython (3.13t, the fifth leg of .ci/run): the GIL stays off once datapipes is
imported, and stays off through a pass of every kind of concurrent stage.

An extension module that does not declare itself free-threading safe makes the interpreter enable the
GIL when it is imported (with a RuntimeWarning). datapipes is pure Python, so it never should; what
numpy, Pillow and torch do is recorded (printed into the CI log), not judged. On a GIL build these
tests skip."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from helpers import FREE_THREADED

pytestmark = pytest.mark.skipif(not FREE_THREADED, reason="checks a free-threaded interpreter (the 3.13t leg of .ci/run)")

# Each dependency, then every public module of datapipes, then a pass through thread, async and
# process stages; the GIL's state after each step.
PROBE = r"""
import importlib, json, pkgutil, sys
seen = {"start": sys._is_gil_enabled()}
for name in ("numpy", "PIL.Image", "torch"):
    importlib.import_module(name)
    seen[name] = sys._is_gil_enabled()
import datapipes
for info in pkgutil.walk_packages(datapipes.__path__, "datapipes."):
    if info.name == "datapipes.ray":  # needs Ray, which has no free-threaded build
        continue
    importlib.import_module(info.name)
seen["datapipes"] = sys._is_gil_enabled()

from datapipes.iter import IterableWrapper

async def twice(x):
    return 2 * x

pipe = (IterableWrapper(range(200)).map(abs, concurrency=2).map(twice)
        .map(abs, executor="process", concurrency=2).prefetch(4))
assert list(pipe) == [2 * x for x in range(200)]
seen["a pass"] = sys._is_gil_enabled()
print(json.dumps(seen))
"""


def test_importing_datapipes_and_running_a_pass_keeps_the_gil_off():
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    print(f"GIL enabled after each step (True: enabled): {seen}")  # the record, in the CI log with -rA
    assert seen["start"] is False
    third_party = [name for name in ("numpy", "PIL.Image", "torch") if seen[name]]
    if third_party:
        pytest.skip(f"{', '.join(third_party)} enabled the GIL on import: datapipes' own effect cannot be judged")
    assert seen["datapipes"] is False, f"importing datapipes enabled the GIL: {proc.stderr}"
    assert seen["a pass"] is False, f"a pass enabled the GIL: {proc.stderr}"
    assert "RuntimeWarning" not in proc.stderr, proc.stderr

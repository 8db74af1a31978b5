"""What a user installs: the wheel and the sdist built from this checkout hold the package (every
module, ``py.typed`` and the typed stub of the functional methods) and the LICENSE, and say
BSD-3-Clause in their metadata."""

import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "datapipes"
BUILD_FILES = ("setup.py", "setup.cfg", "pyproject.toml", "README.md", "LICENSE")

BUILD = """
import sys
from setuptools import build_meta
out = sys.argv[1]
sdist = build_meta.build_sdist(out)
wheel = build_meta.build_wheel(out)
print("BUILT", sdist, wheel)
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(wheel, sdist)`` paths, built in-process by setuptools from a copy of the checkout (no
    network, nothing written into the checkout)."""
    src = tmp_path_factory.mktemp("src")
    out = tmp_path_factory.mktemp("dist")
    for name in BUILD_FILES:
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(PACKAGE, src / "datapipes", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    done = subprocess.run([sys.executable, "-c", BUILD, str(out)], cwd=src, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    sdist_name, wheel_name = [line for line in done.stdout.splitlines() if line.startswith("BUILT ")][-1].split()[1:]
    return out / wheel_name, out / sdist_name


def _package_files():
    return sorted(str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*")
                  if p.is_file() and "__pycache__" not in p.parts and p.suffix in (".py", ".pyi", ".typed"))


def test_license_is_bsd_3_clause():
    text = (ROOT / "LICENSE").read_text()
    assert text.startswith("BSD 3-Clause License")
    assert "Neither the name of the copyright holder nor the names of its" in text


def test_wheel_holds_the_package_the_stub_and_the_license(built):
    wheel, _ = built
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        metadata = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = z.read(metadata).decode()
        licenses = [n for n in names if ".dist-info/" in n and n.rsplit("/", 1)[-1] == "LICENSE"]
        assert licenses, sorted(names)
        assert z.read(licenses[0]).decode() == (ROOT / "LICENSE").read_text()
    missing = [f for f in _package_files() if f not in names]
    assert missing == []
    assert {"datapipes/py.typed", "datapipes/_methods.pyi"} <= names
    assert not [n for n in names if n.startswith("tests/")]
    assert "BSD-3-Clause" in meta and "License-File: LICENSE" in meta


def test_sdist_holds_the_sources_and_the_license(built):
    _, sdist = built
    with tarfile.open(sdist) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "setup.cfg", "datapipes/py.typed", "datapipes/_methods.pyi"} <= names
    assert [f for f in _package_files() if f not in names] == []

"""The documentation builds with every Sphinx warning an error, its ``>>>`` examples (pages and the
docstrings the API reference pulls in) pass as doctests, and the API reference lists every public
name, so CI fails as soon as the docs drift from the code.

Both builds run Sphinx in a subprocess, into a temporary folder (nothing is written into the
checkout); the doctest build reuses the doctrees the HTML build read, so the sources are read once.
"""

import importlib
import pathlib
import re
import subprocess
import sys
import zlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BUILD_TIMEOUT = 280  # seconds per build; either takes about 10 s on 2 cores
PUBLIC_PACKAGES = ("datapipes", "datapipes.iter", "datapipes.map", "datapipes.spdl", "datapipes.hooks")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(2 * BUILD_TIMEOUT + 60)]


def _sphinx(builder: str, out: pathlib.Path, doctrees: pathlib.Path) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-j", "auto"]
    command += ["-b", builder, "-d", str(doctrees), str(DOCS), str(out)]
    try:
        return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"sphinx -b {builder} took more than {BUILD_TIMEOUT} s:\n{e.stderr or ''}")


def _report(result: subprocess.CompletedProcess, extra: str = "") -> str:
    return f"exit status {result.returncode}\n--- stderr ---\n{result.stderr}\n--- stdout ---\n{result.stdout}{extra}"


@pytest.fixture(scope="module")
def build_dir(tmp_path_factory):
    try:
        import furo  # noqa: F401 - the theme conf.py names
        import sphinx  # noqa: F401
    except ImportError as e:
        pytest.fail(f"{e}: install the development requirements (pip install -r requirements-dev.txt)")
    return tmp_path_factory.mktemp("docs")


@pytest.fixture(scope="module")
def html(build_dir):
    """The HTML build: its result and output folder."""
    return _sphinx("html", build_dir / "html", build_dir / "doctrees"), build_dir / "html"


def test_html_builds_without_warnings(html):
    result, out = html
    assert result.returncode == 0, _report(result)  # -W: any warning fails the build
    assert (out / "index.html").is_file() and (out / "api.html").is_file()


def test_examples_pass_as_doctests(html, build_dir):
    result = _sphinx("doctest", build_dir / "doctest", build_dir / "doctrees")
    output = build_dir / "doctest" / "output.txt"
    text = output.read_text() if output.is_file() else "(no output.txt)"
    failures = "\n".join(re.findall(r"^\*{70}\n.*?(?=^\*{70}|^\d+ items? had failures)", text, re.M | re.S))
    assert result.returncode == 0, _report(result, f"\n--- failed examples ---\n{failures or text}")
    summary = re.search(r"^\s*(\d+) tests\n\s*0 failures in tests\n\s*0 failures in setup code", text, re.M)
    assert summary and int(summary[1]) > 300, text[-2000:]
    # every page with examples was tested, and so were the docstrings of the API reference
    pages = {
        str(page.relative_to(DOCS).with_suffix("")) for page in DOCS.rglob("*.rst") if ">>> " in page.read_text()
    }
    tested = set(re.findall(r"^Document: (\S+)$", text, re.M))
    assert pages <= tested and "api" in tested, pages - tested
    assert "in docstring of datapipes.iter." in text and "in docstring of datapipes.map." in text


def _documented_names(inventory: pathlib.Path) -> set[str]:
    """The Python objects Sphinx's ``objects.inv`` lists (version 2: four header lines, then zlib)."""
    header_end = 0
    data = inventory.read_bytes()
    for _ in range(4):
        header_end = data.index(b"\n", header_end) + 1
    lines = zlib.decompress(data[header_end:]).decode().splitlines()
    return {line.split(" ", 1)[0] for line in lines if line.split(" ")[1].startswith("py:")}


def _resolve(name: str) -> object:
    """The object a dotted name names (its longest importable module, then attributes), or None."""
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attribute in parts[i:]:
                obj = getattr(obj, attribute)
        except AttributeError:
            return None
        return obj
    return None


def test_api_reference_lists_every_public_name(html):
    result, out = html
    inventory = out / "objects.inv"
    assert inventory.is_file(), _report(result)
    documented = _documented_names(inventory)
    assert len(documented) > 100
    # a name counts as listed under its own dotted name, or where the same object is documented
    # (``datapipes.iter.IterDataPipe`` is ``datapipes.IterDataPipe``)
    documented_ids = {id(obj) for obj in map(_resolve, documented) if obj is not None}
    missing = []
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            if f"{package}.{name}" not in documented and id(getattr(module, name)) not in documented_ids:
                missing.append(f"{package}.{name}")
    assert not missing, f"public names missing from the API reference (docs/api.rst): {missing}"

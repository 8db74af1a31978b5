"""The tests mirror the package (issue 41): a module's tests are found by its name.

The modules of ``datapipes/iter/`` that were regrouped by concept (callable.py, combining.py,
joining.py, parsing.py, transforming.py) left no test file named after them, and every module or
subpackage of ``datapipes/iter/`` that registers a functional name has a test file named after it
(its name a word of the file's: ``test_zipping.py``, ``test_runs_mapping.py``). Read from the file
tree alone: nothing is imported."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
ITER = ROOT / "datapipes" / "iter"

#: the modules of datapipes/iter/ regrouped away, and where their pipes' tests are now
REMOVED = {
    "callable": "mapping/: tests/iter/test_mapping.py, tests/compat/test_mapping.py",
    "combining": "muxing.py, zipping.py, broadcast/: tests/iter/test_muxing.py, test_zipping.py, test_broadcast.py",
    "joining": "zipping.py, muxing.py, broadcast/, reshaping.py: tests/compat/test_zipping.py, test_muxing.py, "
               "test_broadcast.py, test_reshaping.py",
    "parsing": "io/ (csv.py, json.py, lines.py): tests/iter/test_io.py",
    "transforming": "shuffling.py, bucketing.py, text.py, reshaping.py, mapping/: tests/compat/test_shuffling.py, "
                    "test_bucketing.py, test_text.py, test_reshaping.py, test_mapping.py",
}

#: test files still named after a removed module, and why
KEPT_NAMES = {
    # concat, zip, mux, fork and demux checkpointed together: one parametrized table mixes them
    # ("fork zip", "demux concat", "mux of concat"), as do the random compositions; the name is torch's
    # for these pipes (torch.utils.data.datapipes.iter.combining), and tests/checkpoint/ is grouped by
    # theme, not by module
    "tests/checkpoint/test_combining.py",
}

#: modules (or subpackages) of datapipes/iter/ that register pipes but have no test file named after
#: them yet, and where their tests are
KNOWN_UNNAMED = {
    # batch and unbatch moved from grouping.py to batching.py; TestBatcher and TestUnbatcher are still in
    # tests/iter/test_grouping.py (its TestPassBuilding table mixes the two modules' stages)
    "batching": "tests/iter/test_grouping.py",
    # RoutedDecoder and StreamReader, beside datapipes.utils' decoder, against torch's
    "decoding": "tests/compat/test_decoder.py",
    # the fsspec listers, openers and savers, beside fileio.py's local ones
    "remote": "tests/iter/test_fileio.py",
    # on_disk_cache, end_caching and check_hash (storage.py's, before it was split into cache/ and io/);
    # in_memory_cache in tests/iter/test_util.py
    "cache": "tests/compat/test_storage.py",
}

REGISTERS = re.compile(r"^@functional_datapipe\(", re.M)


def _test_files():
    return sorted(p.relative_to(ROOT).as_posix() for p in TESTS.rglob("test_*.py"))


def _named_after(name, path):
    """Whether *name*'s words are words of the test file's name (``test_runs_mapping.py``: "mapping")."""
    words, stem = name.split("_"), Path(path).stem.split("_")[1:]
    return any(stem[i:i + len(words)] == words for i in range(len(stem) - len(words) + 1))


def _registering():
    """The modules and subpackages of datapipes/iter/ that register a functional name, by name."""
    found = set()
    for path in ITER.rglob("*.py"):
        if REGISTERS.search(path.read_text(encoding="utf-8")):
            top = path.relative_to(ITER).parts[0]
            found.add(top.removesuffix(".py"))
    return found


def test_the_removed_modules_are_gone():
    for name in REMOVED:
        assert not (ITER / f"{name}.py").exists() and not (ITER / name).exists(), name


def test_no_test_file_is_named_after_a_removed_module():
    stale = [p for p in _test_files() if Path(p).stem.removeprefix("test_") in REMOVED and p not in KEPT_NAMES]
    assert stale == [], {p: REMOVED[Path(p).stem.removeprefix("test_")] for p in stale}
    assert all((ROOT / p).exists() for p in KEPT_NAMES), "a kept name is gone: drop it from KEPT_NAMES"


def test_every_module_that_registers_pipes_has_a_test_file_named_after_it():
    modules = _registering()
    assert {"mapping", "zipping", "reshaping", "io"} <= modules  # the scan finds the registrations
    files = _test_files()
    unnamed = sorted(m for m in modules if not any(_named_after(m, p) for p in files))
    assert unnamed == sorted(KNOWN_UNNAMED), (
        "a module of datapipes/iter/ that registers pipes needs a test file named after it "
        f"(tests/iter/test_<module>.py); without one: {sorted(set(unnamed) - set(KNOWN_UNNAMED))}; "
        f"listed in KNOWN_UNNAMED but now named: {sorted(set(KNOWN_UNNAMED) - set(unnamed))}"
    )

"""The typed stub ``datapipes/_methods.pyi`` stays in sync with the functional registry, and mypy
reads it as intended.

The sync check parses the stub with ``ast`` and compares every declaration with the registered
class's constructor; the mypy checks run mypy on ``tests/typing/`` (code that must type-check, and
lines that must not).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import datapipes
from datapipes import IterDataPipe, MapDataPipe

ROOT = Path(__file__).resolve().parent.parent
STUB = ROOT / "datapipes" / "_methods.pyi"
SAMPLES = Path(__file__).resolve().parent / "typing"
#: mypy's cache: DATAPIPES_MYPY_CACHE (scripts/test.sh points it outside the checkout, one folder per
#: interpreter and mypy release, so a fresh clone starts warm: mypy reuses an entry whose source
#: hashes the same), else the checkout's .mypy_cache
MYPY_CACHE = Path(os.environ.get("DATAPIPES_MYPY_CACHE") or ROOT / ".mypy_cache")

#: stub class -> the base whose registry it declares
STUB_CLASSES = {"IterMethods": IterDataPipe, "MapMethods": MapDataPipe}

# Parameter kinds as (name, kind, has_default); kinds use inspect's names.
POS_ONLY = inspect.Parameter.POSITIONAL_ONLY.name
POS = inspect.Parameter.POSITIONAL_OR_KEYWORD.name
VAR_POS = inspect.Parameter.VAR_POSITIONAL.name
KW_ONLY = inspect.Parameter.KEYWORD_ONLY.name
VAR_KW = inspect.Parameter.VAR_KEYWORD.name

Param = tuple[str, str, bool]


# -- reading the two sides ---------------------------------------------------------------------------


def stub_declarations() -> dict[str, dict[str, list[ast.FunctionDef]]]:
    """Stub class name -> method name -> its declarations (several when overloaded), in order."""
    tree = ast.parse(STUB.read_text(), filename=str(STUB))
    found: dict[str, dict[str, list[ast.FunctionDef]]] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in STUB_CLASSES:
            methods: dict[str, list[ast.FunctionDef]] = {}
            for item in node.body:
                if isinstance(item, ast.FunctionDef):
                    methods.setdefault(item.name, []).append(item)
                elif isinstance(item, ast.AsyncFunctionDef):
                    raise AssertionError(f"{node.name}.{item.name}: functional methods are not async")
            found[node.name] = methods
    return found


def stub_params(fn: ast.FunctionDef) -> list[Param]:
    """The parameters of a stub declaration, ``self`` left out."""
    a = fn.args
    positional = [*a.posonlyargs, *a.args]
    first_default = len(positional) - len(a.defaults)
    params: list[Param] = []
    for i, arg in enumerate(positional):
        kind = POS_ONLY if i < len(a.posonlyargs) else POS
        params.append((arg.arg, kind, i >= first_default))
    if a.vararg is not None:
        params.append((a.vararg.arg, VAR_POS, False))
    for arg, default in zip(a.kwonlyargs, a.kw_defaults):
        params.append((arg.arg, KW_ONLY, default is not None))
    if a.kwarg is not None:
        params.append((a.kwarg.arg, VAR_KW, False))
    if not params or params[0][0] != "self":
        raise AssertionError(f"{fn.name} (line {fn.lineno}): the first parameter must be self")
    return params[1:]


def registered_params(cls: type) -> list[Param]:
    """The constructor's parameters minus the source: what ``pipe.name(...)`` takes after ``self``.

    A constructor taking ``*datapipes`` keeps them: the source is the first of them.
    """
    params = [
        (p.name, p.kind.name, p.default is not inspect.Parameter.empty)
        for p in inspect.signature(cls).parameters.values()
    ]
    if params and params[0][1] in (POS_ONLY, POS):
        return params[1:]
    return params


def ours(cls: type) -> bool:
    """A class of the datapipes package (tests and users register classes of their own too)."""
    return cls.__module__ == "datapipes" or cls.__module__.startswith("datapipes.")


def registry() -> dict[str, dict[str, type]]:
    """Stub class name -> functional name -> class, for the package's own registrations."""
    import datapipes.iter  # noqa: F401 - registers the iterable-style pipes
    import datapipes.map  # noqa: F401 - registers the map-style pipes

    return {
        stub: {name: cls for name, cls in base._functions.items() if ours(cls)}  # type: ignore[attr-defined]
        for stub, base in STUB_CLASSES.items()
    }


def is_overload(fn: ast.FunctionDef) -> bool:
    return any(ast.unparse(d) in ("overload", "typing.overload") for d in fn.decorator_list)


def narrowing_problem(params: list[Param], want: list[Param]) -> str | None:
    """Why an earlier overload is not a narrowing of the constructor's signature, or None.

    An overload may leave parameters out, may require one that has a default and may make one
    keyword-only; the ones it names keep their name, kind and order, and a required one stays
    required. Positional-only parameters (any names) may stand where the constructor takes
    ``*datapipes``: ``zip(self, a, b, /)``.
    """
    where = {name: (i, kind, default) for i, (name, kind, default) in enumerate(want)}
    var_pos = next((i for i, (_, kind, _) in enumerate(want) if kind == VAR_POS), None)
    last = -1
    for name, kind, default in params:
        if kind == POS_ONLY:
            if var_pos is None:
                return f"positional-only parameter {name!r}, but the constructor takes no *args"
            if last > var_pos:
                return f"positional-only parameter {name!r} after the parameters that follow *args"
            last = var_pos
            continue
        if name not in where:
            return f"parameter {name!r} is not a constructor parameter"
        index, want_kind, want_default = where[name]
        if kind != want_kind and not (kind == KW_ONLY and want_kind == POS):
            return f"parameter {name!r} is {kind}, the constructor's is {want_kind}"
        if default and not want_default:
            return f"parameter {name!r} has a default, the constructor's is required"
        if index < last:
            return f"parameter {name!r} is out of the constructor's order"
        last = index
    return None


def sync_problems() -> list[str]:
    """Every difference between the stub and the registry, as readable lines."""
    problems: list[str] = []
    declared = stub_declarations()
    for stub_class, functions in registry().items():
        methods = declared.get(stub_class)
        if methods is None:
            problems.append(f"_methods.pyi declares no class {stub_class}")
            continue
        base = STUB_CLASSES[stub_class].__name__
        for name in sorted(set(methods) - set(functions)):
            problems.append(f"{stub_class}.{name} is declared but no class registers {name!r} on {base}")
        for name in sorted(set(functions) - set(methods)):
            cls = functions[name]
            problems.append(
                f"{stub_class}.{name} is missing: {cls.__module__}.{cls.__qualname__}{inspect.signature(cls)}"
            )
        for name in sorted(set(functions) & set(methods)):
            cls = functions[name]
            want = registered_params(cls)
            decls = methods[name]
            label = f"{stub_class}.{name} ({cls.__qualname__})"
            if len(decls) > 1 and not all(is_overload(d) for d in decls):
                problems.append(f"{label}: several declarations, not all @overload")
            for d in decls:
                positional = [*d.args.posonlyargs, *d.args.args][1:]  # self needs no type
                rest = [a for a in (d.args.vararg, d.args.kwarg) if a is not None]
                missing = [a.arg for a in (*positional, *d.args.kwonlyargs, *rest) if a.annotation is None]
                if missing:
                    problems.append(f"{label} (line {d.lineno}): parameters without a type: {missing}")
                if d.returns is None:
                    problems.append(f"{label} (line {d.lineno}): no result type")
            # The last declaration is the general one: every parameter, by name, kind and order.
            general = stub_params(decls[-1])
            if [p[:2] for p in general] != [p[:2] for p in want]:
                problems.append(
                    f"{label}: the last declaration (line {decls[-1].lineno}) takes "
                    f"{[p[:2] for p in general]}, the constructor takes {[p[:2] for p in want]} after the source"
                )
            for d in decls:
                why = narrowing_problem(stub_params(d), want)
                if why is not None:
                    problems.append(f"{label}: declaration at line {d.lineno}: {why}")
            # A parameter with a default can be left out of a call in at least one declaration.
            for pname, _, has_default in want:
                if has_default and not any(
                    all(p[0] != pname or p[2] for p in stub_params(d)) for d in decls
                ):
                    problems.append(f"{label}: {pname} has a default but every declaration requires it")
    return problems


# -- the sync test -------------------------------------------------------------------------------------


class TestStubInSync:
    def test_stub_matches_the_registry(self):
        problems = sync_problems()
        assert not problems, "datapipes/_methods.pyi is out of sync:\n" + "\n".join(problems)

    def test_both_namespaces_are_declared(self):
        declared = stub_declarations()
        assert set(declared) == set(STUB_CLASSES)
        # map, batch, concat, zip and shuffle exist on both bases (docs/howto/custom_pipe.rst: separate namespaces)
        for name in ("map", "batch", "concat", "zip", "shuffle"):
            assert name in declared["IterMethods"] and name in declared["MapMethods"], name

    def test_registered_params_drops_the_source(self):
        from datapipes.iter import Filter

        assert [p[0] for p in registered_params(Filter)] == [
            p for p in inspect.signature(Filter).parameters if p != "datapipe"
        ]
        # *datapipes keeps the source inside it
        concat = registry()["IterMethods"].get("concat") or registry()["MapMethods"]["concat"]
        assert registered_params(concat) == [("datapipes", VAR_POS, False)]

    def test_the_check_catches_a_renamed_parameter(self, monkeypatch):
        # The checker itself must fail on a stub that drifted: rename batch's batch_size.
        text = STUB.read_text()
        drifted = re.sub(r"(def batch\(\s*self,\s*)batch_size", r"\1size", text)
        assert drifted != text
        monkeypatch.setattr(sys.modules[__name__], "STUB", _write(drifted))
        problems = sync_problems()
        assert any(p.startswith("IterMethods.batch (Batcher): the last declaration") for p in problems)
        assert any(p.startswith("MapMethods.batch (Batcher): the last declaration") for p in problems)

    def test_the_check_catches_a_lost_default(self, monkeypatch):
        text = STUB.read_text().replace("def header(self, limit: int | None = ...)", "def header(self, limit: int | None)")
        assert text != STUB.read_text()
        monkeypatch.setattr(sys.modules[__name__], "STUB", _write(text))
        problems = sync_problems()
        assert "IterMethods.header (Header): limit has a default but every declaration requires it" in problems

    def test_the_check_catches_an_unregistered_method(self, monkeypatch):
        text = STUB.read_text().replace(
            "class MapMethods(Generic[T_co]):",
            "class MapMethods(Generic[T_co]):\n    def no_such_op(self) -> MapDataPipe[T_co]: ...",
            1,
        )
        monkeypatch.setattr(sys.modules[__name__], "STUB", _write(text))
        assert "MapMethods.no_such_op is declared but no class registers 'no_such_op' on MapDataPipe" in sync_problems()

    def test_classes_registered_outside_the_package_are_not_required(self):
        from datapipes import functional_datapipe

        class Doubler(IterDataPipe):  # a user's own pipe, registered in this process
            def __init__(self, datapipe):
                self.datapipe = datapipe

            def __iter__(self):
                return (2 * x for x in self.datapipe)

        functional_datapipe("double_for_typing_test")(Doubler)
        assert "double_for_typing_test" in IterDataPipe._functions
        assert "double_for_typing_test" not in registry()["IterMethods"]
        assert not any("double_for_typing_test" in p for p in sync_problems())

    def test_narrowing_rules(self):
        want = [("datapipes", VAR_POS, False)]
        assert narrowing_problem([("a", POS_ONLY, False), ("b", POS_ONLY, False)], want) is None
        want = [("batch_size", POS, False), ("drop_last", POS, True), ("wrapper_class", POS, True)]
        assert narrowing_problem([("batch_size", POS, False), ("drop_last", POS, True)], want) is None
        assert narrowing_problem([("batch_size", POS, False), ("wrapper_class", POS, False)], want) is None
        assert "order" in narrowing_problem([("drop_last", POS, True), ("batch_size", POS, False)], want)
        assert "required" in narrowing_problem([("batch_size", POS, True)], want)
        assert "not a constructor parameter" in narrowing_problem([("size", POS, False)], want)
        assert "*args" in narrowing_problem([("x", POS_ONLY, False)], want)
        # a parameter may become keyword-only in an overload, never the other way round
        assert narrowing_problem([("batch_size", POS, False), ("wrapper_class", KW_ONLY, False)], want) is None
        want = [("buffer_size", KW_ONLY, True)]
        assert "KEYWORD_ONLY" in narrowing_problem([("buffer_size", POS, True)], want)


_tmp_stubs: list[Path] = []


def _write(text: str) -> Path:
    import tempfile

    f = tempfile.NamedTemporaryFile("w", suffix=".pyi", delete=False)
    with f:
        f.write(text)
    _tmp_stubs.append(Path(f.name))
    return Path(f.name)


@pytest.fixture(autouse=True, scope="module")
def _remove_tmp_stubs():
    yield
    for p in _tmp_stubs:
        p.unlink(missing_ok=True)


# -- the samples run -------------------------------------------------------------------------------------


class TestSamplesRun:
    def test_sample_ok_runs(self):
        # The typed sample is real code: its runtime asserts check that the declared result types
        # describe what the pipes yield (zip gives tuples, fork a list of pipes, ...).
        runpy.run_path(str(SAMPLES / "sample_ok.py"), run_name="sample_ok")

    def test_sample_bad_runs(self):
        # Every line the type checker must reject still runs: the errors are type errors only.
        runpy.run_path(str(SAMPLES / "sample_bad.py"), run_name="sample_bad")


# -- mypy ------------------------------------------------------------------------------------------------

_LINE = re.compile(r"^(?P<path>[^:\n]+):(?P<line>\d+): (?P<level>error|note): (?P<msg>.*?)(?:  \[(?P<code>[a-z-]+)\])?$")
_EXPECT = re.compile(r"#\s*E:\s*(?P<code>[a-z-]+)")


def _mypy(*paths: Path) -> list[dict[str, str]]:
    cmd = [
        sys.executable, "-m", "mypy",
        "--follow-imports=silent",      # report our files only, as a user's mypy does for a library
        "--no-error-summary",
        "--show-error-codes",
        "--no-color-output",
        "--cache-dir", str(MYPY_CACHE),
        *(str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else str(p) for p in paths),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280)
    if proc.returncode not in (0, 1) or proc.stderr.strip():
        raise AssertionError(f"mypy did not run (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    found = []
    for line in proc.stdout.splitlines():
        m = _LINE.match(line)
        if m is None:
            raise AssertionError(f"unexpected mypy output: {line!r}\n{proc.stdout}")
        found.append({k: v or "" for k, v in m.groupdict().items()})
    return found


@pytest.fixture(scope="module")
def mypy_report() -> list[dict[str, str]]:
    return _mypy(STUB, SAMPLES / "sample_ok.py", SAMPLES / "sample_bad.py")


def _errors_in(report: list[dict[str, str]], name: str) -> list[dict[str, str]]:
    return [r for r in report if r["level"] == "error" and Path(r["path"]).name == name]


@pytest.mark.slow
@pytest.mark.timeout(300)
class TestMypy:
    def test_stub_itself_type_checks(self, mypy_report):
        errors = _errors_in(mypy_report, "_methods.pyi")
        assert not errors, "\n".join(f"{e['line']}: {e['msg']} [{e['code']}]" for e in errors)

    def test_sample_ok_type_checks(self, mypy_report):
        # assert_type/annotated assignments: pipe.map(str) is an IterDataPipe[str], and so on
        errors = _errors_in(mypy_report, "sample_ok.py")
        assert not errors, "\n".join(f"{e['line']}: {e['msg']} [{e['code']}]" for e in errors)

    def test_sample_bad_fails_exactly_where_marked(self, mypy_report):
        # Each line marked `# E: code` must give that mypy error; no other line may give one.
        expected = {}
        for number, line in enumerate((SAMPLES / "sample_bad.py").read_text().splitlines(), start=1):
            m = _EXPECT.search(line)
            if m:
                expected[number] = m["code"]
        assert len(expected) >= 10
        got: dict[int, set[str]] = {}
        for e in _errors_in(mypy_report, "sample_bad.py"):
            got.setdefault(int(e["line"]), set()).add(e["code"])
        missing = {n: c for n, c in expected.items() if c not in got.get(n, set())}
        extra = {n: c for n, c in got.items() if n not in expected}
        assert not missing, f"lines mypy accepted but must reject: {missing}"
        assert not extra, f"lines mypy rejected unexpectedly: {extra}"

    def test_reveal_type_shows_the_element_type(self, tmp_path):
        # What an IDE shows on hover: the element type flows through the chain.
        sample = ROOT / "tests" / "typing" / "sample_reveal.py"
        report = _mypy(sample)
        notes = {int(r["line"]): r["msg"] for r in report if r["level"] == "note"}
        want = {}
        for number, line in enumerate(sample.read_text().splitlines(), start=1):
            m = re.search(r"reveal_type\(.*#\s*N:\s*(.*)$", line)
            if m:
                want[number] = m.group(1).strip()
        assert want and notes == {n: f'Revealed type is "{t}"' for n, t in want.items()}

    def test_dataloader_is_generic_in_what_it_yields(self, tmp_path):
        # DataLoader[T]: the pipe's items when nothing batches them, the last function's result type
        # where one is given (collate_fn, aggregator, transfer_fn), Any where it cannot be known.
        sample = tmp_path / "sample_loader.py"
        sample.write_text(_LOADER_SAMPLE)
        report = _mypy(sample)
        errors = [r for r in report if r["level"] == "error"]
        assert not errors, "\n".join(f"{e['line']}: {e['msg']} [{e['code']}]" for e in errors)
        notes = {int(r["line"]): r["msg"] for r in report if r["level"] == "note"}
        want = {}
        for number, line in enumerate(_LOADER_SAMPLE.splitlines(), start=1):
            m = re.search(r"reveal_type\(.*#\s*N:\s*(.*)$", line)
            if m:
                want[number] = m.group(1).strip()
        assert len(want) >= 8 and notes == {n: f'Revealed type is "{t}"' for n, t in want.items()}


_LOADER_SAMPLE = """\
import torch
from datapipes import DataLoader
from datapipes.iter import IterableWrapper
from datapipes.map import SequenceWrapper


def stack(batch: list[int]) -> torch.Tensor:
    return torch.tensor(batch)


pipe = IterableWrapper([1, 2, 3])
reveal_type(DataLoader(dataset=pipe, batch_size=None))  # N: datapipes.loader.dataloader.DataLoader[int]
reveal_type(DataLoader(["a"], batch_size=None, num_workers=0, seed=1))  # N: datapipes.loader.dataloader.DataLoader[str]
reveal_type(DataLoader(SequenceWrapper([b"x"]), None))  # N: datapipes.loader.dataloader.DataLoader[bytes]
reveal_type(DataLoader(pipe, batch_size=2))  # N: datapipes.loader.dataloader.DataLoader[Any]
reveal_type(DataLoader(pipe, 2, collate_fn=stack))  # N: datapipes.loader.dataloader.DataLoader[torch._tensor.Tensor]
reveal_type(DataLoader(pipe, 2, collate_fn=stack, device="cpu"))  # N: datapipes.loader.dataloader.DataLoader[Any]
reveal_type(DataLoader(src=["a"], batch_size=2, aggregator="".join))  # N: datapipes.loader.dataloader.DataLoader[str]
reveal_type(DataLoader(["a"], aggregator="".join, transfer_fn=len))  # N: datapipes.loader.dataloader.DataLoader[int]
for batch in DataLoader(pipe, 2, collate_fn=stack):
    reveal_type(batch)  # N: torch._tensor.Tensor
with DataLoader(pipe=pipe, batch_size=None) as loader:
    reveal_type(loader)  # N: datapipes.loader.dataloader.DataLoader[int]
"""


@pytest.mark.slow  # about 13 s from an empty cache on 2 cores, about 1 s with the cache
@pytest.mark.timeout(300)
def test_the_package_type_checks():
    # mypy -p datapipes with the repository's setup.cfg [mypy] section reports no error. Its own
    # cache directory: the runs above use other options, which would invalidate a shared cache.
    cmd = [
        sys.executable, "-m", "mypy",
        "--config-file", str(ROOT / "setup.cfg"),
        "--show-error-codes",
        "--no-color-output",
        "--cache-dir", str(MYPY_CACHE / "package"),
        "-p", "datapipes",
    ]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0, f"mypy -p datapipes (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("package", ["broadcast", "cache", "io", "mapping"])
def test_each_subpackage_of_iter_lists_its_modules_names(package):
    # a subpackage of datapipes.iter writes its __all__ out (mypy reads only a literal one to see
    # what ``from datapipes.iter import Forker`` re-exports): it must stay the union of its modules'
    import importlib
    import pkgutil

    pkg = importlib.import_module(f"datapipes.iter.{package}")
    modules = [importlib.import_module(f"{pkg.__name__}.{m.name}") for m in pkgutil.iter_modules(pkg.__path__)
               if not m.name.startswith("_")]
    union = {name for module in modules for name in getattr(module, "__all__", ())}
    assert sorted(pkg.__all__) == sorted(union) and len(pkg.__all__) == len(union)


def test_every_subpackage_of_iter_is_checked_above():
    import pkgutil

    import datapipes.iter

    found = sorted(m.name for m in pkgutil.iter_modules(datapipes.iter.__path__) if m.ispkg)
    assert found == ["broadcast", "cache", "io", "mapping"]


def test_datapipes_is_typed():
    # the marker file that tells type checkers to read the package's annotations and stubs
    assert (Path(datapipes.__file__).parent / "py.typed").exists()

"""The package's layering (docs/architecture.rst, "Layers"): no import circles, none hidden behind a function-level
import, and the base classes import no concrete pipe."""

import ast
import difflib
import importlib
import inspect
import textwrap
from pathlib import Path

import pytest

from datapipes._runtime.traits import TRAITS, Traits

PACKAGE = Path(__file__).resolve().parent.parent / "datapipes"
#: the command-line entry point may import lazily (start-up time); it is imported by nothing
LAZY_OK = {"datapipes.__main__", "datapipes._demo_data"}


def _module_name(path):
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(module, node):
    """The absolute name of the package module an ``import``/``from`` node names, or None."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.startswith("datapipes")]
    base = module.split(".")
    if not MODULES[module].name == "__init__.py":
        base = base[:-1]
    if node.level:
        base = base[: len(base) - node.level + 1]
        target = ".".join(base + ([node.module] if node.module else []))
    else:
        target = node.module or ""
    if not target.startswith("datapipes"):
        return []
    found = []
    for alias in node.names:  # "from . import _pass" names a module
        sub = f"{target}.{alias.name}"
        found.append(sub if sub in MODULES else target)
    return found


MODULES = {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports():
    graph, lazy = {}, []
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text())
        top = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                targets = [t for t in _resolve(name, node) if t in MODULES and t != name]
                if node in tree.body or any(node in getattr(n, "body", []) for n in tree.body
                                            if isinstance(n, ast.If)):  # TYPE_CHECKING blocks
                    top.update(targets)
                elif targets:
                    lazy.append((name, node.lineno, targets))
        graph[name] = top
    return graph, lazy


def _package_parents(name):
    parts = name.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def test_no_function_level_imports_of_the_package():
    _, lazy = _imports()
    assert [x for x in lazy if x[0] not in LAZY_OK] == []


def test_no_import_circles():
    graph, _ = _imports()
    # importing a submodule runs its package's __init__ first: a package importing its own
    # submodules is not a circle through them
    edges = {m: {t for t in ts if t not in _package_parents(m)} for m, ts in graph.items()}
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for t in sorted(edges.get(m, ())):
            if state.get(t) == "open":
                cycle = stack[stack.index(t):] + [t]
                pytest.fail("import circle: " + " -> ".join(cycle))
            if t not in state:
                visit(t)
        stack.pop()
        state[m] = "done"

    for m in sorted(edges):
        if m not in state:
            visit(m)


def _reached(base):
    """Every package module ``base`` imports at its top level, directly or through others."""
    graph, _ = _imports()
    seen, todo = set(), [base]
    while todo:
        m = todo.pop()
        for t in graph[m]:
            if t not in seen:
                seen.add(t)
                todo.append(t)
    return seen


RUNTIME = sorted(m for m in MODULES if m.startswith("datapipes._runtime."))


@pytest.mark.parametrize("base", ["datapipes.datapipe", "datapipes.graph", "datapipes.errors", *RUNTIME])
def test_the_bottom_layers_import_no_pipe(base):
    pipes = sorted(m for m in _reached(base) if m.startswith(("datapipes.iter", "datapipes.map", "datapipes.loader")))
    assert pipes == [], f"{base} imports concrete pipes: {pipes}"


def test_the_pass_runtime_is_one_package():
    # the layer 3 modules that run a pass live in datapipes/_runtime/, none beside the public modules
    assert {"passes", "shares", "held", "worker", "seeds", "observe", "tuning"} <= {m.rsplit(".", 1)[1] for m in RUNTIME}
    top = {m for m in MODULES if m.count(".") == 1}
    assert not top & {"datapipes._pass", "datapipes._held", "datapipes._worker", "datapipes._seeds",
                      "datapipes._observe", "datapipes._tuning"}


@pytest.mark.parametrize("base", sorted(m for m in MODULES if m.startswith("datapipes._engine")))
def test_the_engine_knows_nothing_of_pipes_or_passes(base):
    # layer 2 runs a function on workers: it imports no pass, no base class and no pipe (errors
    # gives it the failure policy)
    above = sorted(m for m in _reached(base) if not m.startswith("datapipes._engine")
                   and m not in ("datapipes", "datapipes.errors", "datapipes._checks", "datapipes._redact"))
    assert above == [], f"{base} imports layers above the engine: {above}"


def test_no_module_imports_the_optional_ray_bridge():
    # datapipes.ray needs the [ray] extra: the rest of the package must import without Ray
    graph, lazy = _imports()
    assert [m for m, targets in graph.items() if "datapipes.ray" in targets] == []
    assert [x for x in lazy if "datapipes.ray" in x[2]] == []


# -- stage traits (datapipes/_runtime/traits.py): declared in one place, read as attributes ----------

TRAITS_MODULE = PACKAGE / "_runtime" / "traits.py"


#: every trait, and the mark on an ``__iter__`` that joins passes (read by ``traits.pass_hooked``)
ALL_TRAITS = TRAITS | {"_pass_hooked"}


def _reads_by_name(tree, names):
    """``(line, call)`` for every ``getattr``/``hasattr`` in ``tree`` that reads one of ``names`` by a
    string."""
    found = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and node.args[1].value in names):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_trait_is_read_by_name_outside_its_declaration():
    # the runtime reads a trait as an attribute (stage._is_random), or through traits_of() where the
    # stage may not be ours: a getattr(stage, "_trait", default) would hide a trait that is not declared
    found = [(str(path.relative_to(PACKAGE.parent)), line, call) for path in PACKAGE.rglob("*.py")
             if path != TRAITS_MODULE for line, call in _reads_by_name(ast.parse(path.read_text()), ALL_TRAITS)]
    assert found == []


def _targets(node):
    if isinstance(node, ast.Assign):
        return node.targets
    return [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []


def _set_names(cls_source):
    """The names a class body sets on its class (assignments, methods) or its instances (``self.x = ...``)."""
    tree = ast.parse(cls_source)
    names = set()
    for node in tree.body[0].body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        names.update(t.id for t in _targets(node) if isinstance(t, ast.Name))
    for node in ast.walk(tree):
        for target in _targets(node):
            names.update(t.attr for t in ast.walk(target) if isinstance(t, ast.Attribute)
                         and isinstance(t.value, ast.Name) and t.value.id == "self")
    return names


#: names stages use, near a trait's name but not meant as one
NOT_TRAITS = {"_source"}  # a reader's source pipe (parquet), not _sources()


def _misspelt(names, traits):
    """The names of ``names`` that are not traits but one slip away from one (``_is_randon``)."""
    return sorted((name, close[0]) for name in names - NOT_TRAITS if name.startswith("_") and not name.startswith("__")
                  and name not in traits and (close := difflib.get_close_matches(name, traits, n=1, cutoff=0.85)))


def _stage_classes():
    """Every stage class of the package (each module imported, the optional Ray bridge and the lazy
    entry points aside)."""
    for name in MODULES:
        if name != "datapipes.ray" and name not in LAZY_OK:
            importlib.import_module(name)
    found, todo = [], [Traits]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return [c for c in found if c.__module__.startswith("datapipes.") and inspect.isclass(c)]


def test_the_trait_check_sees_a_misspelt_trait():
    source = "class Mine(IterDataPipe):\n    _is_randon = True\n    def __init__(self):\n        self._statless = 1\n"
    found = _misspelt(_set_names(source), ALL_TRAITS)
    assert found == [("_is_randon", "_is_random"), ("_statless", "_stateless")]


def test_every_trait_a_stage_sets_is_declared():
    # a stage that sets _is_randon = True (or self._statless = ...) would be read as declaring
    # nothing: every name a stage class sets near a trait's name must be the trait itself, and a
    # trait set in a class body has the declared kind (a flag, a method)
    classes = _stage_classes()
    assert len(classes) > 100  # the pipes were found
    wrong, mistyped = [], []
    for cls in classes:
        names = _set_names(textwrap.dedent(inspect.getsource(cls)))
        wrong += [(cls.__qualname__, *pair) for pair in _misspelt(names, ALL_TRAITS)]
        for name, value in vars(cls).items():
            default = Traits.__dict__.get(name)
            if isinstance(default, bool) and not isinstance(value, (bool, property)) \
                    or inspect.isfunction(default) and not callable(value):
                mistyped.append((cls.__qualname__, name, value))
    assert wrong == []
    assert mistyped == []


# -- the abandon ritual, owned by a check ------------------------------------------------------------
#: calls by which a loop hands its upstream back on the way out (docs/architecture.rst, "Adding a pipe")
CLOSERS = {"abandon", "_abandon_all", "close_iterator", "_close"}

#: generator loops that iterate a parameter without closing it, each with where its upstream is closed
#: (the loop is an inner piece of a pass whose outer generator or iterator closes the upstream), or why
#: there is no upstream pass to close
INNER_LOOPS = {
    ("datapipes.iter.fileio", "_listed"): "a local listing's chunks, no upstream pass",
    ("datapipes.iter.grouping", "_buffer_shuffle"): "inside _bucket_stream, which abandons the source",
    ("datapipes.iter.sharding", "_layered"): "inside a _ShardIterator, whose close() closes the source",
    ("datapipes.loader.distributed", "_even_stepwise"): "inside the even-batches pass, which closes it in a finally",
    ("datapipes.ray", "_read_shard"): "a Ray task iterating a whole pipe: its pass ends with the task",
    ("datapipes.utils.common", "get_file_binaries_from_pathnames"): "torch's helper over a list of names",
}


def _own_nodes(fn):
    """The nodes of ``fn``'s body, those of the functions and classes defined inside it excluded."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        yield node
        stack.extend(ast.iter_child_nodes(node))


def _loops_over_a_parameter(fn):
    """Whether generator ``fn`` pulls items from one of its parameters: a ``for`` around a ``yield``, or
    ``next(param, ...)``."""
    params = {a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs}
    nodes = list(_own_nodes(fn))
    if not any(isinstance(n, (ast.Yield, ast.YieldFrom)) for n in nodes):
        return False
    for n in nodes:
        if (isinstance(n, ast.For) and isinstance(n.iter, ast.Name) and n.iter.id in params
                and any(isinstance(m, (ast.Yield, ast.YieldFrom)) for m in ast.walk(n))):
            return True
        if (isinstance(n, ast.Call) and getattr(n.func, "id", None) == "next" and n.args
                and isinstance(n.args[0], ast.Name) and n.args[0].id in params):
            return True
    return False


def _closes(fn):
    return any(isinstance(n, ast.Call) and getattr(n.func, "id", getattr(n.func, "attr", None)) in CLOSERS
               for n in _own_nodes(fn))


def _unclosed_loops():
    found = set()
    for name, path in MODULES.items():
        for fn in ast.walk(ast.parse(path.read_text())):
            if isinstance(fn, ast.FunctionDef) and _loops_over_a_parameter(fn) and not _closes(fn):
                found.add((name, fn.name))
    return found


def test_every_loop_over_an_upstream_closes_it_on_the_way_out():
    """A generator that pulls from an upstream iterator closes it when an exception leaves
    (``except BaseException: abandon(it); raise``) or always (``finally: close_iterator(it)``), so a
    failing pass releases the upstream's threads, processes and files at once; an inner loop of a pass
    whose outer piece does that is listed in INNER_LOOPS, with where."""
    found = _unclosed_loops()
    assert found <= set(INNER_LOOPS), (
        f"these loops pull from an upstream without closing it on the way out: {sorted(found - set(INNER_LOOPS))}"
    )
    assert set(INNER_LOOPS) <= found, f"stale INNER_LOOPS entries: {sorted(set(INNER_LOOPS) - found)}"


def test_the_loop_check_sees_a_loop_that_forgets():
    forgets = ast.parse("def f(it):\n    for x in it:\n        yield x\n").body[0]
    closes = ast.parse("def f(it):\n    try:\n        for x in it:\n            yield x\n"
                       "    except BaseException:\n        abandon(it)\n        raise\n").body[0]
    pulls = ast.parse("def f(it):\n    while True:\n        yield next(it)\n").body[0]
    local = ast.parse("def f(n):\n    for x in range(n):\n        yield x\n").body[0]
    assert _loops_over_a_parameter(forgets) and not _closes(forgets)
    assert _loops_over_a_parameter(closes) and _closes(closes)
    assert _loops_over_a_parameter(pulls) and not _loops_over_a_parameter(local)


# -- the pass is handed to each stage ----------------------------------------------------------------
#: modules that find a pass without being handed it (passes.current / passes.owner), and why
AMBIENT_OK = {
    "datapipes._runtime.passes": "the adapter for torch-style stages lives here (adapted, start)",
    "datapipes.datapipe": "_pass_seed(): how a torch-style stage asks for its seed from inside its __iter__",
    "datapipes.loader.dataloader": "iter(loader) inside a stage being built defers its worker start (a fork "
                                   "would copy that state)",
    "datapipes.iter._readers": "a stream held in a saved item is reopened by the held-stream codec, which is "
                               "not handed the pass yet",
}


def test_every_iterable_stage_of_the_package_is_opened_with_its_pass():
    """No IterDataPipe of the package defines its own ``__iter__``: each defines ``_open(ctx)`` and
    gets the base class's (docs/architecture.rst, "The stage protocol")."""
    from datapipes import IterDataPipe
    from datapipes._runtime.passes import OPEN_ITER

    own = []
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            if "datapipes[" in str(e):  # an optional extra not installed here (ray on 3.13t): checked where it is
                continue
            raise
        for cls in vars(module).values():
            if (inspect.isclass(cls) and issubclass(cls, IterDataPipe) and cls is not IterDataPipe
                    and cls.__module__ == name and "__iter__" in cls.__dict__ and cls.__dict__["__iter__"] is not OPEN_ITER):
                own.append(f"{name}.{cls.__qualname__}")
    assert not own, f"these stages define __iter__ instead of _open(ctx): {own}"


def test_only_the_adapter_finds_a_pass_it_was_not_handed():
    found = set()
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                base = getattr(getattr(func, "value", None), "id", None)
                if called in ("current", "owner") and (base in ("_pass", "passes") or name.endswith("passes")):
                    found.add(name)
                if called == "pass_being_built":
                    found.add(name)
    assert found <= set(AMBIENT_OK), f"these modules look the pass up instead of being handed it: {sorted(found - set(AMBIENT_OK))}"
    assert set(AMBIENT_OK) <= found, f"stale AMBIENT_OK entries: {sorted(set(AMBIENT_OK) - found)}"

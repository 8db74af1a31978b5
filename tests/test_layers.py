"""The package's layering (docs/architecture.rst, "Layers"): no import circles, none hidden behind a function-level
import, and the base classes import no concrete pipe."""

import ast
from pathlib import Path

import pytest

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
                   and m not in ("datapipes", "datapipes.errors", "datapipes._checks"))
    assert above == [], f"{base} imports layers above the engine: {above}"


def test_no_module_imports_the_optional_ray_bridge():
    # datapipes.ray needs the [ray] extra: the rest of the package must import without Ray
    graph, lazy = _imports()
    assert [m for m, targets in graph.items() if "datapipes.ray" in targets] == []
    assert [x for x in lazy if "datapipes.ray" in x[2]] == []

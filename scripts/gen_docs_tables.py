"""Write the table "What each stage saves" of docs/howto/checkpoint.rst from the pipe classes.

Each pipe class of ``datapipes.iter`` and ``datapipes.map`` (those ``functional_datapipe`` registers,
and the public ones it does not, such as ``IterableWrapper``) declares in its own body what a pass's
state holds for it, as the class attribute ``_saves``, so that adding a pipe never means editing the
page:

- a string: one row, a short reST phrase (what the state holds, and its cost). The row is named by
  the class's functional name (``map``; ``shuffle (map-style)`` for a map-style method whose name
  the iterable-style pipes also have), or by the class name where it has none;
- a dict from the stage as the table shows it (``"``map(fn, rng=...)`` (serial)"``) to its phrase,
  for a class whose state depends on its arguments;
- a phrase ``"same as NAME"``: the row of the stage ``NAME`` (a functional name or a class name),
  whose declaration is a string.

A stage with no position of its own declares that too: ``"nothing: at a boundary their position is
their source's"``, the phrase of the row it then joins (stages that declare the same phrase share one
row).

    python scripts/gen_docs_tables.py           # rewrite the table in the page
    python scripts/gen_docs_tables.py --check   # exit 1 if the page's table is not the generated one

``tests/test_docs_tables.py`` runs the check, and fails for a class that declares nothing.
"""

from __future__ import annotations

import pathlib
import re
import sys
import textwrap
from typing import Iterable

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the package of this checkout, when run as a script
    sys.path.insert(0, str(ROOT))

PAGE = ROOT / "docs" / "howto" / "checkpoint.rst"
COMMAND = "python scripts/gen_docs_tables.py"
START = ".. saves-table: generated from the pipe classes' _saves by scripts/gen_docs_tables.py; edit those, then run it"
END = ".. end of saves-table"
SAME = "same as "
#: the phrase of the stages whose position is their source's (one row for them all)
NOTHING = "nothing: at a boundary their position is their source's"
#: the last row: stages written outside datapipes declare nothing here
OWN_STAGE = ("your own stage", "its iterator's ``state_dict()``; nothing for one declared stateless; ``TypeError`` "
             "otherwise (see below)")
WIDTH = 100


def stage_classes() -> list[tuple[type, list[str]]]:
    """Every pipe class of datapipes.iter and datapipes.map with the stage names the table gives it,
    in a stable order: the registered ones first (by functional name), then the public others."""
    import datapipes.iter
    import datapipes.map
    from datapipes import IterDataPipe, MapDataPipe

    def ours(cls: type) -> bool:
        return cls.__module__.startswith(("datapipes.iter.", "datapipes.map."))

    names: dict[type, list[str]] = {}
    for base in (IterDataPipe, MapDataPipe):
        for name, cls in sorted(base._functions.items()):
            if ours(cls):
                twice = base is MapDataPipe and name in IterDataPipe._functions
                names.setdefault(cls, []).append(f"``{name}`` (map-style)" if twice else f"``{name}``")
    for module in (datapipes.iter, datapipes.map):
        for public in module.__all__:
            cls = getattr(module, public)
            if isinstance(cls, type) and issubclass(cls, (IterDataPipe, MapDataPipe)) and ours(cls):
                names.setdefault(cls, [f"``{cls.__name__}``"])
    return list(names.items())


def _where(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _undeclared(cls: type, names: list[str]) -> str:
    return (
        f"{_where(cls)} ({', '.join(names)}) does not say what a pass's state holds for it: give the class a "
        f"_saves attribute, a short reST phrase for the table of docs/howto/checkpoint.rst (what the state holds "
        f"and its cost; for a stage with no position of its own, \"{NOTHING}\"; \"same as NAME\" to share the "
        f"row of stage NAME), then run {COMMAND} (docs/howto/custom_pipe.rst)"
    )


def problems(classes: Iterable[tuple[type, list[str]]] | None = None) -> list[str]:
    """What is wrong with the declarations: a class that declares nothing, or one that is malformed."""
    classes = stage_classes() if classes is None else list(classes)
    found = []
    for cls, names in classes:
        if "_saves" not in vars(cls):
            found.append(_undeclared(cls, names))
            continue
        saves = vars(cls)["_saves"]
        texts = [saves] if isinstance(saves, str) else list(saves.values()) if isinstance(saves, dict) else [None]
        if not all(isinstance(t, str) and t.strip() for t in texts) or (
                isinstance(saves, dict) and not all(isinstance(k, str) and k.strip() for k in saves)):
            found.append(f"{_where(cls)}._saves must be a non-empty string or a dict of them, got {saves!r}")
    if not found:
        try:
            rows(classes)
        except ValueError as e:
            found.append(str(e))
    return found


def _entries(classes: list[tuple[type, list[str]]]) -> list[tuple[str, str, type]]:
    """(stage cell, phrase, class) for every stage, ``same as`` not resolved yet."""
    out = []
    for cls, names in classes:
        if "_saves" not in vars(cls):
            raise ValueError(_undeclared(cls, names))
        saves = vars(cls)["_saves"]
        items = [(name, saves) for name in names] if isinstance(saves, str) else list(saves.items())
        out += [(cell, " ".join(text.split()), cls) for cell, text in items]
    return out


def rows(classes: list[tuple[type, list[str]]] | None = None) -> list[tuple[list[str], str]]:
    """The table's rows, (stage cells, phrase): one per phrase, in the order of their first cell."""
    from datapipes import IterDataPipe, MapDataPipe

    classes = stage_classes() if classes is None else classes
    by_name = {cls.__name__: cls for cls, _ in classes}
    by_name.update(MapDataPipe._functions)
    by_name.update(IterDataPipe._functions)  # a name on both kinds: the iterable-style stage
    grouped: dict[str, list[str]] = {}
    for cell, text, cls in _entries(classes):
        if text.startswith(SAME):
            name = text[len(SAME):].strip()
            target = by_name.get(name)
            shared = vars(target).get("_saves") if target is not None else None
            if not isinstance(shared, str) or shared.startswith(SAME):
                raise ValueError(
                    f"{_where(cls)}._saves says {text!r}, but {name!r} is no stage of datapipes.iter or datapipes.map "
                    f"whose _saves is a phrase of its own (a string, not a dict nor another 'same as')"
                )
            text = " ".join(shared.split())
        grouped.setdefault(text, []).append(cell)

    def key(cell: str) -> str:
        return cell.replace("`", "").casefold()

    table = [(sorted(cells, key=key), text) for text, cells in grouped.items()]
    return sorted(table, key=lambda row: key(row[0][0]))


def table(classes: list[tuple[type, list[str]]] | None = None) -> str:
    """The table, as the reST the page holds between its markers."""
    lines = [".. list-table::", "   :header-rows: 1", "   :widths: 30 70", ""]

    def cell(first: str, text: str) -> list[str]:
        return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=" " * len(first),
                             break_long_words=False, break_on_hyphens=False)

    for cells, text in [(["stage"], "state (and its cost)"), *rows(classes), ([OWN_STAGE[0]], OWN_STAGE[1])]:
        lines += cell("   * - ", ", ".join(cells)) + cell("     - ", text)
    return "\n".join(lines) + "\n"


def page(text: str | None = None, classes: list[tuple[type, list[str]]] | None = None) -> str:
    """The page ``text`` (by default the checkout's) with the generated table between its markers."""
    text = PAGE.read_text(encoding="utf-8") if text is None else text
    match = re.search(rf"^{re.escape(START)}\n\n(.*?)\n{re.escape(END)}$", text, re.M | re.S)
    if match is None:
        raise ValueError(f"{PAGE.relative_to(ROOT)} lacks the lines {START!r} and {END!r} around the table")
    return text[: match.start(1)] + table(classes) + text[match.end(1):]


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print(__doc__, file=sys.stderr)
        return 2
    wrong = problems()
    if wrong:
        print("\n".join(wrong), file=sys.stderr)
        return 1
    current = PAGE.read_text(encoding="utf-8")
    new = page(current)
    if argv == ["--check"]:
        if new != current:
            print(f"{PAGE.relative_to(ROOT)}: the table of what each stage saves is out of date; run {COMMAND}",
                  file=sys.stderr)
            return 1
        return 0
    if new != current:
        PAGE.write_text(new, encoding="utf-8")
        print(f"rewrote the table in {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The names docs/migration.rst says are kept really are: every ``Class``/``functional`` pair it
lists imports from ``datapipes.iter`` and is registered under that functional name; and every public
name and functional name of torch's own ``torch.utils.data.datapipes`` exists here too (the
DataFrame capture pipes are out of scope).

The table under "Every name, at a glance" (one row per name torch and torchdata 0.9 export, with
its functional name and ours: ``same``, ``renamed: X`` or ``not provided``) is checked row by row:
a ``same`` row imports from ``datapipes.iter`` (``datapipes.map`` for the map-style table) and is
registered under its functional name, a ``renamed`` row's new name imports, a ``not provided`` row
is really absent (else the table is stale), and the table lists every name of torch's ``__all__``
and of torchdata 0.9's."""

import re
from pathlib import Path

import pytest
import torch.utils.data.datapipes.datapipe as torch_datapipe
import torch.utils.data.datapipes.iter as torch_iter
import torch.utils.data.datapipes.map as torch_map

import datapipes.iter as our_iter
import datapipes.map as our_map
from datapipes import IterDataPipe, MapDataPipe

MIGRATION = Path(__file__).resolve().parents[2] / "docs" / "migration.rst"


def _section(text, title):
    start = text.index(title + "\n")
    rest = text[start + len(title) + 1:]
    match = re.search(r"\n[^\n]+\n-{3,}\n", rest[rest.index("\n") + 1:])
    return rest if match is None else rest[:rest.index("\n") + 1 + match.start()]


def _pairs():
    text = MIGRATION.read_text()
    body = _section(text, "Names and parameters kept").split("on the map-style side")[0]
    body += _section(text, "torchdata 0.9's pipes").split("Where they differ")[0]
    return sorted(set(re.findall(r"``(\w+)``/``(\w+)``", body)))


PAIRS = _pairs()


def test_the_table_is_read():
    assert len(PAIRS) > 50 and ("IterKeyZipper", "zip_with_iter") in PAIRS and ("Mapper", "map") in PAIRS


@pytest.mark.parametrize("cls, name", PAIRS, ids=[f"{c}/{n}" for c, n in PAIRS])
def test_every_listed_pair_imports_and_is_registered(cls, name):
    klass = getattr(our_iter, cls, None) or getattr(our_map, cls)  # IterToMapConverter: map-side, as torchdata
    registered = IterDataPipe._functions.get(name)
    assert registered is not None, f"{name} is not a functional name"
    assert issubclass(registered, klass) or issubclass(klass, registered), (cls, registered)


def test_every_torch_name_exists_here():
    assert [n for n in torch_iter.__all__ if not hasattr(our_iter, n)] == []
    assert [n for n in torch_map.__all__ if not hasattr(our_map, n)] == []


def test_every_torch_functional_name_exists_here():
    dataframes = {n for n in torch_datapipe.IterDataPipe.functions if "dataframe" in n}
    missing = [n for n in torch_datapipe.IterDataPipe.functions if n not in IterDataPipe._functions]
    assert sorted(set(missing) - dataframes) == []
    assert [n for n in torch_datapipe.MapDataPipe.functions if n not in MapDataPipe._functions] == []


# --- "Every name, at a glance": the table of every name torch and torchdata 0.9 export ----------

TABLE_HEADING = "Every name, at a glance"
KINDS = {"iter": ("Iterable-style", our_iter, torch_iter), "map": ("Map-style", our_map, torch_map)}

# torchdata 0.9's ``__all__`` (pytorch/data, torchdata/datapipes/{iter,map}/__init__.py at
# bf9c53339c7e6a02a085dc9e2bc3e87f39305407 and 033b6a0f9fba9779757cf5d037b6fc2a56286376); torchdata
# is frozen (0.10 removed datapipes), so the lists are too.
TORCHDATA = {
    "iter": """AISFileLister AISFileLoader BatchAsyncMapper BatchMapper Batcher BucketBatcher
        Bz2FileLoader CSVDictParser CSVParser Collator Concater Cycler DataFrameMaker Decompressor
        Demultiplexer Dropper EndOnDiskCacheHolder Enumerator Extractor FSSpecFileLister
        FSSpecFileOpener FSSpecSaver FileLister FileOpener Filter FlatMapper Flattener Forker FullSync
        GDriveReader Grouper HashChecker Header HttpReader HuggingFaceHubReader InBatchShuffler
        InMemoryCacheHolder IndexAdder IoPathFileLister IoPathFileOpener IoPathSaver IterDataPipe
        IterKeyZipper IterableWrapper JsonParser LengthSetter LineReader MapKeyZipper
        MapToIterConverter Mapper MaxTokenBucketizer Multiplexer MultiplexerLongest OnDiskCacheHolder
        OnlineReader ParagraphAggregator ParquetDataFrameLoader PinMemory Prefetcher RandomSplitter
        RarArchiveLoader Repeater RoundRobinDemultiplexer RoutedDecoder Rows2Columnar S3FileLister
        S3FileLoader SampleMultiplexer Sampler Saver ShardExpander ShardingFilter
        ShardingRoundRobinDispatcher ShuffledFlatMapper Shuffler Slicer StreamReader TFRecordLoader
        TarArchiveLoader ThreadPoolMapper UnBatcher UnZipper WebDataset XzFileLoader ZipArchiveLoader
        Zipper ZipperLongest""".split(),
    "map": """Batcher Concater InMemoryCacheHolder IterToMapConverter MapDataPipe Mapper SequenceWrapper
        Shuffler UnZipper Zipper""".split(),
}
STATUS = re.compile(r"same|renamed: `*(\w+)`*|not provided")


def _list_table(text):
    """The rows of the first ``list-table`` in ``text``, as lists of cell texts (header row dropped)."""
    rows, start = [], text.find(".. list-table::")
    if start < 0:
        return rows
    for line in text[start:].splitlines()[1:]:
        row = re.match(r"\s+\* -\s?(.*)$", line)
        cell = re.match(r"\s+- ?(.*)$", line)
        if row:
            rows.append([row.group(1)])
        elif cell and rows:
            rows[-1].append(cell.group(1))
        elif line.strip() and rows:
            if not line.startswith(" "):
                break  # the text after the table
            rows[-1][-1] += " " + line.strip()
    return rows[1:]


def _read_table():
    """{kind: {name: (functional name or None, status, notes)}}, or the reason it cannot be read."""
    text = MIGRATION.read_text()
    if f"\n{TABLE_HEADING}\n" not in text:
        return None, f"docs/migration.rst has no section {TABLE_HEADING!r} (the table of every name)"
    body = _section(text, TABLE_HEADING)
    table = {}
    for kind, (title, _, _) in KINDS.items():
        match = re.search(rf"\n{re.escape(title)}\n~{{3,}}\n", body)
        if match is None:
            return None, f"docs/migration.rst: {TABLE_HEADING!r} has no subsection {title!r}"
        rows = _list_table(body[match.end():])
        if not rows:
            return None, f"docs/migration.rst: no list-table under {TABLE_HEADING!r} / {title!r}"
        table[kind] = {}
        for cells in rows:
            name = re.search(r"``(\w+)``", cells[0])
            if len(cells) != 4 or name is None:
                return None, f"docs/migration.rst: {title} row {cells} is not ``Name``, functional, status, notes"
            functional = re.search(r"``(\w+)``", cells[1])
            table[kind][name.group(1)] = (functional and functional.group(1), cells[2].strip(), cells[3].strip())
    return table, None


TABLE, TABLE_MISSING = _read_table()


def _rows(status):
    if TABLE is None:
        return [pytest.param(None, None, None, id="table-missing")]
    return [
        pytest.param(kind, name, functional, id=f"{kind}/{name}")
        for kind, rows in TABLE.items()
        for name, (functional, st, _) in rows.items()
        if STATUS.fullmatch(st) and st.split(":")[0] == status
    ]


def _statuses():
    return [(k, n, st) for k, rows in TABLE.items() for n, (_, st, _) in rows.items()]


def _need_table():
    if TABLE is None:
        pytest.fail(TABLE_MISSING)


def _related(registered, klass):
    return isinstance(registered, type) and (issubclass(registered, klass) or issubclass(klass, registered))


def test_the_name_table_is_read():
    _need_table()
    assert len(TABLE["iter"]) > 80 and len(TABLE["map"]) >= 6
    assert TABLE["iter"]["Mapper"][:2] == ("map", "same") and TABLE["map"]["SequenceWrapper"][:2] == (None, "same")
    bad = [(k, n, st) for k, n, st in _statuses() if not STATUS.fullmatch(st)]
    assert bad == [], "the datapipes column is one of: same, renamed: <Name>, not provided"


@pytest.mark.parametrize("kind, name, functional", _rows("same"))
def test_every_same_row_imports_and_is_registered(kind, name, functional):
    _need_table()
    ours = KINDS[kind][1]
    klass = getattr(ours, name, None)
    assert klass is not None, f"the table says {name} is the same, but {ours.__name__} has no {name}"
    if functional is not None:
        # a converter is registered on the other kind: to_iter_datapipe on MapDataPipe, to_map_datapipe
        # on IterDataPipe
        registered = [IterDataPipe._functions.get(functional), MapDataPipe._functions.get(functional)]
        assert any(_related(r, klass) for r in registered), f"{functional} is not registered for {name}: {registered}"


def test_every_renamed_row_imports_under_its_new_name():
    _need_table()
    renamed = [(k, n, STATUS.fullmatch(st).group(1)) for k, n, st in _statuses() if st.startswith("renamed")]
    missing = [(n, new) for k, n, new in renamed if not hasattr(KINDS[k][1], new)]
    assert missing == [], f"renamed to names that datapipes lacks: {missing}"


@pytest.mark.parametrize("kind, name, functional", _rows("not provided"))
def test_every_row_not_provided_is_absent_and_says_why(kind, name, functional):
    _need_table()
    ours = KINDS[kind][1]
    assert not hasattr(ours, name), f"{ours.__name__} has {name} now: mark it same in the table"
    if functional is not None:
        assert functional not in IterDataPipe._functions and functional not in MapDataPipe._functions, functional
    assert TABLE[kind][name][2], f"the row of {name} (not provided) should say why and what to use instead"


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_table_lists_every_name_of_torch_and_torchdata_and_no_other(kind):
    _need_table()
    listed = set(TABLE[kind])
    torch_names = set(KINDS[kind][2].__all__)
    assert sorted(torch_names - listed) == [], f"names of torch's {kind} __all__ missing from the table"
    assert sorted(set(TORCHDATA[kind]) - listed) == [], f"names of torchdata 0.9's {kind} missing from the table"
    assert sorted(listed - torch_names - set(TORCHDATA[kind])) == []


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_the_table_gives_torchs_functional_names(kind):
    _need_table()
    registry = torch_datapipe.IterDataPipe.functions if kind == "iter" else torch_datapipe.MapDataPipe.functions
    theirs = {f.args[0]: name for name, f in registry.items()}
    module = KINDS[kind][2]
    listed = [n for n in module.__all__ if n in TABLE[kind]]  # a missing name fails the test above
    expected = {n: theirs.get(getattr(module, n)) for n in listed}
    assert {n: TABLE[kind][n][0] for n in listed} == expected

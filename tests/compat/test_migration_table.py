"""The names docs/migration.rst says are kept really are: every ``Class``/``functional`` pair it
lists imports from ``datapipes.iter`` and is registered under that functional name; and every public
name and functional name of torch's own ``torch.utils.data.datapipes`` exists here too (the
DataFrame capture pipes are out of scope)."""

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

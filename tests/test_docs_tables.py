"""The table "What each stage saves" of docs/howto/checkpoint.rst is generated from the pipe classes'
``_saves`` (scripts/gen_docs_tables.py), so adding a pipe means writing the pipe, its declaration and
its tests, never the page: this fails when a class declares nothing or the page is out of date."""

import importlib.util
import pathlib

import pytest

from datapipes import IterDataPipe

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_docs_tables", ROOT / "scripts" / "gen_docs_tables.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_stage_declares_what_it_saves(gen):
    classes = gen.stage_classes()
    assert len(classes) > 80
    wrong = gen.problems(classes)
    assert not wrong, "\n".join(wrong)


def test_the_page_holds_the_generated_table(gen):
    current = gen.PAGE.read_text(encoding="utf-8")
    assert gen.page(current) == current, (
        f"docs/howto/checkpoint.rst: the table of what each stage saves differs from the pipe classes' "
        f"_saves; run {gen.COMMAND}"
    )


class _Silent(IterDataPipe):
    """A stage that declares nothing (not registered: the registry stays as it was)."""

    def __iter__(self):
        return iter(())


class _Shares(IterDataPipe):
    _saves = "same as no_such_stage"


def test_an_undeclared_or_dangling_declaration_is_named(gen):
    (silent,) = gen.problems([(_Silent, ["``silent``"])])
    assert f"{__name__}._Silent (``silent``)" in silent and "_saves" in silent
    assert gen.NOTHING in silent and gen.COMMAND in silent
    (dangling,) = gen.problems([(_Shares, ["``shares``"])])
    assert "_Shares._saves says 'same as no_such_stage'" in dangling


def test_stages_with_one_phrase_share_a_row(gen):
    table = gen.table()
    assert table.count(gen.NOTHING) == 1
    assert "``load_from_tar``, ``load_from_tfrecord``" in table
    assert table.rstrip().endswith("(see below)")  # your own stage, last

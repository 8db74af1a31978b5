"""torchdata's text stages (datapipes/iter/text.py): ParagraphAggregator [lines_to_paragraphs] and
ShardExpander [shard_expand]."""

import pickle

import pytest

from datapipes.iter import IterableWrapper
from datapipes.testing import check_datapipe, check_resume

EVERY_K = lambda n: range(n + 1)  # noqa: E731 - check_resume's ks: stop after every number of items


class Boom(Exception):
    pass


def notes(e):
    return "\n".join(getattr(e, "__notes__", []))


# -- ParagraphAggregator ---------------------------------------------------------------------------

LINES = [("f1", "Line1"), ("f1", "Line2"), ("f2", "Line2,1"), ("f2", "Line2,2"), ("f2", "Line2,3"),
         ("f2", ""), ("f2", "p2"), ("f3", ""), ("f3", ""), ("f3", "a"), ("f4", "b")]


class TestParagraphAggregator:
    def test_torchdata_example(self):
        source = IterableWrapper(LINES[:5])
        assert list(source.lines_to_paragraphs(joiner=lambda ls: " ".join(ls))) == \
            [("f1", "Line1 Line2"), ("f2", "Line2,1 Line2,2 Line2,3")]

    def test_empty_lines_and_files_end_paragraphs(self):
        assert list(IterableWrapper(LINES).lines_to_paragraphs()) == [
            ("f1", "Line1\nLine2"), ("f2", "Line2,1\nLine2,2\nLine2,3"), ("f2", "p2"), ("f3", "a"), ("f4", "b")]
        assert list(IterableWrapper([]).lines_to_paragraphs()) == []
        assert list(IterableWrapper([("f", "")]).lines_to_paragraphs()) == []

    def test_len_is_unknown(self):
        with pytest.raises(TypeError, match="ParagraphAggregator.*no len"):
            len(IterableWrapper(LINES).lines_to_paragraphs())

    def test_contract_and_resume(self):
        check_datapipe(IterableWrapper(LINES).lines_to_paragraphs(), build=lambda src: src.map(
            lambda x: ("f", str(x))).lines_to_paragraphs())
        check_resume(lambda: IterableWrapper(LINES).lines_to_paragraphs(joiner=tuple), EVERY_K)

    def test_errors(self):
        with pytest.raises(ValueError) as info:
            list(IterableWrapper([("f", "a"), ("f", "b", "c")]).lines_to_paragraphs())
        assert "item 1" in notes(info.value) and "(file name, line) pair" in notes(info.value)

        def joiner(lines):
            raise Boom(lines)

        with pytest.raises(Boom) as info:
            list(IterableWrapper(LINES).lines_to_paragraphs(joiner=joiner))
        assert "ParagraphAggregator(joiner)" in notes(info.value)
        with pytest.raises(TypeError, match="ParagraphAggregator: joiner must be callable"):
            IterableWrapper(LINES).lines_to_paragraphs(joiner="\n")

    def test_pickles(self):
        pipe = IterableWrapper(LINES).lines_to_paragraphs(joiner=lambda ls: "|".join(ls))
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)


# -- ShardExpander ---------------------------------------------------------------------------------


class TestShardExpander:
    def test_torchdata_examples(self):
        assert list(IterableWrapper(["ds-{00..05}.tar"]).shard_expand()) == [
            "ds-00.tar", "ds-01.tar", "ds-02.tar", "ds-03.tar", "ds-04.tar", "ds-05.tar"]
        assert list(IterableWrapper(["imgs_{00..02}.tar", "labels_{00..02}.tar"]).shard_expand()) == [
            "imgs_00.tar", "imgs_01.tar", "imgs_02.tar", "labels_00.tar", "labels_01.tar", "labels_02.tar"]

    def test_padding_nesting_and_plain_names(self):
        assert list(IterableWrapper(["data-{000..009}.tar"]).shard_expand())[::9] == ["data-000.tar", "data-009.tar"]
        assert list(IterableWrapper(["a{8..11}"]).shard_expand()) == ["a8", "a9", "a10", "a11"]
        assert list(IterableWrapper(["a{0..10}"]).shard_expand())[-2:] == ["a9", "a10"]
        assert list(IterableWrapper(["{1..2}{0..1}x"]).shard_expand()) == ["10x", "11x", "20x", "21x"]
        assert list(IterableWrapper(["plain.tar", "{a..b}", "{1.2}"]).shard_expand()) == ["plain.tar", "{a..b}", "{1.2}"]
        assert len(list(IterableWrapper(["imagenet-{000000..001199}.tar"]).shard_expand())) == 1200

    @pytest.mark.parametrize("spec, phrase", [
        ("x{5..3}", "shard_expand: bad range in in shard spec x{5..3}."),
        ("x{3..3}", "shard_expand: bad range in in shard spec x{3..3}."),
        ("{0..1}-{3..3}.a", "shard_expand: bad range in in shard spec -{3..3}.a."),  # the rest, as torchdata
        ("x{01..100}", "shard_expand: low bound must not start with 0 if low bound is shorter"),
        ("x{100..99}", "shard_expand: low bound must be shorter than high bound"),
    ])
    def test_bad_ranges(self, spec, phrase):  # torchdata's phrases, after the stage, position and item
        with pytest.raises(ValueError) as info:
            list(IterableWrapper(["ok", spec]).shard_expand())
        assert str(info.value).startswith(f"ShardExpander: item 1 {spec!r}")
        assert str(info.value).endswith(phrase)

    def test_not_a_string(self):
        with pytest.raises(TypeError) as info:
            list(IterableWrapper(["a{1..2}", 7]).shard_expand())
        assert "ShardExpander" in notes(info.value) and "item 1" in notes(info.value)

    def test_len_is_unknown(self):
        with pytest.raises(TypeError, match="ShardExpander.*no len"):
            len(IterableWrapper(["a"]).shard_expand())

    def test_contract_and_resume(self):
        specs = ["s{0..3}", "plain", "t{00..02}-{1..2}"]
        check_datapipe(IterableWrapper(specs).shard_expand(), build=lambda src: src.map(lambda i: f"x{{0..{i + 1}}}")
                       .shard_expand())
        check_resume(lambda: IterableWrapper(specs).shard_expand(), EVERY_K)

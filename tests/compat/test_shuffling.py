"""torchdata's shuffling stages (datapipes/iter/shuffling.py): InBatchShuffler [in_batch_shuffle] and
ShuffledFlatMapper [shuffled_flatmap].

Where torchdata's output depends on its algorithm (the draws of ``shuffled_flatmap``), a small reference
written from torchdata's documented behaviour runs beside ours with the same generator."""

import pickle
import random

import pytest

from datapipes import DataChunk, graph_settings
from datapipes.iter import InBatchShuffler, IterableWrapper, ShuffledFlatMapper
from datapipes.testing import check_datapipe, check_resume

EVERY_K = lambda n: range(n + 1)  # noqa: E731 - check_resume's ks: stop after every number of items


class Boom(Exception):
    pass


def notes(e):
    return "\n".join(getattr(e, "__notes__", []))


# -- InBatchShuffler -------------------------------------------------------------------------------


class TestInBatchShuffler:
    def test_each_batch_is_a_permutation_and_batches_keep_their_order(self):
        out = list(IterableWrapper(range(40)).batch(8).in_batch_shuffle())
        assert [sorted(b) for b in out] == [list(range(i, i + 8)) for i in range(0, 40, 8)]
        assert all(type(b) is DataChunk for b in out)  # as torchdata

    def test_draws_are_random_sample_of_the_pass_generator(self, monkeypatch):
        monkeypatch.setattr(InBatchShuffler, "_pass_seed", lambda self: 1234)
        batches = [list(range(i, i + 5)) for i in range(0, 30, 5)] + [("a", "b", "c")]
        rng = random.Random(1234)
        assert list(InBatchShuffler(IterableWrapper(batches))) == [rng.sample(b, len(b)) for b in batches]

    def test_seed_and_epochs(self):
        pipe = IterableWrapper(range(60)).batch(10).in_batch_shuffle().set_seed(5)
        first = list(pipe)
        assert list(pipe) == first
        assert list(IterableWrapper(range(60)).batch(10).in_batch_shuffle().set_seed(5)) == first
        assert list(pipe.set_epoch(1)) != first

    def test_set_shuffle_and_graph_settings(self):
        pipe = IterableWrapper(range(9)).batch(3).in_batch_shuffle()
        pipe.set_shuffle(False)
        assert list(pipe) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        graph_settings.apply_shuffle_settings(pipe, shuffle=True)
        assert pipe._enabled
        graph_settings.apply_shuffle_settings(pipe, shuffle=False)
        assert list(pipe) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
        check_resume(lambda: IterableWrapper(range(9)).batch(3).in_batch_shuffle().set_shuffle(False))

    def test_len_is_the_sources(self):
        assert len(IterableWrapper(range(10)).batch(3).in_batch_shuffle()) == 4
        with pytest.raises(TypeError, match="IterableWrapper"):
            len(IterableWrapper(iter([[1]])).in_batch_shuffle())

    def test_contract(self):
        pipe = IterableWrapper(range(20)).batch(4).in_batch_shuffle().set_seed(1)
        check_datapipe(pipe, build=lambda src: src.batch(2).in_batch_shuffle())
        # unseeded: the batches differ from pass to pass, their items do not
        out = check_datapipe(IterableWrapper(range(20)).batch(4).in_batch_shuffle().map(sorted))
        assert out == [list(range(i, i + 4)) for i in range(0, 20, 4)]

    def test_resume(self):
        check_resume(lambda: IterableWrapper(range(30)).batch(4).in_batch_shuffle().set_seed(2), EVERY_K)
        check_resume(lambda: IterableWrapper(range(30)).batch(4).in_batch_shuffle().set_seed(2), [3], through="torch")

    def test_unseeded_resume_goes_on_with_the_saved_pass(self):
        pipe = IterableWrapper(range(40)).batch(5).in_batch_shuffle()
        it = iter(pipe)
        head = [next(it) for _ in range(3)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        rest = list(it)
        again = iter(IterableWrapper(range(40)).batch(5).in_batch_shuffle())
        again.load_state_dict(state)
        assert list(again) == rest and len(head) == 3

    def test_a_batch_that_is_not_a_sequence(self):
        pipe = IterableWrapper([[1, 2], {3, 4}]).in_batch_shuffle()
        with pytest.raises(TypeError) as info:
            list(pipe)
        assert "InBatchShuffler" in notes(info.value) and "batch 1" in notes(info.value)

    def test_arguments(self):
        with pytest.raises(TypeError, match="InBatchShuffler: datapipe must be an IterDataPipe"):
            InBatchShuffler([[1, 2]])

    def test_pickles(self):
        pipe = IterableWrapper(range(8)).map(lambda x: x + 1).batch(4).in_batch_shuffle().set_seed(0)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)


# -- ShuffledFlatMapper ----------------------------------------------------------------------------


def reference_shuffled_flatmap(items, size, rng, fn=lambda x: x):
    """torchdata's documented draws: an index first; while the buffer is full, the next element of the
    chosen iterable, then a new index (an exhausted iterable leaves without a new draw); once the
    source is done, an index among the iterables left before each element."""
    buf, out = [], []
    idx = rng.randint(0, size - 1)
    for x in items:
        while len(buf) == size:
            try:
                out.append(next(buf[idx]))
            except StopIteration:
                del buf[idx]
                continue
            idx = rng.randint(0, size - 1)
        buf.append(iter(fn(x)))
    while buf:
        idx = rng.randint(0, len(buf) - 1)
        try:
            out.append(next(buf[idx]))
        except StopIteration:
            del buf[idx]
    return out


def ragged(n, seed=0):
    rng = random.Random(seed)
    return [[f"{i}.{j}" for j in range(rng.randint(0, 5))] for i in range(n)]


def gen_of(item):
    yield from item


class TestShuffledFlatMapper:
    @pytest.mark.parametrize("size", [1, 2, 3, 7, 100])
    def test_draws_are_torchdatas(self, monkeypatch, size):
        monkeypatch.setattr(ShuffledFlatMapper, "_pass_seed", lambda self: 99)
        items = ragged(30)
        assert list(IterableWrapper(items).shuffled_flatmap(buffer_size=size)) == \
            reference_shuffled_flatmap(items, size, random.Random(99))
        assert list(IterableWrapper(items).shuffled_flatmap(gen_of, buffer_size=size)) == \
            reference_shuffled_flatmap(items, size, random.Random(99))

    def test_every_element_once_each_iterable_in_order(self):
        items = ragged(50, seed=3)
        out = list(IterableWrapper(items).shuffled_flatmap(buffer_size=5))
        assert sorted(out) == sorted(x for item in items for x in item)
        for item in items:
            assert [x for x in out if x in item] == item

    def test_torchdata_example(self):
        source = IterableWrapper([[1, 2, 3, 4], "abcd", "ABCD"])
        out = list(source.shuffled_flatmap(buffer_size=2))
        assert sorted(map(str, out)) == sorted("1234abcdABCD")

    def test_fn_and_columns(self):
        pairs = [(i, "xy" * i) for i in range(4)]
        off = IterableWrapper(pairs).shuffled_flatmap(str.upper, input_col=1).set_shuffle(False)
        assert list(off) == list("XYXYXYXYXYXY")
        assert list(IterableWrapper(pairs).shuffled_flatmap(input_col=1).set_shuffle(False)) == list("xy" * 6)
        two = IterableWrapper([(1, 2, 3)]).shuffled_flatmap(input_col=[0, 2]).set_shuffle(False)
        assert list(two) == [1, 3]  # torchdata: several columns with fn=None flatten as their tuple
        add = IterableWrapper([(1, 2), (3, 4)]).shuffled_flatmap(lambda a, b: [a, b], input_col=[0, 1])
        assert sorted(add) == [1, 2, 3, 4]

    def test_set_shuffle_off_is_flatmap(self):
        items = ragged(20)
        assert list(IterableWrapper(items).shuffled_flatmap().set_shuffle(False)) == [x for i in items for x in i]
        check_resume(lambda: IterableWrapper(items).shuffled_flatmap(gen_of).set_shuffle(False), EVERY_K)

    def test_seed_and_epochs(self):
        build = lambda: IterableWrapper(ragged(40)).shuffled_flatmap(buffer_size=4).set_seed(1)  # noqa: E731
        first = list(build())
        assert list(build()) == first
        assert list(build().set_epoch(2)) != first

    def test_len(self):
        assert len(IterableWrapper([[1, 2], "abc", ()]).shuffled_flatmap()) == 5
        with pytest.raises(TypeError, match="ShuffledFlatMapper.*relies on the output of its function"):
            len(IterableWrapper([[1]]).shuffled_flatmap(list))
        with pytest.raises(TypeError, match="ShuffledFlatMapper.*no len"):
            len(IterableWrapper([gen_of([1])]).shuffled_flatmap())

    def test_len_during_a_pass_leaves_the_pass_alone(self):
        build = lambda: IterableWrapper(ragged(30)).shuffled_flatmap(buffer_size=3).set_seed(4)  # noqa: E731
        full = list(build())
        pipe = build()
        it = iter(pipe)
        head = [next(it) for _ in range(10)]
        assert len(pipe) == len(full)
        state = it.state_dict()
        again = iter(build())
        again.load_state_dict(state)
        assert head + list(again) == full

    def test_contract(self):
        check_datapipe(IterableWrapper(ragged(25)).shuffled_flatmap(buffer_size=3).set_seed(0),
                       build=lambda src: src.shuffled_flatmap(lambda x: [x, x]))
        check_datapipe(IterableWrapper(ragged(25)).shuffled_flatmap(gen_of, buffer_size=3))

    @pytest.mark.parametrize("fn", [None, gen_of, tuple])
    def test_resume(self, fn):
        check_resume(lambda: IterableWrapper(ragged(12)).shuffled_flatmap(fn, buffer_size=3).set_seed(6), EVERY_K)

    def test_resume_through_torch_and_before_the_first_item_unseeded(self):
        check_resume(lambda: IterableWrapper(ragged(12)).shuffled_flatmap(gen_of).set_seed(6), [9], through="torch")
        pipe = IterableWrapper(ragged(20)).shuffled_flatmap(buffer_size=4)  # unseeded: its own draw each pass
        it = iter(pipe)
        state = it.state_dict()
        full = list(it)
        again = iter(pipe)
        again.load_state_dict(state)
        assert list(again) == full

    def test_errors_of_fn_name_the_item(self):
        def bad(x):
            if x == 3:
                raise Boom(x)
            return [x]

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(6)).shuffled_flatmap(bad, buffer_size=2))
        assert "ShuffledFlatMapper(" in notes(info.value) and "item 3" in notes(info.value)

        def late(x):
            yield x
            if x == 2:
                raise Boom(x)

        with pytest.raises(Boom) as info:
            list(IterableWrapper(range(6)).shuffled_flatmap(late, buffer_size=2))
        assert "item 2" in notes(info.value)

    def test_arguments(self):
        with pytest.raises(ValueError, match=r"^ShuffledFlatMapper\(buffer_size=0\): buffer_size should be larger than 0$"):
            IterableWrapper([]).shuffled_flatmap(buffer_size=0)
        with pytest.raises(TypeError, match="ShuffledFlatMapper: fn must be callable"):
            IterableWrapper([]).shuffled_flatmap(3)
        with pytest.raises(ValueError, match="ShuffledFlatMapper: The function"):
            IterableWrapper([]).shuffled_flatmap(lambda a, b: [a], input_col=0)

    def test_pickles(self):
        pipe = IterableWrapper(ragged(10)).shuffled_flatmap(lambda x: x[::-1], buffer_size=3).set_seed(2)
        assert list(pickle.loads(pickle.dumps(pipe))) == list(pipe)

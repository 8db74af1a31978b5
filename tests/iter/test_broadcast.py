"""Forker and Demultiplexer (datapipes/iter/broadcast/); and that every stage of concat, zip, mux, fork and
demux builds its pass at ``iter()``."""

import contextlib
import copy
import gc
import inspect
import operator
import pickle
import threading
import warnings

import numpy as np
import pytest

from datapipes._runtime import passes as _pass
from datapipes.datapipe import IterDataPipe
from datapipes.graph import traverse
from datapipes.iter import Concater, Demultiplexer, Forker, IterableWrapper, Multiplexer, Zipper
from datapipes.iter.broadcast.demux import DemultiplexerChild
from datapipes.iter.broadcast.fork import ForkerChild
from datapipes.testing import check_datapipe


class Boom(Exception):
    pass


class Counting:
    """A re-iterable source that counts its passes and notices when a pass's iterator is closed."""

    def __init__(self, items):
        self.items = list(items)
        self.passes = 0
        self.closed = 0

    def __iter__(self):
        self.passes += 1
        try:
            yield from self.items
        finally:
            self.closed += 1


def failing_source(items, error):
    class Source:
        def __iter__(self):
            yield from items
            raise error

    return IterableWrapper(Source())


@contextlib.contextmanager
def no_warnings():
    """Turn every warning into an error inside the block."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        yield


# -- Forker -----------------------------------------------------------------------------------------


class TestForker:
    def test_returns_children(self):
        children = IterableWrapper(range(3)).fork(3)
        assert isinstance(children, list) and len(children) == 3
        assert all(isinstance(c, ForkerChild) and isinstance(c, IterDataPipe) for c in children)
        assert [c.instance_id for c in children] == [0, 1, 2]
        assert isinstance(Forker(IterableWrapper([1]), 2), list)
        source = IterableWrapper([1, 2])
        assert source.fork(1) is source and Forker(source, 1) is source  # as torch: the source itself

    def test_method_signature_and_keywords(self):
        params = list(inspect.signature(IterDataPipe.fork).parameters)
        assert params == ["self", "num_instances", "buffer_size", "copy"]
        a, b = IterableWrapper(range(3)).fork(num_instances=2, buffer_size=5, copy="shallow")
        assert a.buffer_size == 5 and a.num_instances == 2

    def test_contract_each_child(self):
        with no_warnings():
            a, b = IterableWrapper(range(6)).map(lambda x: x * 3).fork(2)
            check_datapipe(a, expected=[0, 3, 6, 9, 12, 15], build=lambda src: src.fork(2)[0])
            check_datapipe(b, expected=[0, 3, 6, 9, 12, 15], build=lambda src: src.fork(2)[1])

    def test_contract_children_together(self):
        with no_warnings():
            a, b = IterableWrapper(range(6)).fork(2, buffer_size=1)
            check_datapipe(a.zip(b), expected=[(i, i) for i in range(6)],
                           build=lambda src: Zipper(*src.fork(2, buffer_size=1)))
            a, b, c = IterableWrapper(range(4)).fork(3, buffer_size=1)
            check_datapipe(a.mux(b.map(lambda x: -x), c), expected=[0, 0, 0, 1, -1, 1, 2, -2, 2, 3, -3, 3],
                           build=lambda src: Multiplexer(*src.fork(3, buffer_size=1)))

    def test_a_closed_pass_of_the_children_does_not_hold_them(self):
        # the closed pass is still referenced (its iterator kept), its children suspended mid-pass: a new
        # pass starts without the "child started a new pass while ..." warning
        a, b, c = IterableWrapper(range(4)).fork(3, buffer_size=1)
        pipe = a.mux(b.map(operator.neg), c)
        it = iter(pipe)
        next(it)
        it.close()
        with no_warnings():
            assert list(pipe) == [0, 0, 0, 1, -1, 1, 2, -2, 2, 3, -3, 3]
        assert it is not None

    def test_one_child_fully_then_the_other(self):
        src = Counting(range(10))
        a, b = IterableWrapper(src).fork(2, buffer_size=10)
        assert list(a) == list(range(10))
        assert list(b) == list(range(10))
        assert src.passes == 1  # one shared upstream pass

    def test_interleaved_in_one_thread(self):
        src = Counting(range(7))
        a, b = IterableWrapper(src).fork(2, buffer_size=2)
        ia, ib = iter(a), iter(b)
        got_a, got_b = [next(ia), next(ia)], []  # a is 2 ahead
        got_b += [next(ib), next(ib), next(ib)]  # b is 1 ahead
        got_a += [next(ia), next(ia), next(ia)]
        got_b += list(ib)
        got_a += list(ia)
        assert got_a == got_b == list(range(7)) and src.passes == 1

    def test_overflow_error(self):
        a, b = IterableWrapper(range(10)).fork(2, buffer_size=3)
        ia = iter(a)
        assert [next(ia) for _ in range(3)] == [0, 1, 2]
        with pytest.raises(BufferError) as info:
            next(ia)
        msg = str(info.value)
        assert "Forker(num_instances=2, buffer_size=3)" in msg and "buffer_size=3" in msg
        assert "child 0 ran more than buffer_size=3 items ahead of child 1" in msg and "has not started" in msg
        assert msg.endswith(": ForkerIterDataPipe buffer overflow,buffer size 3 is insufficient.")  # torch's words
        # the item read at the overflow stayed for the sibling; a keeps its place past it (as in
        # torch), so b reads 3 items past that place and overflows in turn
        ib, got = iter(b), []
        with pytest.raises(BufferError, match="ahead of child 0, which stopped with a BufferError at item 3"):
            for x in ib:
                got.append(x)
        assert got == list(range(7))

    def test_overflow_names_a_lagging_started_child(self):
        a, b = IterableWrapper(range(10)).fork(2, buffer_size=2)
        ia, ib = iter(a), iter(b)
        next(ib)
        with pytest.raises(BufferError, match="ahead of child 1, which is at item 1"):
            for _ in range(4):
                next(ia)

    def test_torch_buffer_bound(self):
        # torch semantics: the leading child may be exactly buffer_size items ahead
        a, b = IterableWrapper(range(3)).fork(2, buffer_size=3)
        assert list(a) == [0, 1, 2] and list(b) == [0, 1, 2]

    def test_unbounded_buffer_warns(self):
        with pytest.warns(UserWarning, match=r"^Forker\(buffer_size=-1\): Unlimited buffer size is set for `fork`, please be aware of OOM at random places$") as record:
            a, b = IterableWrapper(range(5000)).fork(2, buffer_size=-1)
        assert record[0].filename == __file__  # attributed to the caller, not to datapipes' internals
        assert sum(a) == sum(b) == sum(range(5000))

    def test_buffer_stays_small_in_lockstep(self):
        a, b = IterableWrapper(range(1000)).fork(2)
        sizes = []
        for _ in zip(a, b):
            sizes.append(len(a._hub._pass.store))
        assert max(sizes) <= 33  # the lag (one item) plus at most 32 read by both, awaiting a trim

    def test_len(self):
        a, b = IterableWrapper(range(7)).fork(2)
        assert len(a) == len(b) == 7
        c, _ = IterableWrapper(range(7)).filter(bool).fork(2)
        with pytest.raises(TypeError, match="Filter"):
            len(c)

    def test_reiteration_one_child_alone_is_silent(self):
        src = Counting(range(4))
        a, b = IterableWrapper(src).fork(2)
        with no_warnings():
            assert list(a) == list(a) == [0, 1, 2, 3]
            assert list(b) == [0, 1, 2, 3]  # b joins a's latest pass
        assert src.passes == 2

    def test_new_pass_while_sibling_mid_pass_warns_and_invalidates(self):
        a, b = IterableWrapper(range(5)).fork(2)
        ia, ib = iter(a), iter(b)
        assert (next(ia), next(ib), next(ia)) == (0, 0, 1)
        ia2 = iter(a)
        with pytest.warns(UserWarning, match=r"child 0 started a new pass while child\(ren\) \[1\]") as record:
            assert next(ia2) == 0
        assert record[0].filename == __file__
        with pytest.raises(RuntimeError, match="child 0 started a new pass while this one was mid-pass"):
            next(ib)
        with pytest.raises(RuntimeError, match="invalidated"):
            next(ia)
        assert list(ia2) == [1, 2, 3, 4] and list(b) == [0, 1, 2, 3, 4]

    def test_iter_alone_does_not_join(self):
        a, b = IterableWrapper(range(3)).fork(2)
        unused = iter(a)  # never advanced: no pass, no buffer held for it
        with no_warnings():
            assert list(a) == [0, 1, 2] and list(b) == [0, 1, 2]
        del unused

    def test_all_children_closed_ends_the_pass(self):
        src = Counting(range(100))
        a, b = IterableWrapper(src).fork(2)
        ia, ib = iter(a), iter(b)
        next(ia), next(ib)
        ia.close()
        assert src.closed == 0  # b still reads this pass
        assert next(ib) == 1
        ib.close()
        assert src.closed == 1
        with no_warnings():
            assert list(a.zip(b)) == [(i, i) for i in range(100)]

    def test_discarded_child_holds_nothing_back(self):
        a = IterableWrapper(range(50)).fork(2, buffer_size=2)[0]  # child 1 is dropped at once
        assert list(a) == list(range(50)) and list(a) == list(range(50))
        a = IterableWrapper(range(50)).fork(3, buffer_size=2)[1]
        assert list(a) == list(range(50))
        a, b = IterableWrapper(range(50)).fork(2, buffer_size=2)
        with pytest.raises(BufferError):
            list(a)  # b still exists and may start: it holds the buffer

    def test_closed_child_holds_nothing_back(self):
        a, b = IterableWrapper(range(50)).fork(2, buffer_size=2)
        ib = iter(b)
        next(ib)
        ib.close()
        assert list(a) == list(range(50))  # b left: a is not bounded by it

    def test_source_error_reaches_every_child_as_same_object(self):
        error = Boom("source")
        a, b = failing_source([1, 2], error).fork(2)
        with pytest.raises(Boom) as ea:
            list(a)
        ib = iter(b)
        assert [next(ib), next(ib)] == [1, 2]
        with pytest.raises(Boom) as eb:
            next(ib)
        assert ea.value is error and eb.value is error
        assert not getattr(error, "__notes__", [])

    def test_copy_options(self):
        items = [[[1]], [[2]]]
        a, b = IterableWrapper(items).fork(2)
        assert all(x is y for x, y in zip(a, b))
        a, b = IterableWrapper(items).fork(2, copy="shallow")
        pairs = list(a.zip(b))
        assert all(x is not y and x == y and x[0] is y[0] for x, y in pairs)
        assert all(x is not items[k] for k, (x, _) in enumerate(pairs))
        a, b = IterableWrapper(items).fork(2, copy="deep")
        pairs = list(a.zip(b))
        assert all(x == y and x[0] is not y[0] for x, y in pairs)
        check_datapipe(a, expected=items)

    def test_pickle_keeps_children_together(self):
        a, b = IterableWrapper(Counting(range(5))).map(lambda x: x + 1).fork(2)
        a2, b2 = pickle.loads(pickle.dumps([a, b]))
        assert a2._hub is b2._hub and a2._hub is not a._hub
        assert list(a2.zip(b2)) == [(i, i) for i in range(1, 6)]
        zipped = pickle.loads(pickle.dumps(a.zip(b)))
        c, d = zipped.datapipes
        assert c._hub is d._hub
        src = traverse(zipped)
        counting = next(s for s in src if isinstance(s, IterableWrapper)).iterable
        assert list(zipped) == [(i, i) for i in range(1, 6)] and counting.passes == 1
        alone = pickle.loads(pickle.dumps(a))
        assert list(alone) == [1, 2, 3, 4, 5]

    def test_pickle_children_behind_other_pipes(self):
        # b reaches the pickler through a Mapper: each part must still yield the whole input
        a, b = IterableWrapper(range(3000)).fork(2, buffer_size=10)
        clone = pickle.loads(pickle.dumps(a.zip(b.map(lambda x: -x))))
        assert list(clone) == [(i, -i) for i in range(3000)]

    def test_deepcopy_keeps_children_together(self):
        a, b = IterableWrapper(range(3)).fork(2)
        a2, b2 = copy.deepcopy([a, b])
        assert a2._hub is b2._hub and a2._hub is not a._hub
        assert list(a2.zip(b2)) == [(0, 0), (1, 1), (2, 2)]

    def test_graph_walks_through_children(self):
        src = IterableWrapper(range(3))
        a, b = src.map(abs).fork(2)
        stages = list(traverse(a.zip(b)))
        assert [type(s).__name__ for s in stages] == ["Zipper", "ForkerChild", "Mapper", "IterableWrapper", "ForkerChild"]
        assert repr(a) == "IterableWrapper -> Mapper(abs) -> ForkerChild(0)"

    def test_two_threads(self):
        n = 2000
        a, b = IterableWrapper(range(n)).fork(2, buffer_size=n)
        out = {}

        def run(name, child):
            out[name] = list(child)

        threads = [threading.Thread(target=run, args=(k, c)) for k, c in (("a", a), ("b", b))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert out == {"a": list(range(n)), "b": list(range(n))}

    def test_bad_arguments(self):
        src = IterableWrapper([1])
        with pytest.raises(TypeError, match="Forker: datapipe must be an IterDataPipe, got list"):
            Forker([1], 2)
        with pytest.raises(ValueError, match="^Forker: Expected `num_instances` larger than 0, but 0 is found$"):
            src.fork(0)
        with pytest.raises(TypeError, match="Forker: num_instances must be an int, got str"):
            src.fork("2")
        with pytest.raises(TypeError, match="Forker: buffer_size must be an int, got float"):
            src.fork(2, buffer_size=1.5)
        with pytest.raises(ValueError, match="Forker: copy must be None, 'shallow' or 'deep', got 'bogus'"):
            src.fork(2, copy="bogus")

    def test_empty(self):
        a, b = IterableWrapper([]).fork(2)
        check_datapipe(a, expected=[])
        check_datapipe(a.zip(b), expected=[])
        assert list(b) == []


# -- Demultiplexer ----------------------------------------------------------------------------------


def odd_or_even(x):
    return x % 2


class TestDemultiplexer:
    def test_torch_examples(self):
        src = IterableWrapper(range(5))
        d1, d2 = src.demux(num_instances=2, classifier_fn=odd_or_even)
        assert list(d1) == [0, 2, 4] and list(d2) == [1, 3]
        d1, d2 = src.demux(2, lambda n: n % 2 if n != 0 else None, drop_none=True)
        assert list(d1) == [2, 4] and list(d2) == [1, 3]

    def test_returns_children(self):
        children = Demultiplexer(IterableWrapper(range(3)), 3, lambda x: x)
        assert isinstance(children, list) and all(isinstance(c, DemultiplexerChild) for c in children)
        assert [list(c) for c in children] == [[0], [1], [2]]
        params = list(inspect.signature(IterDataPipe.demux).parameters)
        assert params == ["self", "num_instances", "classifier_fn", "drop_none", "buffer_size"]

    def test_contract_each_child(self):
        with no_warnings():
            evens, odds = IterableWrapper(range(10)).demux(2, lambda x: x % 2)
            check_datapipe(evens, expected=[0, 2, 4, 6, 8], build=lambda src: src.demux(2, odd_or_even)[0])
            check_datapipe(odds, expected=[1, 3, 5, 7, 9], build=lambda src: src.demux(2, odd_or_even)[1])

    def test_contract_children_together(self):
        with no_warnings():
            evens, odds = IterableWrapper(range(10)).demux(2, lambda x: x % 2, buffer_size=1)
            check_datapipe(evens.zip(odds), expected=[(0, 1), (2, 3), (4, 5), (6, 7), (8, 9)],
                           build=lambda src: Zipper(*src.demux(2, odd_or_even, buffer_size=1)))
            a, b = IterableWrapper(range(7)).demux(2, lambda x: int(x >= 3))
            check_datapipe(a.concat(b), expected=list(range(7)))

    def test_one_child_fully_then_the_other(self):
        src = Counting(range(10))
        a, b = IterableWrapper(src).demux(2, odd_or_even, buffer_size=5)
        assert list(a) == [0, 2, 4, 6, 8]
        assert list(b) == [1, 3, 5, 7, 9]
        assert src.passes == 1

    def test_interleaved(self):
        a, b, c = IterableWrapper(range(12)).demux(3, lambda x: x % 3, buffer_size=5)
        ia, ib, ic = iter(a), iter(b), iter(c)
        got = [next(ic), next(ia), next(ic), next(ib)]
        got += list(ia) + list(ib) + list(ic)
        assert got == [2, 0, 5, 1, 3, 6, 9, 4, 7, 10, 8, 11]

    def test_out_of_range_error(self):
        a, b = IterableWrapper(range(10)).demux(2, lambda x: 5 if x == 3 else x % 2)
        with pytest.raises(ValueError) as info:
            list(a)
        msg = str(info.value)
        assert "Demultiplexer(" in msg and "<lambda>)" in msg and "returned 5 (int)" in msg and "for item 3" in msg
        assert "int in [0, 1]" in msg and "num_instances=2" in msg
        ib = iter(b)
        assert next(ib) == 1  # what was read before the bad item is still delivered
        with pytest.raises(ValueError) as again:
            next(ib)
        assert again.value is info.value  # the sibling gets the same error, not a silent gap

    @pytest.mark.parametrize("bad", [-1, 2, 1.0, "0", None, [0]])
    def test_non_int_or_negative_classification(self, bad):
        (a, b) = IterableWrapper([7]).demux(2, lambda x: bad)
        with pytest.raises(ValueError, match=r"classifier_fn returned .* for item 0; it must return an int in \[0, 1\]"):
            list(a)

    def test_none_without_drop_none_suggests_it(self):
        (a,) = IterableWrapper([7]).demux(1, lambda x: None)
        with pytest.raises(ValueError, match="returned None.*drop_none=True"):
            list(a)

    def test_bool_and_numpy_classifications(self):
        a, b = IterableWrapper(range(6)).demux(2, lambda x: x >= 3)
        assert list(a) == [0, 1, 2] and list(b) == [3, 4, 5]
        a, b = IterableWrapper(range(4)).demux(2, lambda x: np.int64(x % 2))
        assert list(a) == [0, 2] and list(b) == [1, 3]

    def test_classifier_error_same_object_with_note(self):
        error = Boom("classifier")

        def classify(x):
            if x == 4:
                raise error
            return x % 2

        a, b = IterableWrapper(range(10)).demux(2, classify)
        with pytest.raises(Boom) as info:
            list(a)
        assert info.value is error
        assert error.__notes__ == ["[datapipes] raised in stage Demultiplexer(TestDemultiplexer."
                                   "test_classifier_error_same_object_with_note.<locals>.classify) at item 4"]
        with pytest.raises(Boom) as again:
            list(b)
        assert again.value is error and len(error.__notes__) == 1

    def test_source_error_passes_through(self):
        error = Boom("source")
        a, b = failing_source([0, 1, 2], error).demux(2, odd_or_even)
        with pytest.raises(Boom) as info:
            list(b)
        assert info.value is error and not getattr(error, "__notes__", [])
        ia = iter(a)
        assert [next(ia), next(ia)] == [0, 2]
        with pytest.raises(Boom) as again:
            next(ia)
        assert again.value is error

    def test_overflow_error(self):
        a, b = IterableWrapper(range(20)).demux(2, lambda x: int(x >= 5), buffer_size=3)
        with pytest.raises(BufferError) as info:
            list(b)
        msg = str(info.value)
        assert "Demultiplexer(" in msg and "<lambda>)" in msg and "buffer_size=3" in msg
        assert "while child 1 looks for its next item (child 0 holds 4, which has not started reading)" in msg
        assert msg.endswith(": DemultiplexerIterDataPipe buffer overflow, buffer size 3 is insufficient.")
        # nothing was lost at the overflow; b keeps its place (as in torch), so the items after
        # 4, all b's, wait for it until the buffer overflows again
        ia, got = iter(a), []
        with pytest.raises(BufferError, match="child 1 holds 4, which stopped with a BufferError"):
            for x in ia:
                got.append(x)
        assert got == [0, 1, 2, 3, 4]

    def test_discarded_child_holds_nothing_back(self):
        evens = IterableWrapper(range(100)).demux(2, odd_or_even, buffer_size=2)[0]
        assert list(evens) == list(range(0, 100, 2))
        evens, odds = IterableWrapper(range(100)).demux(2, odd_or_even, buffer_size=2)
        with pytest.raises(BufferError):
            list(evens)

    def test_closed_child_holds_nothing_back(self):
        a, b = IterableWrapper(range(100)).demux(2, odd_or_even, buffer_size=2)
        ia = iter(a)
        next(ia)
        ia.close()
        assert list(b) == list(range(1, 100, 2))  # a's items are dropped, not buffered

    def test_new_pass_while_sibling_mid_pass_warns(self):
        a, b = IterableWrapper(range(6)).demux(2, odd_or_even)
        ia, ib = iter(a), iter(b)
        next(ia), next(ib)
        with pytest.warns(UserWarning, match=r"Demultiplexer\(odd_or_even\): child 0 started a new pass"):
            assert list(a) == [0, 2, 4]
        with pytest.raises(RuntimeError, match="invalidated"):
            next(ib)
        assert list(b) == [1, 3, 5]

    def test_len_raises_type_error(self):
        a, _ = IterableWrapper(range(3)).demux(2, odd_or_even)
        with pytest.raises(TypeError, match=r"DemultiplexerChild\(0\) has no len\(\)"):
            len(a)

    def test_pickle_keeps_children_together(self):
        src = Counting(range(6))
        a, b = IterableWrapper(src).demux(2, lambda x: x % 2)
        a2, b2 = pickle.loads(pickle.dumps((a, b)))
        assert a2._hub is b2._hub
        assert list(a2) == [0, 2, 4] and list(b2) == [1, 3, 5]
        assert a2._hub.datapipe.iterable.passes == 1
        zipped = pickle.loads(pickle.dumps(a.zip(b)))
        assert list(zipped) == [(0, 1), (2, 3), (4, 5)]

    def test_two_threads(self):
        n = 3000
        a, b, c = IterableWrapper(range(n)).demux(3, lambda x: x % 3, buffer_size=n)
        out = {}

        def run(k, child):
            out[k] = list(child)

        threads = [threading.Thread(target=run, args=(k, ch)) for k, ch in enumerate((a, b, c))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=30)
        assert not any(t.is_alive() for t in threads)
        assert out == {k: list(range(k, n, 3)) for k in range(3)}

    def test_unbounded_buffer_warns(self):
        with pytest.warns(UserWarning, match=r"^Demultiplexer\(buffer_size=-1\): Unlimited buffer size is set for `demux`"):
            a, b = IterableWrapper(range(3000)).demux(2, lambda x: int(x >= 1500), buffer_size=-1)
        assert list(b) == list(range(1500, 3000)) and list(a) == list(range(1500))

    def test_bad_arguments(self):
        src = IterableWrapper([1])
        with pytest.raises(TypeError, match="Demultiplexer: datapipe must be an IterDataPipe, got range"):
            Demultiplexer(range(3), 2, odd_or_even)
        with pytest.raises(ValueError, match="^Demultiplexer: Expected `num_instances` larger than 0, but 0 is found$"):
            src.demux(0, odd_or_even)
        with pytest.raises(TypeError, match="Demultiplexer: num_instances must be an int, got NoneType"):
            src.demux(None, odd_or_even)
        with pytest.raises(TypeError, match="Demultiplexer: classifier_fn must be callable, got int"):
            src.demux(2, 3)
        with pytest.raises(TypeError, match="Demultiplexer: drop_none must be a bool, got str"):
            src.demux(2, odd_or_even, drop_none="yes")

    def test_empty(self):
        a, b = IterableWrapper([]).demux(2, odd_or_even)
        check_datapipe(a, expected=[])
        check_datapipe(a.zip(b), expected=[])


def test_garbage_collected_children_release_the_source():
    src = Counting(range(10))
    a, b = IterableWrapper(src).fork(2)
    ia, ib = iter(a), iter(b)
    next(ia), next(ib)
    del ia, ib
    gc.collect()
    assert src.closed == 1


# -- every stage builds its pass at iter() ---------------------------------------------------------


def _quiet(build):
    def quiet():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # buffer_size=-1 warns at construction
            return build()

    return quiet


def _src(n=6):
    return IterableWrapper(range(n)).map(abs)


#: name -> (the pipe, the stages that create some of their sources' iterators only later, as
#: unbuilt() lists them right after iter(): concat's later inputs, fork/demux children that join
#: their hub at the first next())
BUILT_AT_ITER = {
    "concat-one": (lambda: _src().concat(), []),
    "concat-three": (lambda: _src().concat(IterableWrapper([7]).filter(bool), _src(2)), ["Concater"]),
    "zip-one": (lambda: Zipper(_src()), []),
    "zip-two": (lambda: _src().zip(IterableWrapper("abc").filter(bool)), []),
    "zip-three": (lambda: Zipper(_src(), _src(4), IterableWrapper("xy")), []),
    "mux-one": (lambda: Multiplexer(_src()), []),
    "mux-three": (lambda: _src().mux(_src(3).filter(bool), IterableWrapper("xyz")), []),
    "fork-one-child": (lambda: _src().fork(2)[0], ["ForkerChild"]),
    "fork-children-zipped": (lambda: Zipper(*_src().fork(2)), ["ForkerChild", "ForkerChild"]),
    "fork-buffer-1": (lambda: Multiplexer(*_src().fork(3, buffer_size=1)), ["ForkerChild"] * 3),
    "fork-unbounded": (_quiet(lambda: _src().fork(2, buffer_size=-1)[1]), ["ForkerChild"]),
    "fork-copy-shallow": (lambda: Zipper(*_src().fork(2, copy="shallow")), ["ForkerChild"] * 2),
    "fork-copy-deep": (lambda: _src().fork(2, copy="deep")[0], ["ForkerChild"]),
    "fork-child-concat": (lambda: Concater(*_src().fork(2)), ["Concater"]),
    "demux-one-child": (lambda: _src().demux(2, odd_or_even)[0], ["DemultiplexerChild"]),
    "demux-children-zipped": (lambda: Zipper(*_src().demux(2, odd_or_even, buffer_size=1)),
                              ["DemultiplexerChild"] * 2),
    "demux-drop-none": (lambda: Multiplexer(*_src().demux(2, lambda x: None if x == 2 else x % 2, drop_none=True)),
                        ["DemultiplexerChild"] * 2),
    "demux-unbounded": (_quiet(lambda: _src().demux(3, lambda x: x % 3, buffer_size=-1)[2]), ["DemultiplexerChild"]),
}


@pytest.mark.parametrize("case", sorted(BUILT_AT_ITER))
def test_pass_is_built_at_iter(case):
    build, later = BUILT_AT_ITER[case]
    expected = list(build())
    pipe = build()
    it = iter(pipe)
    assert _pass.unbuilt(it) == [], _pass.unbuilt(it)
    stages = list(traverse(pipe))
    lazy = sorted(type(s).__name__ for s in stages if id(s) not in it.pass_.built)
    assert all(getattr(s, "_builds_sources_later", False) for s in stages if type(s).__name__ in later)
    # what is built later is built in this pass, not in the pass of the graph that started last
    other = iter(pipe)
    assert list(it) == expected
    assert all(id(s) in it.pass_.built for s in stages), lazy
    del other

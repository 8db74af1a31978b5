"""The base classes, the functional registry, pickling, repr, seeds and the graph."""

import copy
import pickle

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset

import datapipes
from datapipes import IterDataPipe, MapDataPipe, functional_datapipe
from datapipes.datapipe import len_unknown, require_int, sources_of, stage_label
from datapipes.graph import describe, stages, to_mermaid, traverse
from datapipes._runtime.passes import stage_keys
from datapipes.iter import IterableWrapper, Mapper


class _Twice(IterDataPipe):
    def __init__(self, datapipe):
        self.datapipe = datapipe

    def __iter__(self):
        for x in self.datapipe:
            yield x
            yield x

    def __len__(self):
        return 2 * len(self.datapipe)


class _Random(IterDataPipe):
    _is_random = True

    def __init__(self, datapipe):
        self.datapipe = datapipe

    def __iter__(self):
        import random

        items = list(self.datapipe)
        random.Random(self._pass_seed()).shuffle(items)
        return iter(items)


class TestBaseClasses:
    def test_torch_dataset_subclasses(self):
        assert issubclass(IterDataPipe, IterableDataset)
        assert issubclass(MapDataPipe, Dataset)

    def test_bool_is_true_without_len(self):
        pipe = IterableWrapper(iter([]))
        assert bool(pipe) is True
        assert bool(IterableWrapper([])) is True

    def test_construction_is_lazy(self):
        calls = []
        pipe = IterableWrapper([1, 2]).map(lambda x: calls.append(x) or x)
        assert calls == []
        assert list(pipe) == [1, 2]
        assert calls == [1, 2]

    def test_two_passes_are_independent(self):
        pipe = IterableWrapper(range(4)).map(lambda x: x + 1)
        a, b = iter(pipe), iter(pipe)
        assert next(a) == 1 and next(a) == 2
        assert next(b) == 1
        assert list(a) == [3, 4]

    def test_one_shot_source_says_so(self):
        pipe = IterableWrapper(x for x in range(3))
        assert list(pipe) == [0, 1, 2]
        with pytest.raises(RuntimeError, match="one-shot generator was already iterated"):
            iter(pipe)

    def test_len_is_dynamic(self):
        data = [1, 2, 3]
        pipe = IterableWrapper(data).map(str)
        assert len(pipe) == 3
        data.append(4)
        assert len(pipe) == 4

    def test_len_unknown_names_the_stage(self):
        pipe = IterableWrapper(x for x in range(3)).map(str, on_error="skip")
        with pytest.raises(TypeError, match=r"\(IterableWrapper: its source, a generator, has no length\), so Mapper "):
            len(pipe)
        # list() still works: TypeError from __len__ is the protocol for "unknown"
        assert list(IterableWrapper([1, 2]).filter(bool)) == [1, 2]

    def test_custom_subclass(self):
        pipe = _Twice(IterableWrapper([1, 2]))
        assert list(pipe) == [1, 1, 2, 2] and len(pipe) == 4
        assert repr(pipe) == "IterableWrapper -> _Twice"

    def test_base_without_iter(self):
        class Empty(IterDataPipe):
            pass

        with pytest.raises(TypeError, match="defines no __iter__"):
            iter(Empty())

    def test_map_base_iterates_by_index(self):
        class Squares(MapDataPipe):
            def __getitem__(self, i):
                if not 0 <= i < 3:
                    raise IndexError(i)
                return i * i

            def __len__(self):
                return 3

        assert list(Squares()) == [0, 1, 4]

    def test_from_import_star_does_not_shadow_builtins(self):
        ns = {}
        exec("from datapipes import *", ns)
        assert "iter" not in ns and "map" not in ns
        assert "IterDataPipe" in ns
        assert datapipes.iter.IterableWrapper is IterableWrapper


class TestRegistry:
    def test_method_is_real_and_documented(self):
        assert "map" in dir(IterDataPipe)
        assert IterDataPipe.map.__doc__ == Mapper.__doc__
        import inspect

        params = list(inspect.signature(IterDataPipe.map).parameters)
        assert params[:3] == ["self", "fn", "input_col"]

    def test_method_equals_constructor(self):
        src = IterableWrapper([1, 2])
        a, b = src.map(str), Mapper(src, str)
        assert type(a) is type(b) and a.datapipe is b.datapipe and a.fn is b.fn

    def test_reregistering_same_class_is_noop(self):
        assert functional_datapipe("map")(Mapper) is Mapper

    def test_conflicting_name_raises(self):
        with pytest.raises(ValueError, match="'map' on IterDataPipe is already registered by datapipes.iter.mapping.map.Mapper"):

            @functional_datapipe("map")
            class OtherMapper(IterDataPipe):
                def __iter__(self):
                    return iter(())

    def test_clash_with_attribute(self):
        with pytest.raises(ValueError, match="clashes with the attribute IterDataPipe.set_seed"):

            @functional_datapipe("set_seed")
            class X(IterDataPipe):
                pass

    @pytest.mark.parametrize("name", ["", "1abc", "_private", "with space", 3])
    def test_bad_names(self, name):
        with pytest.raises(ValueError, match="public Python identifier"):
            functional_datapipe(name)

    def test_non_pipe_class(self):
        with pytest.raises(TypeError, match="decorates an IterDataPipe or MapDataPipe class"):
            functional_datapipe("whatever")(int)

    def test_bad_source(self):
        with pytest.raises(ValueError, match="source must be IterDataPipe or MapDataPipe"):
            functional_datapipe("whatever2", source=int)(_Twice)

    def test_separate_namespaces_and_explicit_source(self):
        @functional_datapipe("_twice_test_name".lstrip("_"))
        class Twice2(_Twice):
            pass

        try:
            assert "twice_test_name" in IterDataPipe._functions
            assert "twice_test_name" not in MapDataPipe._functions
            assert not hasattr(MapDataPipe, "twice_test_name")
            assert list(IterableWrapper([5]).twice_test_name()) == [5, 5]
        finally:
            del IterDataPipe._functions["twice_test_name"]
            delattr(IterDataPipe, "twice_test_name")

    def test_registration_on_map_source(self):
        class FromMap(IterDataPipe):
            def __init__(self, datapipe):
                self.datapipe = datapipe

            def __iter__(self):
                return iter(self.datapipe)

        functional_datapipe("from_map_test", source=MapDataPipe)(FromMap)
        try:
            assert hasattr(MapDataPipe, "from_map_test") and not hasattr(IterDataPipe, "from_map_test")
        finally:
            del MapDataPipe._functions["from_map_test"]
            delattr(MapDataPipe, "from_map_test")


class TestPickleAndCopy:
    def test_lambda_pipe_pickles(self):
        pipe = IterableWrapper(range(3)).map(lambda x: x * 3)
        clone = pickle.loads(pickle.dumps(pipe))
        assert list(clone) == [0, 3, 6]

    def test_local_class_pickles(self):
        clone = pickle.loads(pickle.dumps(_Twice(IterableWrapper([1]))))
        assert list(clone) == [1, 1]

    def test_closure_state_travels(self):
        k = 7
        clone = pickle.loads(pickle.dumps(IterableWrapper([1]).map(lambda x: x + k)))
        assert list(clone) == [8]

    def test_generator_source_refuses_pickle(self):
        with pytest.raises(TypeError, match="one-shot generator cannot be pickled"):
            pickle.dumps(IterableWrapper(x for x in range(2)))

    def test_shared_upstream_stays_shared(self):
        src = IterableWrapper([1, 2])
        pair = (src.map(str), src.map(float))
        a, b = pickle.loads(pickle.dumps(pair))
        assert list(a) == ["1", "2"] and list(b) == [1.0, 2.0]

    def test_copy_is_shallow_deepcopy_is_deep(self):
        data = [[1], [2]]
        pipe = IterableWrapper(data).map(len)
        shallow = copy.copy(pipe)
        assert shallow.datapipe is pipe.datapipe
        deep = copy.deepcopy(pipe)
        assert deep.datapipe is not pipe.datapipe and deep.datapipe.iterable == data
        assert deep.datapipe.iterable is not data

    def test_torch_dataloader_accepts_pipe(self):
        loader = torch.utils.data.DataLoader(IterableWrapper(range(6)).map(lambda x: x * 2), batch_size=3)
        assert [b.tolist() for b in loader] == [[0, 2, 4], [6, 8, 10]]


class TestSeeds:
    def test_same_seed_same_order(self):
        pipe = _Random(IterableWrapper(range(50)))
        pipe.set_seed(3)
        a, b = list(pipe), list(pipe)
        assert a == b and sorted(a) == list(range(50)) and a != list(range(50))
        assert list(_Random(IterableWrapper(range(50))).set_seed(3)) == a

    def test_different_seeds_and_epochs_differ(self):
        pipe = _Random(IterableWrapper(range(50))).set_seed(3)
        a = list(pipe)
        assert list(pipe.set_seed(4)) != a
        pipe.set_seed(3)
        e1 = list(pipe.set_epoch(1))
        assert e1 != a and sorted(e1) == sorted(a)
        assert list(pipe.set_epoch(0)) == a

    def test_each_random_stage_gets_its_own_seed(self):
        inner = _Random(IterableWrapper(range(10)))
        outer = _Random(inner.map(lambda x: x))
        outer.set_seed(1)
        assert inner._seed != outer._seed and inner._seed is not None

    def test_unseeded_follows_torch_manual_seed(self):
        pipe = _Random(IterableWrapper(range(50)))
        torch.manual_seed(0)
        a = list(pipe)
        b = list(pipe)
        torch.manual_seed(0)
        assert list(pipe) == a
        assert a != b  # fresh draw each pass

    def test_set_seed_none_goes_back_to_fresh_draws(self):
        pipe = _Random(IterableWrapper(range(50))).set_seed(1)
        pipe.set_seed(None)
        assert pipe._seed is None

    @pytest.mark.parametrize("bad", ["1", 1.5, True])
    def test_bad_seed(self, bad):
        with pytest.raises(TypeError, match="seed must be an int or None"):
            IterableWrapper([]).set_seed(bad)

    @pytest.mark.parametrize("bad", [-1, "1", True])
    def test_bad_epoch(self, bad):
        with pytest.raises(ValueError, match="epoch must be an int >= 0"):
            IterableWrapper([]).set_epoch(bad)


class TestGraphAndRepr:
    def test_chain_repr(self):
        def double(x):
            return 2 * x

        pipe = IterableWrapper([1]).map(double).filter(bool)
        assert repr(pipe) == "IterableWrapper -> Mapper(double) -> Filter(bool)"

    def test_traverse_and_stages(self):
        src = IterableWrapper([1])
        pipe = _Twice(src.map(str))
        assert [type(s).__name__ for s in traverse(pipe)] == ["_Twice", "Mapper", "IterableWrapper"]
        assert [type(s).__name__ for s in stages(pipe)] == ["IterableWrapper", "Mapper", "_Twice"]
        assert sources_of(pipe) == [pipe.datapipe]

    def test_sources_follow_the_constructors_parameters_not_the_assignments(self):
        # A stage's place in the graph fixes its state key and its seed: swapping two assignments in
        # an __init__ must move neither.
        class InOrder(IterDataPipe):
            def __init__(self, first, second, *, note="x"):
                self.note = note
                self.first, self.second = first, second

            def __iter__(self):
                return zip(self.first, self.second)

        class Swapped(InOrder):
            def __init__(self, first, second, *, note="x"):
                self.second = second
                self.note = note
                self.first = first

        class Renamed(IterDataPipe):  # sources under names that are no parameter: by name
            def __init__(self, x, y):
                self.zz_late, self.aa_early = x, y

            def __iter__(self):
                return iter(())

        a, b = IterableWrapper([1, 2]).shuffle(), IterableWrapper([3, 4]).shuffle()
        assert sources_of(InOrder(a, b)) == sources_of(Swapped(a, b)) == [a, b]
        assert sources_of(Renamed(a, b)) == [b, a]
        keys = [[key for key, _ in stage_keys(cls(a, b))] for cls in (InOrder, Swapped)]
        assert [k.split(":")[0] for k in keys[0]] == [k.split(":")[0] for k in keys[1]]
        seeds = []
        for cls in (InOrder, Swapped):
            pipe = cls(IterableWrapper(range(20)).shuffle(), IterableWrapper(range(20, 40)).shuffle())
            seeds.append(list(pipe.set_seed(7)))
        assert seeds[0] == seeds[1]

    def test_describe_and_mermaid(self):
        pipe = _Twice(IterableWrapper([1]).map(abs))
        assert describe(pipe) == "_Twice\n└── Mapper(abs)\n    └── IterableWrapper"
        assert to_mermaid(pipe) == (
            'flowchart LR\n    s0["IterableWrapper"] --> s1["Mapper(abs)"]\n    s1 --> s2["_Twice"]'
        )
        assert to_mermaid(IterableWrapper([])) == 'flowchart LR\n    s0["IterableWrapper"]'

    def test_shared_stage_in_describe(self):
        class Pair(IterDataPipe):
            def __init__(self, a, b):
                self.a, self.b = a, b

            def __iter__(self):
                return zip(self.a, self.b)

        src = IterableWrapper([1])
        text = describe(Pair(src, src))
        assert "(shared, shown above)" not in text  # siblings, not ancestors
        assert text.count("IterableWrapper") == 2
        assert len(stages(Pair(src, src))) == 2

    def test_stage_label_and_helpers(self):
        assert stage_label(IterableWrapper([])) == "IterableWrapper"
        err = len_unknown(IterableWrapper([]), "because")
        assert isinstance(err, TypeError) and str(err) == "IterableWrapper: because, so IterableWrapper instance doesn't have valid length"
        with pytest.raises(ValueError, match="X: n must be >= 1, got 0"):
            require_int(0, "X", "n", minimum=1)
        with pytest.raises(TypeError, match="X: n must be an int, got bool"):
            require_int(True, "X", "n")


class TestPickleSharing:
    def test_sharing_survives_round_trip(self):
        src = IterableWrapper([1, 2])
        a, b = pickle.loads(pickle.dumps((src.map(lambda x: x), src.map(lambda x: -x))))
        assert a.datapipe is b.datapipe

    def test_cycles_survive(self):
        pipe = IterableWrapper([1]).map(str)
        pipe.extra = {"self": pipe}
        clone = pickle.loads(pickle.dumps(pipe))
        assert clone.extra["self"] is clone

    def test_transform_lists_with_lambdas(self):
        class Compose(IterDataPipe):
            def __init__(self, datapipe, fns):
                self.datapipe, self.fns = datapipe, fns

            def __iter__(self):
                for x in self.datapipe:
                    for f in self.fns:
                        x = f(x)
                    yield x

        pipe = Compose(IterableWrapper([1, 2]), [lambda x: x + 1, abs, lambda x: x * 10])
        assert list(pickle.loads(pickle.dumps(pipe))) == [20, 30]

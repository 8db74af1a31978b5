"""States from someone else: a checkpoint is data, checked before use, never code and never a path.

docs/howto/security.rst: a loader state or a pass state is validated plain data. Nothing in it is
unpickled (worker states travel between the loader and its workers only); a resumed reader reopens
only a file its opener's source yields; every value a stage takes from its state has its type and
range checked as the state is loaded, and an error names the stage.
"""

import copy
import io
import os
import pickle

import fsspec
import pytest
import torch

from datapipes import DataLoader
from datapipes.iter import FileLister, IterableWrapper, SampleMultiplexer
from datapipes._runtime.held import MARK

from helpers import PlusOne, is_plain, plain_process  # noqa: F401 - plain_process: an autouse fixture

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


# -- helpers ---------------------------------------------------------------------------------------


class _Mkdir:
    """Unpickling it creates a directory: what a crafted pickle in a checkpoint would run."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return os.mkdir, (self.path,)


def numbers(n):
    class Gen:
        def __iter__(self):
            yield from range(n)

    return Gen()


def state_after(pipe, k):
    it = iter(pipe)
    for _ in range(k):
        next(it)
    state = it.state_dict()
    it.close()
    return state


def through_torch(state, tmp_path):
    """``state`` saved with ``torch.save`` and read back with ``torch.load(weights_only=True)``."""
    path = tmp_path / "state.pt"
    torch.save(state, path)
    return torch.load(path, weights_only=True)


# -- finding 1: a checkpoint never runs code ------------------------------------------------------


def loader_over(n, workers):
    return DataLoader(IterableWrapper(range(n)).sharding_filter(), batch_size=2, num_workers=workers, seed=0)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pickled_shard_state_is_refused_and_never_unpickled(tmp_path, workers):
    loader = loader_over(20, workers)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    del it
    target = tmp_path / "pwned"
    state["pass"][0]["shards"][0] = pickle.dumps(_Mkdir(str(target)))
    state = through_torch(state, tmp_path)  # weights_only=True lets bytes through
    fresh = loader_over(20, workers)
    try:
        with pytest.raises(ValueError, match=r"DataLoader.*shard 0.*bytes") as raised:
            fresh.load_state_dict(state)
            # before the fix: the next pass took the shard's state up, and state_dict() unpickled it
            resumed = iter(fresh)
            fresh.state_dict()
            next(resumed)
        assert "load_state_dict" in str(raised.value)
    finally:
        fresh.close()
    assert not target.exists()


def test_a_worker_state_is_plain_data_and_resumes_through_a_weights_only_load(tmp_path):
    def make():
        pipe = IterableWrapper(range(40)).sharding_filter().shuffle(buffer_size=5).map(str)
        return DataLoader(pipe, batch_size=3, num_workers=2, seed=1, collate_fn=list)

    full = list(make())
    loader = make()
    it = iter(loader)
    head = [next(it) for _ in range(5)]
    state = loader.state_dict()
    del it
    loader.close()
    assert is_plain(state)
    loaded = through_torch(state, tmp_path)
    assert loaded == state
    again = make()
    again.load_state_dict(loaded)
    assert head + list(again) == full


# -- finding 5: a state names no file of its own --------------------------------------------------


@pytest.fixture
def files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    for name in "abc":
        (data / f"{name}.txt").write_text(f"{name}1\n{name}2\n{name}3\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("SECRET\n")
    return [str(data / f"{name}.txt") for name in "abc"], str(secret)


def test_a_reader_state_naming_another_file_is_refused(files):
    paths, secret = files

    def build():
        return IterableWrapper(paths).open_files().readlines()

    state = state_after(build(), 1)  # inside a.txt
    assert state["stages"]["0:LineReader"]["file"]["path"] == paths[0]
    state["stages"]["0:LineReader"]["file"]["path"] = secret
    it = iter(build())
    got = []
    with pytest.raises(ValueError, match=r"secret\.txt.*FileOpener.*source does not yield"):
        it.load_state_dict(state)
        got.extend(it)  # before the fix: the secret's lines
    assert not any("SECRET" in line for _, line in got)


def test_a_held_stream_naming_another_file_is_refused(files):
    paths, secret = files

    def build():
        return IterableWrapper(paths).open_files(mode="b").shuffle(buffer_size=2).set_seed(0)

    state = state_after(build(), 1)
    buffer = state["stages"]["0:Shuffler"]["buffer"]
    assert buffer and all(MARK in stream for _, stream in buffer)
    buffer[0][1][MARK]["path"] = secret
    it = iter(build())
    got = []
    with pytest.raises(ValueError, match=r"secret\.txt.*FileOpener.*source does not yield"):
        it.load_state_dict(state)
        got.extend(stream.read() for _, stream in it)
    assert b"SECRET\n" not in got


def test_a_remote_opener_reopens_no_other_url():
    fs = fsspec.filesystem("memory")
    for name in "ab":
        fs.pipe(f"/hostile/{name}.txt", f"{name}1\n{name}2\n".encode())
    fs.pipe("/elsewhere/secret.txt", b"SECRET\n")
    urls = ["memory://hostile/a.txt", "memory://hostile/b.txt"]

    def build():
        return IterableWrapper(urls).open_files_by_fsspec(mode="r").readlines()

    state = state_after(build(), 1)
    state["stages"]["0:LineReader"]["file"]["path"] = "memory://elsewhere/secret.txt"
    it = iter(build())
    got = []
    with pytest.raises(ValueError, match=r"secret\.txt.*FSSpecFileOpener.*source does not yield"):
        it.load_state_dict(state)
        got.extend(it)
    assert not any("SECRET" in line for _, line in got)


def test_a_lister_state_naming_another_root_is_refused(files):
    paths, secret = files
    data = os.path.dirname(paths[0])

    def build():
        return FileLister(data).open_files().readlines()

    state = state_after(build(), 1)
    lister = state["stages"]["2:FileLister"]
    assert lister["root"] == data
    lister["root"] = os.path.dirname(secret)  # a folder the pipe never lists, holding the secret
    it = iter(build())
    got = []
    with pytest.raises(ValueError, match=r"FileLister.*to list again.*source does not yield"):
        it.load_state_dict(state)
        got.extend(it)  # before the fix: the other folder's files, the secret among them
    assert not any("SECRET" in line for _, line in got)


def test_a_remote_lister_state_naming_another_root_is_refused():
    fs = fsspec.filesystem("memory")
    for name in "ab":
        fs.pipe(f"/listed/{name}.txt", f"{name}1\n{name}2\n".encode())
    fs.pipe("/private/secret.txt", b"SECRET\n")

    def build():
        return IterableWrapper(["memory://listed"]).list_files_by_fsspec().open_files_by_fsspec(mode="r").readlines()

    state = state_after(build(), 1)
    key = next(k for k in state["stages"] if k.endswith(":FSSpecFileLister"))
    assert state["stages"][key]["root"] == "memory://listed"
    state["stages"][key]["root"] = "memory://private"  # before the fix: listed, and its files read
    it = iter(build())
    got = []
    with pytest.raises(ValueError, match=r"FSSpecFileLister.*to list again.*source does not yield"):
        it.load_state_dict(state)
        got.extend(it)
    assert not any("SECRET" in line for _, line in got)


def test_a_saved_stream_names_an_opener_of_the_pipe(files):
    paths, _ = files

    def build():
        return IterableWrapper(paths).open_files(mode="b").shuffle(buffer_size=2).set_seed(0)

    state = state_after(build(), 1)
    state["stages"]["0:Shuffler"]["buffer"][0][1][MARK]["open"] = "2:IterableWrapper"
    with pytest.raises(ValueError, match=r"Shuffler.*IterableWrapper.*opens no"):
        iter(build()).load_state_dict(state)


def test_a_reader_over_an_unseeded_shuffle_of_a_listing_still_resumes(files):
    """The opener's source is read again to check the path: in another order here (a new seed),
    the path is still one the source yields."""
    paths, _ = files
    data = os.path.dirname(paths[0])

    def build():
        return FileLister(data).shuffle().open_files().readlines()

    it = iter(build())
    head = [next(it) for _ in range(4)]
    state = it.state_dict()
    rest = list(it)
    again = iter(build())
    again.load_state_dict(copy.deepcopy(state))
    assert len(head) + len(rest) == 9
    assert list(again) == rest


def test_an_in_memory_stream_is_data_not_a_path():
    def build():
        return IterableWrapper([("x", io.BytesIO(b"one\ntwo\n"))], deepcopy=False).readlines()

    state = state_after(build(), 1)
    state["stages"]["0:LineReader"]["file"]["memory"] = ["bytes", b"three\nfour\n"]
    it = iter(build())
    it.load_state_dict(state)
    assert list(it) == [("x", b"four")]


# -- finding 14: values are checked, errors name the stage ----------------------------------------


SOURCES = {"range": lambda: range(10), "list": lambda: list(range(10)), "iterable": lambda: numbers(10)}


@pytest.mark.parametrize("kind", SOURCES)
def test_a_negative_source_index_is_refused(kind):
    def build():
        return IterableWrapper(SOURCES[kind]())

    state = state_after(build(), 3)
    state["stages"]["0:IterableWrapper"]["index"] = -3
    it = iter(build())
    with pytest.raises(ValueError, match=r"IterableWrapper.*'index'.*-3"):
        it.load_state_dict(state)
        list(it)  # before the fix: the first items again


@pytest.mark.parametrize("kind", SOURCES)
def test_a_source_index_past_the_end_is_refused(kind):
    def build():
        return IterableWrapper(SOURCES[kind]())

    state = state_after(build(), 3)
    state["stages"]["0:IterableWrapper"]["index"] = 99
    it = iter(build())
    with pytest.raises(ValueError, match=r"IterableWrapper.*'index'.*99"):
        it.load_state_dict(state)
        list(it)  # before the fix: nothing more, silently


@pytest.mark.parametrize("phase", ["swap", "drain"])
def test_a_shuffle_buffer_larger_than_buffer_size_is_refused(phase):
    def build():
        return IterableWrapper(numbers(20)).shuffle(buffer_size=4).set_seed(0)

    state = state_after(build(), 5 if phase == "swap" else 18)
    saved = state["stages"]["0:Shuffler"]
    assert saved["phase"] == phase
    saved["buffer"] = list(range(100, 110))
    it = iter(build())
    with pytest.raises(ValueError, match=r"Shuffler.*'buffer'.*10 items.*buffer_size=4"):
        it.load_state_dict(state)
        list(it)  # before the fix: ten items that were never in the source


@pytest.mark.parametrize("stage", ["prefetch", "zip_with_iter"])
def test_a_buffer_larger_than_its_stage_holds_is_refused(stage):
    """The other stages whose state holds items up to a buffer_size: a prefetcher's pending items,
    zip_with_iter's waiting reference items."""
    if stage == "prefetch":
        def build():
            return IterableWrapper(numbers(20)).prefetch(buffer_size=2)
        key, field, fake = "0:Prefetcher", "pending", list(range(100, 110))
    else:
        def build():
            return IterableWrapper([3, 1, 2, 0]).zip_with_iter(IterableWrapper(range(4)), key_fn=int, buffer_size=2)
        key, field, fake = "0:IterKeyZipper", "buffer", [[k, k] for k in range(100, 110)]
    state = state_after(build(), 1)
    state["stages"][key][field] = fake
    it = iter(build())
    with pytest.raises(ValueError, match=rf"{key[2:]}.*'{field}'.*10 items.*buffer_size=2"):
        it.load_state_dict(state)
        list(it)  # before the fix: ten items that were never in the source


def test_a_sharding_filter_count_below_zero_is_refused():
    def build():
        return IterableWrapper(range(10)).sharding_filter()

    state = state_after(build(), 3)
    state["stages"]["0:ShardingFilter"]["kept"] = -2
    with pytest.raises(ValueError, match=r"ShardingFilter.*'kept'"):
        iter(build()).load_state_dict(state)


def test_a_state_loaded_into_a_stage_built_later_names_it():
    """A stage written elsewhere builds its source at its first next(): the state waits, and is
    checked when the stage is built."""

    def build():
        return PlusOne(IterableWrapper(range(10)))

    state = state_after(build(), 3)
    state["stages"]["1:IterableWrapper"]["index"] = "3"
    it = iter(build())
    it.load_state_dict(state)
    with pytest.raises(ValueError, match=r"IterableWrapper.*'index'"):
        next(it)


@pytest.mark.parametrize("bad, message", [
    ({"format": "datapipes.pass/1", "graph": "IterableWrapper", "stages": {}}, r"'graph'.*list of str"),
    ({"format": "datapipes.pass/1", "graph": ["IterableWrapper"], "stages": []}, r"'stages'.*dict"),
    ({"format": "datapipes.pass/1", "graph": ["IterableWrapper"]}, r"no 'stages'"),
    ({"format": "datapipes.pass/1", "graph": ["IterableWrapper"], "stages": {"7:Mapper": {}}},
     r"'7:Mapper'.*no stage"),
    ({"format": "datapipes.pass/1", "graph": ["IterableWrapper"], "stages": {0: {}}}, r"keys.*str"),
])
def test_the_top_level_of_a_pass_state_is_checked(bad, message):
    with pytest.raises(ValueError, match=message):
        iter(IterableWrapper(range(3))).load_state_dict(bad)


def _rotten(value):
    """A value of another type than ``value`` (which a state of that stage never holds there)."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, int):
        return "7"
    if isinstance(value, str):
        return 7
    return 7  # a list, tuple or dict


#: name -> (build, items before the state, key of the stage under test, keys whose value may be any
#: item, which a state cannot check)
STAGES = {
    "source": (lambda: IterableWrapper(range(20)), 3, "0:IterableWrapper", ()),
    "source iterable": (lambda: IterableWrapper(numbers(20)), 3, "0:IterableWrapper", ()),
    "shuffle": (lambda: IterableWrapper(numbers(20)).shuffle(buffer_size=4).set_seed(1), 5, "0:Shuffler", ()),
    "shuffle positions": (lambda: IterableWrapper(range(20)).shuffle(buffer_size=4).set_seed(1), 5, "0:Shuffler", ()),
    "sharding_filter": (lambda: IterableWrapper(range(20)).sharding_filter(), 3, "0:ShardingFilter", ()),
    "header": (lambda: IterableWrapper(range(20)).header(10), 3, "0:Header", ()),
    "cycle": (lambda: IterableWrapper(range(5)).cycle(3), 7, "0:Cycler", ()),
    "enumerate": (lambda: IterableWrapper(range(20)).enumerate(), 3, "0:Enumerator", ()),
    "flatmap": (lambda: IterableWrapper([[1, 2, 3], [4, 5]]).flatmap(), 1, "0:FlatMapper", ()),
    "groupby": (lambda: IterableWrapper(range(20)).groupby(lambda x: x % 3, group_size=2), 2, "0:Grouper", ()),
    "bucketbatch": (lambda: IterableWrapper(range(40)).bucketbatch(2, batch_num=2, bucket_num=2).set_seed(1), 1,
                    "0:BucketBatcher", ()),
    "in_memory_cache": (lambda: IterableWrapper(range(5)).in_memory_cache(), 2, "0:InMemoryCacheHolder", ()),
    "concat": (lambda: IterableWrapper(range(5)).concat(IterableWrapper(range(3))), 6, "0:Concater", ()),
    "mux": (lambda: IterableWrapper(range(5)).mux(IterableWrapper(range(3))), 3, "0:Multiplexer", ()),
    "mux_longest": (lambda: IterableWrapper(range(5)).mux_longest(IterableWrapper(range(3))), 3,
                    "0:MultiplexerLongest", ()),
    "sample_mux": (lambda: SampleMultiplexer({IterableWrapper(range(5)): 0.5, IterableWrapper(range(5, 9)): 0.5},
                                              seed=3), 3, "0:SampleMultiplexer", ()),
    "zip_with_iter": (lambda: IterableWrapper([3, 1, 2, 0]).zip_with_iter(IterableWrapper(range(4)),
                                                                         key_fn=int, ref_key_fn=int), 2,
                      "0:IterKeyZipper", ()),
    "max_token_bucketize": (lambda: IterableWrapper(["a" * i for i in range(1, 9)]).max_token_bucketize(
        6, buffer_size=3), 1, "0:MaxTokenBucketizer", ()),
    "in_batch_shuffle": (lambda: IterableWrapper([[1, 2], [3, 4], [5]]).in_batch_shuffle().set_seed(1), 1,
                         "0:InBatchShuffler", ()),
    "random_split": (lambda: IterableWrapper(range(20)).random_split(weights={"a": 1, "b": 1}, seed=1,
                                                                     target="a"), 2, "0:SplitterIterator", ()),
    "map budget": (lambda: IterableWrapper(range(20)).map(int, on_error="skip", max_failures=3), 2, "0:Mapper", ()),
    "map rng": (lambda: IterableWrapper(range(20)).map(lambda x, rng: x, rng="python").set_seed(1), 2, "0:Mapper",
                ()),
    "map concurrent": (lambda: IterableWrapper(range(20)).map(int, concurrency=2), 2, "0:Mapper", ()),
    "open_files budget": (None, 1, "1:FileOpener", ()),  # built in the test (needs files)
    "list_files": (None, 1, "0:FileLister", ()),
}


def _build(name, tmp_path):
    build, k, key, free = STAGES[name]
    if build is None:
        data = tmp_path / "d"
        data.mkdir(exist_ok=True)
        for n in "abc":
            (data / f"{n}.txt").write_text("x\n")
        paths = sorted(str(p) for p in data.iterdir())
        if name == "list_files":
            build = lambda: FileLister(str(data))  # noqa: E731
        else:
            build = lambda: IterableWrapper(paths).open_files(on_error="skip", max_failures=2).map(  # noqa: E731
                lambda pair: pair[1].read())
    return build, k, key, free


def _corruptions(saved, free):
    yield "not a dict", "garbage"
    yield "no key", {}
    if isinstance(saved, dict):
        for field, value in saved.items():
            if field not in free and value is not None:
                yield f"{field!r} of another type", {**saved, field: _rotten(value)}


@pytest.mark.parametrize("name", STAGES)
def test_a_stage_state_of_another_type_is_refused_naming_the_stage(name, tmp_path):
    build, k, key, free = _build(name, tmp_path)
    state = state_after(build(), k)
    assert key in state["stages"], state["stages"].keys()
    label = key.split(":", 1)[1]
    for what, bad in _corruptions(state["stages"][key], free):
        tampered = copy.deepcopy(state)
        tampered["stages"][key] = bad
        it = iter(build())
        try:
            with pytest.raises(ValueError, match=label) as raised:
                it.load_state_dict(tampered)
        except BaseException as e:
            e.add_note(f"{name}: {what}: {bad!r:.300}")
            raise
        finally:
            it.close()
        assert key in str(raised.value), (what, str(raised.value))


# -- loader states ---------------------------------------------------------------------------------


def _edit(path, value):
    def edit(state):
        target = state
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value
        return state

    return edit


LOADER_TAMPERING = {
    "format": (_edit(["format"], "datapipes.loader/0"), r"not a state saved by DataLoader"),
    "epoch below zero": (_edit(["epoch"], -1), r"'epoch'"),
    "seed not an int": (_edit(["seed"], "0"), r"'seed'"),
    "pass not a list": (_edit(["pass"], {"layout": [1, 0, 1]}), r"'pass'"),
    "layout": (_edit(["pass", 0, "layout"], [1, 3, 1]), r"'layout'"),
    "next shard out of range": (_edit(["pass", 0, "next"], 5), r"'next'"),
    "skip below zero": (_edit(["pass", 0, "shards", 0, "skip"], -4), r"'skip'"),
    "tails not a list": (_edit(["pass", 0, "shards", 0, "tails"], "x"), r"'tails'"),
    "main not a pass state": (_edit(["pass", 0, "shards", 0, "main"], {"format": "x"}), r"'main'"),
    "shards of another count": (_edit(["pass", 0, "shards"], []), r"'shards'"),
}


@pytest.mark.parametrize("name", LOADER_TAMPERING)
def test_a_tampered_loader_state_is_refused_at_load(name):
    loader = loader_over(20, 0)
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    edit, message = LOADER_TAMPERING[name]
    state = edit(copy.deepcopy(state))
    with pytest.raises(ValueError, match=message) as raised:
        loader_over(20, 0).load_state_dict(state)
    assert "DataLoader" in str(raised.value)

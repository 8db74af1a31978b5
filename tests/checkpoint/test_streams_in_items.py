"""Streams inside the items a state holds (datapipes._runtime.held).

``open_files()`` yields ``(path, stream)`` pairs; a stage that holds items when the state is taken (a
concurrent map's inputs in flight, prefetched items, a shuffle buffer) holds open streams, which
``pickle`` cannot write and which the stage's function may have read already. A state saves each
one as it started: by the opener that opened it (opened again by the same stage of the resumed
pass), or by its contents when it is in memory; any other stream is refused with a ``TypeError``
naming the stage.
"""

import asyncio
import bz2
import io
import pickle
import random
import tarfile
import time

import pytest
import torch

from datapipes import DataLoader
from datapipes._runtime.held import MARK
from datapipes.iter import FileLister, IterableWrapper
from datapipes.testing import check_resume

N = 9


@pytest.fixture
def files(tmp_path):
    for i in range(N):
        (tmp_path / f"f{i}.txt").write_text(f"file {i}\nline two of {i}\n")
    return sorted(str(p) for p in tmp_path.glob("f*.txt"))


def read(pair):
    time.sleep(random.random() * 0.003)  # items finish out of order, several in flight
    path, stream = pair
    return path[-6:], stream.read()


async def aread(pair):
    await asyncio.sleep(random.random() * 0.003)
    path, stream = pair
    return path[-6:], stream.read()


def every(n):
    return range(n + 1)


def plain(value, depth=0):
    """Whether ``value`` is plain data: dicts, lists, tuples, numbers, strings, bytes, None."""
    if isinstance(value, dict):
        return all(plain(k, depth + 1) and plain(v, depth + 1) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return all(plain(v, depth + 1) for v in value)
    return isinstance(value, (int, float, str, bytes, type(None)))


class TestOpenedFiles:
    @pytest.mark.parametrize("through", ["pickle", "torch"])
    @pytest.mark.parametrize("mode", ["b", "r"])
    def test_a_thread_map_reading_its_inputs_resumes_exactly(self, files, mode, through):
        check_resume(lambda: IterableWrapper(files).open_files(mode=mode).map(read, concurrency=3), every,
                     through=through)

    def test_in_completion_order(self, files):
        check_resume(lambda: IterableWrapper(files).open_files(mode="b").map(read, concurrency=3, ordered=False),
                     every, ordered=False)

    def test_an_async_map(self, files):
        check_resume(lambda: IterableWrapper(files).open_files(mode="b").map(aread, concurrency=4), every)

    def test_prefetched_streams(self, files):
        check_resume(lambda: IterableWrapper(files).open_files(mode="b").prefetch(4).map(read), every)

    def test_a_shuffle_buffer_of_streams(self, files):
        def build():
            return IterableWrapper(files).open_files(mode="b").shuffle(buffer_size=4).set_seed(3).map(read)
        check_resume(build, every)

    def test_through_fsspec(self, files):
        urls = ["file://" + f for f in files]
        check_resume(lambda: IterableWrapper(urls).open_files_by_fsspec(mode="rb").map(read, concurrency=3), every)

    def test_decompressed_streams(self, tmp_path):
        for i in range(5):
            (tmp_path / f"c{i}.txt.bz2").write_bytes(bz2.compress(f"compressed {i}\n".encode()))
        paths = sorted(str(p) for p in tmp_path.glob("*.bz2"))
        check_resume(lambda: IterableWrapper(paths).open_files(mode="b").decompress().map(read, concurrency=2), every)
        check_resume(lambda: IterableWrapper(paths).open_files(mode="b").load_from_bz2().map(read, concurrency=2),
                     every)
        check_resume(lambda: IterableWrapper(paths).open_files(mode="b").extract().map(read, concurrency=2), every)

    def test_the_state_holds_where_each_stream_came_from_as_plain_data(self, files):
        it = iter(IterableWrapper(files).open_files(mode="b").map(read, concurrency=3))
        next(it)
        state = it.state_dict()
        it.close()
        assert plain(state)
        inputs = state["stages"]["0:Mapper"]["inputs"]
        assert inputs
        position, (path, saved) = inputs[0]
        assert saved == {MARK: {"open": "1:FileOpener", "path": path, "n": position, "name": path, "wrapped": True}}
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        assert torch.load(buf, weights_only=True) == state  # torch.load's default accepts it

    def test_a_resumed_pass_can_save_again(self, files):
        def build():
            return IterableWrapper(files).open_files(mode="b").map(read, concurrency=3)
        full = list(build())
        it = iter(build())
        head = [next(it) for _ in range(2)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        it.close()
        it = iter(build())
        it.load_state_dict(state)
        head += [next(it) for _ in range(3)]
        again = pickle.loads(pickle.dumps(it.state_dict()))
        it.close()
        it = iter(build())
        it.load_state_dict(again)
        assert head + list(it) == full

    def test_the_state_given_is_left_as_it_was(self, files):
        def build():
            return IterableWrapper(files).open_files(mode="b").map(read, concurrency=3)
        it = iter(build())
        next(it)
        state = it.state_dict()
        it.close()
        before = pickle.dumps(state)
        rests = []
        for _ in range(2):
            again = iter(build())
            again.load_state_dict(state)
            rests.append(list(again))
        assert rests[0] == rests[1] and pickle.dumps(state) == before


class TestInMemory:
    def test_archive_members_read_in_flight(self, tmp_path):
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for i in range(6):
                data = f"member {i}".encode()
                info = tarfile.TarInfo(f"m{i}.txt")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        (tmp_path / "a.tar").write_bytes(buf.getvalue())
        check_resume(lambda: FileLister(str(tmp_path), "*.tar").open_files(mode="b").load_from_tar()
                     .map(read, concurrency=3), every)

    def test_bytes_and_text_streams_are_copied(self):
        def build():
            items = [(f"m{i}", io.BytesIO(b"x" * i) if i % 2 else io.StringIO("y" * i)) for i in range(7)]
            return IterableWrapper(items, deepcopy=False).map(read, concurrency=3)
        check_resume(build, every)


class TestRefused:
    def test_a_stream_of_unknown_origin_names_the_stage(self, files):
        def build():
            return IterableWrapper(files).map(lambda p: (p, open(p, "rb"))).map(read, concurrency=2)  # noqa: SIM115
        it = iter(build())
        next(it)
        with pytest.raises(TypeError, match=r"Mapper.*cannot save its position: it holds an item with an open "
                                             r"stream \(BufferedReader"):
            it.state_dict()
        it.close()


def test_a_two_worker_loader_over_opened_files(files):
    def build():
        return (IterableWrapper(files).sharding_filter().open_files(mode="b")
                .map(read, concurrency=2).map(lambda pair: len(pair[1])))

    def loader():
        return DataLoader(build(), batch_size=2, num_workers=2, seed=1, multiprocessing_context="fork")

    full = [b.tolist() for b in loader()]
    for k in (1, 2, len(full) - 1):
        it = iter(first := loader())
        head = [next(it).tolist() for _ in range(k)]
        state = pickle.loads(pickle.dumps(first.state_dict()))
        it.close()
        again = loader()
        again.load_state_dict(state)
        assert head + [b.tolist() for b in again] == full, k

"""``batch`` yields ``DataChunk`` as torch's does: a ``list`` with torch's methods."""

import pickle

import torch
from torch.utils.data import default_collate
from torch.utils.data.datapipes.datapipe import DataChunk as TorchChunk
from torch.utils.data.datapipes.iter import IterableWrapper as TorchWrapper

from datapipes import DataChunk, collate
from datapipes.iter import IterableWrapper


def test_batches_match_torchs_methods():
    ours = list(IterableWrapper(range(5)).batch(2))
    theirs = list(TorchWrapper(range(5)).batch(2))
    assert [type(b).__name__ for b in ours] == [type(b).__name__ for b in theirs] == ["DataChunk"] * 3
    assert ours == theirs
    for a, b in zip(ours, theirs):
        assert a.as_str("  ") == b.as_str("  ")
        assert list(a.raw_iterator()) == list(b.raw_iterator())
        assert a.items == b.items
        assert isinstance(a, list) and len(a) == len(b)


def test_pickles_and_collates_as_a_list():
    chunk = DataChunk([1, 2, 3])
    again = pickle.loads(pickle.dumps(chunk))
    assert type(again) is DataChunk and again == [1, 2, 3]
    assert torch.equal(collate(DataChunk([1, 2])), torch.tensor([1, 2]))
    assert torch.equal(default_collate(DataChunk([1, 2])), torch.tensor([1, 2]))
    assert list(IterableWrapper([DataChunk([1, 2]), TorchChunk([3])]).unbatch()) == [1, 2, 3]


def test_to_device_collates_a_chunk_of_samples():
    (batch,) = list(IterableWrapper([(1, 2.0), (3, 4.0)]).batch(2).to_device("cpu"))
    assert torch.equal(batch[0], torch.tensor([1, 3]))

"""A stage on Dask's ``Client.get_executor()`` with ``chunksize``: no code of ours, only the
Executor protocol (issue 23, item 6; docs/howto/cluster.rst, "Dask")."""

from __future__ import annotations

import pytest

from datapipes.iter import IterableWrapper
from datapipes.testing import check_resume

distributed = pytest.importorskip("distributed")

pytestmark = pytest.mark.timeout(90)


def square(x):
    return x * x


def test_a_stage_on_a_dask_client_in_chunks_keeps_order_and_resumes():
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as client:
        executor = client.get_executor()
        pipe = IterableWrapper(range(100)).map(square, concurrency=4, executor=executor, chunksize=16)
        assert list(pipe) == [x * x for x in range(100)]
        check_resume(lambda: IterableWrapper(range(30)).map(square, concurrency=2, executor=executor, chunksize=4),
                     ks=[0, 11])

"""Helpers shared by test modules in several folders, imported explicitly (``from helpers import
...``: tests/ is on ``sys.path`` through tests/conftest.py): a custom exception and a function that
raises it at one item, the live children of this process, and the ``plain_process`` fixture."""

import glob
import os

import pytest

from datapipes import _worker


class Boom(Exception):
    def __init__(self, code, detail):
        super().__init__(code, detail)
        self.code = code


def fail_at(k):
    def fn(x):
        if x == k:
            raise Boom(k, "custom")
        return x

    return fn


def child_pids():
    """Pids of this process's live children (from /proc: every thread's children list)."""
    pids = set()
    for path in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        try:
            with open(path) as f:
                pids.update(int(p) for p in f.read().split())
        except OSError:
            pass
    return pids


@pytest.fixture(autouse=True)
def plain_process(monkeypatch):
    """No distributed rank from the environment, and the once-per-process warning not yet given
    (autouse in the modules that import it)."""
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setattr(_worker, "_checked", False)

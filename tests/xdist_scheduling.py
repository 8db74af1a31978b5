"""How the suite spreads over pytest-xdist's workers (``--dist loadgroup``, scripts/test.sh): which
tests share a worker, and a run that ends when a test kills its worker.

**Groups.** Tests that share a machine-wide resource run on one worker, one after another
(:data:`GROUPS`, by node id). xdist's own way, the ``xdist_group`` mark, does nothing with pytest 9.2
and xdist 3.8.0: xdist names a grouped test by setting ``item._nodeid``, which pytest no longer
reads, so every test went to whichever worker was free, two Ray runtimes and two mypy runs at once
included. The controller sees node ids only (it collects nothing), so the groups are node-id
prefixes; tests/conftest.py checks at collection that every test marked ``ray`` is in "cluster".

**A worker that dies** (a segfault in an extension, a cluster runtime that exits its driver).

pytest-xdist 3.8.0 reports the test a worker died in as failed and starts a new worker, but then,
under ``loadgroup`` (and ``loadscope``), the run may never end (pytest-dev/pytest-xdist#1323, #1327,
#1378; the fixes are not in a release yet):

- every work unit the dead worker had, the finished ones included, goes back on the queue; a
  finished one is later sent as an empty batch, which the worker never reports done, so its node is
  never given work again;
- the new worker gets one test, but a worker runs a test only once it holds the next one (or is told
  to stop), so it waits for ever;
- the test the worker died in is run again, and takes the next worker down with it.

:class:`CrashSafeLoadGroup` keeps xdist's scheduling and changes those three steps: only unfinished
tests go back on the queue, the test that killed the worker is not one of them, and a node is topped
up to three pending tests (or told to stop when the queue is empty). Work sent to a node that has
just died (its channel closed) waits in its assigned work for its "node down" event, which puts it
back on the queue, where xdist's own scheduler fails the run with an INTERNALERROR. The suite picks it through
xdist's ``pytest_xdist_make_scheduler`` hook (tests/conftest.py); ``tests/test_xdist_scheduling.py``
checks that a run with a dying test ends and reports it."""

from __future__ import annotations

# group name: the node-id prefixes of its tests
GROUPS = {
    # tests that start a cluster runtime (Ray, Dask; each sized to the machine's CPUs, and a module's
    # runtime is shared by its tests): two Ray runtimes at once would each claim every CPU
    "cluster": ("tests/cluster/", "tests/test_benchmarks.py::test_cluster_benchmark_smoke_run"),
    # the mypy runs share a cache folder: two mypy processes writing one cache end in mypy's
    # internal error
    "mypy": ("tests/test_typing.py::",),
}


def group_of(nodeid, groups=GROUPS):
    """The name of the group *nodeid* belongs to, or None."""
    return next((name for name, prefixes in groups.items() if nodeid.startswith(prefixes)), None)


def make_scheduler(config, log, groups=GROUPS):
    """The scheduler for ``--dist loadgroup``; None (xdist's own) for any other mode."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class CrashSafeLoadGroup(LoadGroupScheduling):
        def _split_scope(self, nodeid):
            # a work unit: a group's tests, or one test
            group = group_of(nodeid, groups)
            return nodeid if group is None else f"@{group}"

        def remove_node(self, node):
            workload = self.assigned_work.pop(node)
            unfinished = [(scope, unit) for scope, unit in workload.items() if not all(unit.values())]
            if not unfinished:
                return None
            # xdist sends a node its tests in queue order and the node runs them in that order: the
            # first unfinished one is the test the node died in. It is reported failed by xdist;
            # running it again would only take the next worker down.
            crashitem = next(nodeid for _, unit in unfinished for nodeid, done in unit.items() if not done)
            for _, unit in unfinished:
                if crashitem in unit:
                    unit[crashitem] = True
            for scope, unit in reversed(unfinished):
                if not all(unit.values()):
                    self.workqueue[scope] = unit
                    self.workqueue.move_to_end(scope, last=False)  # next in line, as they were
            for other in self.assigned_work:
                self._reschedule(other)
            return crashitem

        def _reschedule(self, node):
            if node.shutting_down or node not in self.registered_collections:
                # a new worker whose collection has not come yet (another's finishing collection
                # reschedules every node): it is scheduled when its own collection comes
                return
            # As xdist: a node is given work while it holds two pending tests or fewer; but until it
            # holds more than that (it runs a test only once it has the next one), not one unit.
            while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
                try:
                    self._assign_work_unit(node)
                except OSError:
                    # The node died after reporting its last test (the next one killed it), before
                    # this reached it: the unit is in its assigned work, which its "node down"
                    # event, next, puts back on the queue (remove_node).
                    return
            if not self.workqueue:
                node.shutdown()

    return CrashSafeLoadGroup(config, log)

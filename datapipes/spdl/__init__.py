"""SPDL's spelling on the datapipes engine: code written for SPDL 0.8 runs with a change of import.

.. code-block:: python

    # before
    from spdl.pipeline import PipelineBuilder, Pipeline, PipelineFailure
    from spdl.pipeline.defs import Aggregator
    from spdl.dataloader import DataLoader
    # after
    from datapipes.spdl import PipelineBuilder, Pipeline, PipelineFailure, Aggregator, DataLoader

:class:`PipelineBuilder` takes SPDL's methods, parameters and defaults (``pipe()`` in completion
order, a failing item logged and dropped, ``None`` results dropped) and builds an ordinary pipe:
``IterableWrapper -> map/flatmap -> batch -> ... -> prefetch``, held by the :class:`Pipeline` it
returns as ``pipeline.pipe``. So whatever works on a pipe works on an SPDL pipeline:
``datapipes.profile(pipeline.pipe)``, ``it.state_dict()`` of a pass, ``datapipes.DataLoader`` and
torch's ``DataLoader``, hooks and thread budgets.

>>> from datapipes.spdl import PipelineBuilder
>>> pipeline = (
...     PipelineBuilder()
...     .add_source(range(12))
...     .pipe(lambda x: 2 * x)
...     .pipe(lambda x: x + 1)
...     .aggregate(3)
...     .add_sink(3)
...     .build(num_threads=1)
... )
>>> with pipeline.auto_stop():
...     for item in pipeline:
...         print(item)
[1, 3, 5]
[7, 9, 11]
[13, 15, 17]
[19, 21, 23]
>>> pipeline.pipe
IterableWrapper -> Mapper(<lambda>) -> Filter(not_none) -> Mapper(<lambda>) -> Filter(not_none) -> Batcher(3) -> Prefetcher(3)

Where it differs from SPDL 0.8:

- ``num_threads`` caps the worker threads of all stages together (``set_budget``); each concurrent
  stage owns its threads, within that budget, instead of sharing one pool.
- ``build(max_failures=k)`` gives each stage a budget of ``k`` failures (SPDL counts all stages'
  failures against one budget); a ``Fraction`` (a failure rate) is not supported. Past the budget
  the pass fails with :class:`PipelineFailure` holding SPDL's ``RuntimeError``.
- ``pipe(gen_fn, output_order="input")`` with a synchronous generator function yields its items in
  input order (SPDL 0.8 fails every such call).
- Not provided: ``PipelineBuilder.to()`` and ``path_variants()``, ``get_config()``, custom queue
  classes and SPDL's ``TaskHook`` classes (:mod:`datapipes.hooks` instead), ``build_pipeline``
  and the ``spdl.pipeline.defs`` configurations, ``run_pipeline_in_subprocess``,
  ``iterate_in_subprocess``, ``spdl.io``.
"""

from ._builder import Aggregator, PipelineBuilder
from ._dataloader import DataLoader
from ._pipeline import Pipeline, PipelineFailure

__all__ = ["Aggregator", "DataLoader", "Pipeline", "PipelineBuilder", "PipelineFailure"]

"""The DataLoader adapter: a pipe in, batched tensors on the device out.

:class:`DataLoader` builds one pipe from what it is given and runs it. It builds torch's spelling;
SPDL's is translated into it (:mod:`.spdl_spelling`):

- torch's: ``DataLoader(pipe, batch_size=32, collate_fn=..., pin_memory=True, device="cuda",
  num_workers=2, seed=0)``: ``batch -> collate -> pin_memory -> to_device`` after your pipe, the pipe
  run in the calling process (``num_workers=0``) or in worker processes each holding a shard;
- SPDL's (``spdl.dataloader.DataLoader``): ``DataLoader(src, preprocessor=fn, batch_size=32,
  aggregator=fn, transfer_fn=fn, buffer_size=3, num_threads=8, timeout=None, output_order="input")``:
  ``concurrent map (or flatmap) -> batch -> aggregate -> transfer on one thread -> buffer``.

>>> from datapipes.loader import DataLoader
>>> list(DataLoader(range(7), preprocessor=lambda x: x * 10, batch_size=3))
[[0, 10, 20], [30, 40, 50], [60]]

The package, one module per concern (each imports only those listed before it):

- :mod:`.buffer`: :class:`TimedBuffer`, the buffer whose consumer waits at most ``timeout``;
- :mod:`.distributed`: agreement across ranks: the loader's seed (broadcast from rank 0), the seeds
  of each shard, equal batch counts (``even_batches``);
- :mod:`.arguments`: the checks of the arguments both spellings share;
- :mod:`.spdl_spelling`: SPDL's spelling translated into torch's: the pipe of its stages and the
  loader's keywords;
- :mod:`.shards`: where each shard of a pass (a worker process, or the loader's own process) stands,
  the states the loader keeps of them, and resuming a state with another number of workers or
  ranks;
- :mod:`.workers`: :class:`WorkerProcesses`, torch's DataLoader running the pipe in worker processes;
- :mod:`.dataloader`: the public :class:`DataLoader`: the pipe it builds, its passes and states.
"""

from .buffer import TimedBuffer
from .dataloader import DataLoader
from .workers import WorkerProcesses

__all__ = ["DataLoader"]

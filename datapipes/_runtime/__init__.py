"""The pass runtime: what runs while a pipe is iterated (docs/architecture.rst, "The pass").

- ``traits``: every trait a stage declares to the runtime (``Traits``), with its default;
- ``passes``: the pass itself (``Pass``, ``PassIterator``, ``configured``), its stages' runs and
  their state (``state_dict``/``load_state_dict``);
- ``shares``: what a stage takes from the pass building it (threads, processes, CPUs, hooks);
- ``tuning``: the pass's thread, memory and process budget, and the tuner of ``concurrency="auto"``;
- ``observe``: statistics, hooks and reporters watching a pass;
- ``worker``: where a pass runs (distributed rank x DataLoader worker) and its shard;
- ``seeds``: seeds derived per pass and stage;
- ``held``: streams held by a stage, saved by where they came from;
- ``validate``: the checks of a loaded state (types, ranges), errors naming the stage.

Nothing is imported here: each module is imported by name, so the layers below the base classes
never pull in more of the runtime than they use.
"""

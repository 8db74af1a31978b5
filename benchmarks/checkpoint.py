"""Checkpoint cost: how long ``state_dict()`` takes, how big the state is, and how long a resumed pass
takes to yield its first item, for a pipe with a 10,000-item shuffle buffer stopped after 20,000 of
100,000 items. Side by side in one run:

- datapipes: ``it.state_dict()`` of the pass; a resumed pass positions its source by index and
  restores the buffer and the generator's state, so resuming costs the same wherever it stopped;
- torchdata's ``StatefulDataLoader`` over the same pipe written with ``torch.utils.data.datapipes``
  (num_workers=0): torch DataPipes keep no state of their own, so its state is small and a resumed
  loader replays the items already yielded (its cost grows with the stopping point).

Run:  .venv-bench/bin/python benchmarks/checkpoint.py        (bash benchmarks/setup.sh first)
      .venv/bin/python benchmarks/checkpoint.py              (datapipes alone)
"""

from __future__ import annotations

import argparse
import io
import pickle
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the datapipes of this checkout

import torch  # noqa: E402

from datapipes.iter import IterableWrapper  # noqa: E402

ITEMS = 100_000
BUFFER = 10_000


PATHS = [f"/data/train/img_{i:07d}.jpg" for i in range(ITEMS)]  # made once, shared by every build


def sizes(state: Any) -> tuple[int, int]:
    """(pickle bytes, torch.save bytes) of a state."""
    buf = io.BytesIO()
    torch.save(state, buf)
    return len(pickle.dumps(state)), buf.tell()


def median_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def datapipes_system(stop: int, repeats: int) -> dict[str, float]:
    def build() -> Any:
        return IterableWrapper(PATHS).shuffle(buffer_size=BUFFER).set_seed(0)

    it = iter(build())
    head = [next(it) for _ in range(stop)]
    save = median_time(it.state_dict, repeats)
    state = it.state_dict()
    expected = next(it)

    def resume() -> Any:
        again = iter(build())
        again.load_state_dict(state)
        first = next(again)
        again.close()
        return first

    first = resume()
    assert first == expected and len(head) == stop, "datapipes did not resume where it stopped"
    pickled, saved = sizes(state)
    return {"state_dict_ms": save * 1e3, "pickle_kib": pickled / 1024, "torch_save_kib": saved / 1024,
            "resume_ms": median_time(resume, repeats) * 1e3}


def torchdata_system(stop: int, repeats: int) -> dict[str, float] | str:
    try:
        from torch.utils.data.datapipes.iter import IterableWrapper as TorchWrapper
        from torchdata.stateful_dataloader import StatefulDataLoader
    except ImportError as e:
        return f"not importable ({e}); run bash benchmarks/setup.sh and use .venv-bench/bin/python"

    def build() -> Any:
        pipe = TorchWrapper(PATHS).shuffle(buffer_size=BUFFER)
        return StatefulDataLoader(pipe, batch_size=None, num_workers=0, shuffle=True,
                                  generator=torch.Generator().manual_seed(0))

    loader = build()
    it = iter(loader)
    for _ in range(stop):
        next(it)
    save = median_time(loader.state_dict, repeats)
    state = loader.state_dict()
    expected = next(it)

    def resume() -> Any:
        again = build()
        again.load_state_dict(state)
        with warnings.catch_warnings():  # "naively fast-forwarding your dataset by N steps": measured here
            warnings.simplefilter("ignore")
            return next(iter(again))

    first = resume()
    same = first == expected
    pickled, saved = sizes(state)
    out: dict[str, float] = {"state_dict_ms": save * 1e3, "pickle_kib": pickled / 1024, "torch_save_kib": saved / 1024,
                             "resume_ms": median_time(resume, repeats) * 1e3}
    if not same:
        out["resumed_elsewhere"] = 1.0
    return out


def main(argv: list[str] | None = None) -> int:
    warnings.filterwarnings("ignore", message="'set_vital' is deprecated")  # torchdata's, on torch 2.13
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stops", type=int, nargs="+", default=[20_000, 80_000],
                        help="items yielded before the state is taken (default 20,000 and 80,000)")
    parser.add_argument("--repeats", type=int, default=5, help="repeats per measure; the median is shown")
    args = parser.parse_args(argv)
    print(f"shuffle(buffer_size={BUFFER:,}) over {ITEMS:,} paths; medians of {args.repeats} repeats")
    print(f"  {'system':44s} {'stop':>7s} {'state_dict':>11s} {'pickle':>9s} {'torch.save':>11s} {'resume':>9s}")
    for stop in args.stops:
        for name, run in (("datapipes pass", datapipes_system),
                          ("torchdata StatefulDataLoader + torch DataPipes", torchdata_system)):
            got = run(stop, args.repeats)
            if isinstance(got, str):
                print(f"  {name:44s} {stop:7,d} skipped: {got}")
                continue
            note = "  (resumed at a different item)" if got.get("resumed_elsewhere") else ""
            print(f"  {name:44s} {stop:7,d} {got['state_dict_ms']:8.2f} ms {got['pickle_kib']:6.0f} KiB "
                  f"{got['torch_save_kib']:7.0f} KiB {got['resume_ms']:6.1f} ms{note}")
    print("a 2-worker DataLoader: datapipes.DataLoader cannot save a state with num_workers > 0 yet (issue 10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

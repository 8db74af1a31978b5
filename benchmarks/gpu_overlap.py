"""GPU benchmark (docs/performance.rst, "Targets"; issue 5): is the host-to-device copy of ``to_cuda`` overlapped?

    .venv/bin/python benchmarks/gpu_overlap.py                    # on a CUDA machine
    .venv/bin/python benchmarks/gpu_overlap.py --images 4000 --concurrency 8 --repeats 5
    .venv/bin/python benchmarks/gpu_overlap.py --device cpu --images 64 --repeats 1   # smoke run, no GPU

``bash scripts/device-check.sh`` runs it with its defaults, beside the GPU tests and
``end_to_end.py``.

Two workloads, every system in this one process, repeats interleaved, medians reported:

1. **end to end** (the issue's figure): ``benchmarks/end_to_end.py``'s JPEG folder (generated,
   ``datapipes._demo_data``, seed 0) -> ``open_files`` -> decode + resize to 224 (``concurrency=C``
   threads) -> ``batch(32)`` -> ``collate()`` -> ``pin_memory()``, then

   - ``CPU only``: the batches stay on the host (the consumer only touches them);
   - ``to_cuda``: ``.to_cuda()``, and the consumer runs a small step on every batch on the device
     (``float``, scale, mean) and reads the result back with ``.item()``: a synchronising consumer,
     the worst case for overlap;
   - ``torch reference``: ``torch.utils.data.DataLoader(num_workers=2, pin_memory=True)`` over a
     map-style dataset of the same files, then ``.to(device, non_blocking=True)`` and the same step;
   - ``batch -> to_cuda``: the brief's spelling, ``batch(32).to_cuda()`` with no ``collate()`` or
     ``pin_memory()``: ``to_cuda`` collates each list of decoded arrays and pins the batch itself
     (on the consumer's thread, one batch ahead), then the same step. It shows what the shorter
     chain costs against the one with a pinning thread.

   Target: ``to_cuda`` batches/s within 10% of ``CPU only`` (ratio >= 0.90).

2. **copy vs compute** (what the side stream buys): 64 pre-built pinned uint8 batches
   ``(32, 3, 224, 224)`` and a device step that costs about as much as one copy (a matmul sized at
   start-up). ``serial``: the consumer copies each batch itself (``.to(device, non_blocking=True)``
   on the current stream) then runs the step, so the copy and the step take turns; ``to_cuda``:
   ``IterableWrapper(batches, deepcopy=False).to_cuda()`` copies on its own stream ahead of the
   consumer. With overlap, ``to_cuda``'s time per batch approaches ``max(copy, step)`` instead of
   ``copy + step``. ``deepcopy=False``: the wrapper's default (torch's) deep-copies every item at
   every pass, here each pinned batch into unpinned memory that ``to_cuda`` would pin again, and that
   copy, not the transfer, would be measured (docs/howto/gpu.rst, "Pinned batches in an
   IterableWrapper").

``--device cuda`` (the default) is the current CUDA device: batches are compared with it by type
and index, so ``cuda`` and ``cuda:0`` are the same device when device 0 is the current one.

With ``--device cpu`` (no GPU) workload 1 runs ``to_device("cpu")`` in place of ``to_cuda`` (the
``batch -> to_device`` system then collates and moves nothing) and workload 2 runs 4 unpinned
batches through ``to_device("cpu")`` and a small step: it checks that the script runs, it measures
nothing about GPUs. Without CUDA and without ``--device cpu`` the script says so and exits with
status 2.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

from end_to_end import BATCH, JpegFolder, load_pair  # noqa: E402

TARGET = 0.90


def resolve(device: torch.device) -> torch.device:
    """``device`` with its index: a CUDA device without one is the current CUDA device, as
    ``to_cuda`` and ``Tensor.to`` take it (a tensor's ``.device`` always has the index)."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def same_device(a: torch.device, b: torch.device) -> bool:
    """Whether ``a`` and ``b`` are one device, by type and index (``cuda`` is ``cuda:0`` when 0 is current)."""
    a, b = resolve(a), resolve(b)
    return (a.type, a.index) == (b.type, b.index)


def step_fn(device: torch.device) -> Callable[[torch.Tensor], float]:
    """The consumer's per-batch work: a tiny step on the batch's device, synchronised by ``.item()``."""

    def step(batch: torch.Tensor) -> float:
        if not same_device(batch.device, device):
            raise SystemExit(f"expected a batch on {device}, got one on {batch.device}")
        return batch.float().mul_(1 / 255).mean().item()

    return step


def datapipes_pipe(root: str, c: int) -> Any:
    from datapipes.iter import FileLister

    return (FileLister(root, "*.jpg", recursive=True).open_files(mode="b").map(load_pair, concurrency=c)
            .batch(BATCH).collate().pin_memory())


def run_cpu_only(root: str, c: int, device: torch.device) -> int:
    n = 0
    for batch in datapipes_pipe(root, c):
        n += int(batch.shape[0] > 0)
    return n


def run_to_device(root: str, c: int, device: torch.device) -> int:
    pipe = datapipes_pipe(root, c)
    pipe = pipe.to_cuda(device) if device.type == "cuda" else pipe.to_device(device)
    step, n = step_fn(device), 0
    for batch in pipe:
        step(batch)
        n += 1
    return n


def run_batch_to_device(root: str, c: int, device: torch.device) -> int:
    from datapipes.iter import FileLister

    pipe = FileLister(root, "*.jpg", recursive=True).open_files(mode="b").map(load_pair, concurrency=c).batch(BATCH)
    pipe = pipe.to_cuda(device) if device.type == "cuda" else pipe.to_device(device)  # collates (and pins) itself
    step, n = step_fn(device), 0
    for batch in pipe:
        step(batch)
        n += 1
    return n


def run_torch_reference(root: str, c: int, device: torch.device) -> int:
    from torch.utils.data import DataLoader

    loader = DataLoader(JpegFolder(root), batch_size=BATCH, num_workers=2, pin_memory=device.type == "cuda")  # type: ignore[arg-type]
    step, n = step_fn(device), 0
    for batch in loader:
        step(batch.to(device, non_blocking=True))
        n += 1
    return n


def timed(run: Callable[[], int]) -> tuple[float, int]:
    t = time.perf_counter()
    n = run()
    return time.perf_counter() - t, n


def end_to_end(root: str, c: int, device: torch.device, repeats: int) -> bool:
    systems: dict[str, Callable[[], int]] = {
        "datapipes, CPU only (pin_memory)": lambda: run_cpu_only(root, c, device),
        f"datapipes + to_{'cuda' if device.type == 'cuda' else 'device(cpu)'} + step": lambda: run_to_device(root, c, device),
        "torch DataLoader(2, pin_memory) + .to() + step": lambda: run_torch_reference(root, c, device),
        ("datapipes batch -> to_cuda (collates, pins) + step" if device.type == "cuda"
         else "datapipes batch -> to_device(cpu) (collates) + step"):
            lambda: run_batch_to_device(root, c, device),
    }
    times: dict[str, list[float]] = {k: [] for k in systems}
    batches = 0
    for r in range(repeats):
        for name, run in systems.items():
            dt, batches = timed(run)
            times[name].append(dt)
        print(f"  repeat {r + 1}/{repeats} done", file=sys.stderr, flush=True)
    print(f"\n1. end to end ({batches} batches of {BATCH}, concurrency {c}, medians of {repeats})")
    print(f"  {'system':<56} {'batches/s':>10} {'vs CPU only':>12}")
    rates = {k: batches / statistics.median(v) for k, v in times.items()}
    base = next(iter(rates.values()))
    for name, rate in rates.items():
        print(f"  {name:<56} {rate:>10.1f} {rate / base:>11.2f}x")
    ratio = list(rates.values())[1] / base
    if device.type != "cuda":
        print(f"  (smoke run on the CPU: {ratio:.2f}x, no verdict)")
        return True
    ok = ratio >= TARGET
    print(f"  target: to_cuda >= {TARGET:.2f}x CPU only: {ratio:.2f}x {'PASS' if ok else 'FAIL'}")
    return ok


def copy_vs_compute(device: torch.device, repeats: int, n_batches: int = 64, mm: int = 1024) -> None:
    """Workload 2. On the CPU (a smoke run) the batches are not pinned and nothing is synchronised."""
    from datapipes.iter import IterableWrapper

    cuda = device.type == "cuda"

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize(device)

    def batch() -> torch.Tensor:
        b = torch.randint(0, 255, (BATCH, 3, 224, 224), dtype=torch.uint8)
        return b.pin_memory() if cuda else b

    host = [batch() for _ in range(n_batches)]

    def copy_time() -> float:
        sync()
        t = time.perf_counter()
        for b in host:
            b.to(device, non_blocking=True)
        sync()
        return (time.perf_counter() - t) / n_batches

    per_copy = statistics.median(copy_time() for _ in range(3))
    # A matmul whose time is about one copy's: size it from a measured mm^3 matmul.
    w = torch.randn(mm, mm, device=device)
    sync()
    t = time.perf_counter()
    for _ in range(20):
        w @ w
    sync()
    per_mm = (time.perf_counter() - t) / 20
    reps = max(1, round(per_copy / per_mm))

    def step(batch: torch.Tensor) -> float:
        acc = batch[0, 0, :1, :1].float()
        for _ in range(reps):
            acc = acc + (w @ w)[:1, :1]
        return acc.sum().item()

    def serial() -> int:
        for b in host:
            step(b.to(device, non_blocking=True))
        return n_batches

    def overlapped() -> int:
        # deepcopy=False: the default deep copy would turn each pinned batch into an unpinned one at
        # every pass, and time that copy instead of the transfer (docs/howto/gpu.rst).
        source = IterableWrapper(host, deepcopy=False)
        for b in source.to_cuda(device) if cuda else source.to_device(device):
            step(b)
        return n_batches

    def compute_only() -> int:
        dev = host[0].to(device)
        for _ in host:
            step(dev)
        return n_batches

    moved = "to_cuda (side stream) then step" if cuda else "to_device(cpu) then step"
    systems = {"step only (no copy)": compute_only, "serial: .to(device) then step": serial, moved: overlapped}
    times: dict[str, list[float]] = {k: [] for k in systems}
    for _ in range(repeats):
        for name, run in systems.items():
            sync()
            dt, _ = timed(run)
            times[name].append(dt / n_batches)
    print(f"\n2. copy vs compute ({n_batches} {'pinned' if cuda else 'unpinned'} batches of {BATCH}x3x224x224 uint8; "
          f"one copy {per_copy * 1e3:.2f} ms, step = {reps} matmul(s) of {mm}^3, medians of {repeats})")
    print(f"  {'system':<40} {'ms/batch':>9}")
    med = {k: statistics.median(v) for k, v in times.items()}
    for name, value in med.items():
        print(f"  {name:<40} {value * 1e3:>9.2f}")
    if not cuda:
        print("  (smoke run on the CPU: nothing is copied, no figure)")
        return
    hidden = (med["serial: .to(device) then step"] - med[moved]) / max(per_copy, 1e-9)
    print(f"  copy time hidden by to_cuda: {hidden:.0%} of one copy")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=1000, help="JPEGs to generate (default 1000)")
    parser.add_argument("--concurrency", type=int, default=None, help="decode threads (default: CPUs, at most 8)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default=None,
                        help="cuda device (default: cuda, the current one) or 'cpu' for a smoke run")
    parser.add_argument("--data", default=None, help="use the JPEGs under DIR instead of generating them")
    args = parser.parse_args()
    try:
        device = torch.device(args.device if args.device is not None else "cuda")
    except RuntimeError as e:
        parser.error(f"--device {args.device}: not a torch device ({e})")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_overlap.py: CUDA is not available (torch.cuda.is_available() is False); this benchmark needs a "
              "GPU. Use --device cpu for a smoke run.", file=sys.stderr)
        return 2
    device = resolve(device)  # "cuda" -> "cuda:<current>": the device the batches will report
    c = args.concurrency or max(2, min(8, os.cpu_count() or 1))
    name = "CPU (smoke run: no GPU figure)"
    if device.type == "cuda":
        name = f"{device} ({torch.cuda.get_device_name(device)})"
    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {os.cpu_count()} CPUs, device {name}")
    with tempfile.TemporaryDirectory(prefix="datapipes-gpu-") as tmp:
        root = args.data
        if root is None:
            from datapipes._demo_data import make_dataset

            make_dataset(tmp, args.images, seed=0)
            root = tmp
        ok = end_to_end(root, c, device, args.repeats)
    if device.type == "cuda":
        copy_vs_compute(device, args.repeats)
    else:
        copy_vs_compute(device, 1, n_batches=4, mm=128)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

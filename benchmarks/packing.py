"""LLM text pipelines (issue 39): packing, tokenizing, the whole loader, and resume, side by side.

Workloads (``--only`` picks some; every figure is a median over ``--repeats`` runs, the systems of a
workload interleaved repeat by repeat, all in this one process unless said otherwise):

- ``pack``: 200,000 synthetic documents (int32 tokens, log-normal lengths with a median of about 400
  tokens, capped at ``seq_len`` 4096), packed in one process: document tokens per second and the
  padding share of each strategy of ``pack_tokens`` beside Grain's packer for it
  (``ConcatThenSplitIterDataset``, ``FirstFitPackIterDataset``, ``BestFitPackIterDataset`` with
  ``shuffle_bins=False``), the same number of open rows (``--bins``) for both. Targets: each
  strategy at least Grain's rate; ``best_fit`` padding no worse than Grain's best fit.
- ``tokenize``: generated English-like documents (about 400 words) through a BPE tokenizer the script
  trains (``tokenizers``, 8,000 tokens): ``tokenize(tok, concurrency=2)`` against its limit, a plain
  loop of ``Tokenizer.encode_batch`` over the same documents in batches of the stage's size. Target:
  at least 90% of the limit's tokens/s.
- ``e2e``: JSONL files -> tokenize -> ``pack_tokens`` (concat) -> batches of 8 rows ->
  ``datapipes.DataLoader(num_workers=2)``, beside a hand-written torch ``IterableDataset`` doing the
  same (its workers split the files) under ``torch.utils.data.DataLoader(num_workers=2)``. Target:
  ahead of it in tokens/s.
- ``resume``: states taken at ``--points`` random batches of the ``e2e`` pipe (``num_workers`` 0 and
  2) each resumed in a fresh loader: the rest of the stream must equal the uninterrupted one
  (exit 1 if not); the median size of a saved state (``torch.save``) in bytes.

Grain is installed in the benchmark environment only (benchmarks/requirements.txt); without it its
rows say "not installed". ``tokenizers`` is the ``[text]`` extra.

    .venv-bench/bin/python benchmarks/packing.py                 # everything
    .venv-bench/bin/python benchmarks/packing.py --only pack --docs 50000 --repeats 3

``--json PATH`` writes the figures (benchmarks/_results.py's schema). Exit status 1 when a target
is missed or a resumed stream differs.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Iterator

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks import _results  # noqa: E402
from benchmarks.concurrency import timings  # noqa: E402

STRATEGIES = ("concat", "first_fit", "best_fit")
GRAIN_PACKERS = {"concat": "ConcatThenSplitIterDataset", "first_fit": "FirstFitPackIterDataset",
                 "best_fit": "BestFitPackIterDataset"}
WORKLOADS: list[dict[str, Any]] = []
FAILED: list[str] = []


def say(text: str = "") -> None:
    print(text, flush=True)




# -- pack -----------------------------------------------------------------------------------------


def make_documents(n: int, seq_len: int, seed: int = 0) -> list[np.ndarray]:
    """``n`` int32 documents with log-normal lengths (median about 400, sigma 1), 1 to ``seq_len``."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.exp(rng.normal(np.log(400), 1.0, n)).astype(np.int64), 1, seq_len)
    tokens = rng.integers(1, 50_000, int(lengths.sum()), dtype=np.int32)
    return np.split(tokens, np.cumsum(lengths)[:-1])


def ours(docs: list[np.ndarray], seq_len: int, strategy: str, bins: int) -> Callable[[], Iterator[dict[str, Any]]]:
    from datapipes.iter import IterableWrapper

    source = IterableWrapper(docs, deepcopy=False)
    pipe = (source.pack_tokens(seq_len) if strategy == "concat"
            else source.pack_tokens(seq_len, strategy=strategy, num_bins=bins))
    return lambda: iter(pipe)


def grain_packer(docs: list[np.ndarray], seq_len: int, strategy: str,
                 bins: int) -> Callable[[], Iterator[dict[str, Any]]] | None:
    try:
        import grain
        from grain import experimental
    except ImportError:
        return None
    items = [{"tokens": d} for d in docs]  # built once: Grain packs dicts of features
    cls = getattr(experimental, GRAIN_PACKERS[strategy])

    def run() -> Iterator[dict[str, Any]]:
        ds = grain.MapDataset.source(items).to_iter_dataset()
        if strategy == "concat":
            ds = cls(ds, length_struct={"tokens": seq_len})
        else:
            ds = cls(ds, length_struct={"tokens": seq_len}, num_packing_bins=bins, shuffle_bins=False)
        return iter(ds)

    return run


def segments(row: dict[str, Any]) -> np.ndarray:
    return row["segment_ids"] if "segment_ids" in row else row["tokens_segment_ids"]


def padding_share(rows: Iterator[dict[str, Any]]) -> tuple[float, int]:
    pad = total = n = 0
    for row in rows:
        seg = segments(row)
        pad += int((seg == 0).sum())
        total += seg.size
        n += 1
    return pad / max(total, 1), n


def drain(make: Callable[[], Iterator[Any]]) -> Callable[[], None]:
    def run() -> None:
        for _ in make():
            pass
    return run


def bench_pack(args: argparse.Namespace) -> None:
    docs = make_documents(args.docs, args.seq_len)
    n_tokens = int(sum(d.size for d in docs))
    lengths = np.array([d.size for d in docs])
    say(f"pack: {len(docs):,} documents, {n_tokens:,} tokens (median length {int(np.median(lengths))}, "
        f"mean {lengths.mean():.0f}), seq_len {args.seq_len}, {args.bins} open rows for the fit strategies, "
        f"{args.repeats} repeats")
    for strategy in STRATEGIES:
        w = {"name": f"pack_{strategy}", "title": f"pack_tokens strategy={strategy!r} beside Grain's "
             f"{GRAIN_PACKERS[strategy]}", "unit": "tokens/s", "baseline": "grain", "systems": [], "targets": []}
        makers: dict[str, Callable[[], Iterator[Any]]] = {"datapipes": ours(docs, args.seq_len, strategy, args.bins)}
        peer = grain_packer(docs, args.seq_len, strategy, args.bins)
        if peer is not None:
            makers["grain"] = peer
        pads = {name: padding_share(make()) for name, make in makers.items()}  # untimed: checks and padding
        times = timings({name: drain(make) for name, make in makers.items()}, args.repeats)
        say(f"\n| {strategy:9} | tokens/s | vs Grain | rows | padding |")
        rates = {}
        for name in ("datapipes", "grain"):
            if name not in makers:
                w["systems"].append(_results.system(name, "peer", None, status="not installed"))
                say(f"| {name:9} | not installed (grain: benchmarks/requirements.txt) |")
                continue
            med = statistics.median(times[name])
            rates[name] = n_tokens / med
            share, rows = pads[name]
            w["systems"].append(_results.system(
                name, "datapipes" if name == "datapipes" else "peer", rates[name],
                runs=[n_tokens / t for t in times[name]], padding_share=share, rows=rows))
        for name, rate in rates.items():
            ratio = f"{rate / rates['grain']:.2f}x" if "grain" in rates else "-"
            say(f"| {name:9} | {rate:12,.0f} | {ratio:>6} | {pads[name][1]:,} | {pads[name][0]:.2%} |")
        if "grain" in rates:
            _results.target(
                w, FAILED, f"{strategy}: datapipes >= Grain's tokens/s", rates["datapipes"] / rates["grain"],
                   rates["datapipes"] >= rates["grain"])
            if strategy == "best_fit":
                _results.target(
                    w, FAILED, "best_fit: padding no worse than Grain's best fit", pads["datapipes"][0],
                       pads["datapipes"][0] <= pads["grain"][0] + 1e-9)
        WORKLOADS.append(_results.add_ratios(w))


# -- tokenize -------------------------------------------------------------------------------------


WORDS = ("the of and to in is was for on that with as by at from his her an are were which this be "
         "has had not but they their its one all been more also who into after first new two other some "
         "time year people world state city school group family music government history system").split()


def make_texts(n: int, words: int, seed: int = 1) -> list[str]:
    """``n`` English-like texts of about ``words`` words (common words and made-up ones)."""
    rng = random.Random(seed)
    vocab = WORDS + ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(3, 9)))
                     for _ in range(2000)]
    return [" ".join(rng.choices(vocab, k=max(1, int(rng.gauss(words, words / 4))))) for _ in range(n)]


def train_tokenizer(texts: list[str], vocab_size: int = 8000) -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(texts[:2000], trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["[UNK]", "</s>"],
                                                               show_progress=False))
    return tok


def bench_tokenize(args: argparse.Namespace) -> None:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        say("tokenize: not run: tokenizers is not installed (the [text] extra)")
        return
    from datapipes.iter import IterableWrapper
    from datapipes.iter.tokenize import DEFAULT_BATCH_SIZE

    texts = make_texts(args.texts, 400)
    tok = train_tokenizer(texts)
    bs = DEFAULT_BATCH_SIZE
    encode = getattr(tok, "encode_batch_fast", None) or tok.encode_batch
    n_tokens = sum(len(e.ids) for e in encode(texts))

    def limit() -> None:
        for i in range(0, len(texts), bs):
            [e.ids for e in encode(texts[i:i + bs])]

    source = IterableWrapper(texts, deepcopy=False)
    stage = source.tokenize(tok, concurrency=2)
    serial = source.tokenize(tok)
    assert all((a == np.asarray(e.ids)).all() for a, e in zip(stage, encode(texts)))
    runs = {"limit": limit, "datapipes": drain(lambda: iter(stage)), "datapipes serial": drain(lambda: iter(serial))}
    times = timings(runs, args.repeats)
    rates = {k: n_tokens / statistics.median(v) for k, v in times.items()}
    w = {"name": "tokenize", "title": f"tokenize: {len(texts):,} texts, {n_tokens:,} tokens, BPE 8,000, batches of {bs}",
         "unit": "tokens/s", "baseline": "limit", "systems": [], "targets": []}
    say(f"tokenize: {len(texts):,} texts of about 400 words, {n_tokens:,} tokens, batches of {bs}, "
        f"{os.cpu_count()} CPUs (tokenizers' own pool), {args.repeats} repeats")
    say("| system | tokens/s | of the limit |")
    names = {"limit": "limit: a loop of encode_batch", "datapipes": "tokenize(tok, concurrency=2)",
             "datapipes serial": "tokenize(tok)"}
    for k, rate in rates.items():
        say(f"| {names[k]} | {rate:,.0f} | {rate / rates['limit']:.0%} |")
        w["systems"].append(_results.system(names[k], "limit" if k == "limit" else "datapipes", rate,
                                            runs=[n_tokens / t for t in times[k]]))
    w["baseline"] = names["limit"]
    _results.target(
        w, FAILED, "tokenize(concurrency=2) >= 90% of the encode_batch loop", rates["datapipes"] / rates["limit"],
           rates["datapipes"] >= 0.9 * rates["limit"])
    WORKLOADS.append(_results.add_ratios(w))


# -- the whole loader -------------------------------------------------------------------------------


def write_shards(root: str, texts: list[str], shards: int) -> list[str]:
    paths = []
    for k in range(shards):
        path = os.path.join(root, f"shard-{k:03d}.jsonl")
        with open(path, "w") as f:
            for text in texts[k::shards]:
                f.write(json.dumps({"text": text}) + "\n")
        paths.append(path)
    return paths


def our_pipe(root: str, tok: Any, seq_len: int, batch: int) -> Any:
    from operator import itemgetter

    from datapipes.iter import FileLister, collate_packed

    eos = tok.token_to_id("</s>")
    return (FileLister(root, masks="*.jsonl").sharding_filter()
            .open_files(mode="b").readlines(return_path=False).map(json.loads)
            .tokenize(tok, field="text", eos_id=eos)
            .map(itemgetter("tokens"))
            .pack_tokens(seq_len)
            .batch(batch).map(collate_packed))


class HandWritten:
    """What a user writes without pack_tokens: a torch IterableDataset whose workers split the files,
    encode in batches, append EOS, concatenate and cut rows of ``seq_len`` with segment ids and
    positions, and collate ``batch`` rows into tensors. (Built lazily in the worker: the module is
    not importable by name from a spawned worker, so the class is defined at the top level.)"""

    def __init__(self, paths: list[str], tok: Any, seq_len: int, batch: int) -> None:
        self.paths, self.tok, self.seq_len, self.batch = paths, tok, seq_len, batch

    def __iter__(self) -> Iterator[dict[str, Any]]:
        import torch

        info = torch.utils.data.get_worker_info()
        paths = self.paths if info is None else self.paths[info.id::info.num_workers]
        eos = self.tok.token_to_id("</s>")
        encode = getattr(self.tok, "encode_batch_fast", None) or self.tok.encode_batch
        seq_len = self.seq_len
        buf: list[np.ndarray] = []  # pieces of the row being filled
        segs: list[np.ndarray] = []
        pos: list[np.ndarray] = []
        filled = 0
        rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

        def texts() -> Iterator[list[str]]:
            chunk: list[str] = []
            for path in paths:
                with open(path, "rb") as f:
                    for line in f:
                        chunk.append(json.loads(line)["text"])
                        if len(chunk) == 64:
                            yield chunk
                            chunk = []
            if chunk:
                yield chunk

        for chunk in texts():
            for e in encode(chunk):
                doc = np.array(e.ids + [eos], np.int32)
                start = 0
                while start < doc.size:
                    take = min(seq_len - filled, doc.size - start)
                    buf.append(doc[start:start + take])
                    segs.append(np.full(take, len(segs) + 1, np.int32))
                    pos.append(np.arange(start, start + take, dtype=np.int32))
                    filled += take
                    start += take
                    if filled == seq_len:
                        rows.append((np.concatenate(buf), np.concatenate(segs), np.concatenate(pos)))
                        buf, segs, pos, filled = [], [], [], 0
                        if len(rows) == self.batch:
                            yield self._collate(rows)
                            rows = []
        if filled:
            pad = seq_len - filled
            rows.append((np.concatenate(buf + [np.zeros(pad, np.int32)]),
                         np.concatenate(segs + [np.zeros(pad, np.int32)]),
                         np.concatenate(pos + [np.zeros(pad, np.int32)])))
        if rows:
            yield self._collate(rows)

    @staticmethod
    def _collate(rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> dict[str, Any]:
        import torch

        return {"tokens": torch.from_numpy(np.stack([r[0] for r in rows])),
                "segment_ids": torch.from_numpy(np.stack([r[1] for r in rows])),
                "positions": torch.from_numpy(np.stack([r[2] for r in rows]))}


def torch_iterable_dataset(paths: list[str], tok: Any, seq_len: int, batch: int) -> Any:
    import torch

    class Dataset(HandWritten, torch.utils.data.IterableDataset):
        pass

    Dataset.__module__ = __name__
    Dataset.__qualname__ = "HandWrittenDataset"
    globals()["HandWrittenDataset"] = Dataset
    return Dataset(paths, tok, seq_len, batch)


def delivered_tokens(batches: Iterator[dict[str, Any]]) -> int:
    return sum(int((b["segment_ids"] > 0).sum()) for b in batches)


def bench_e2e(args: argparse.Namespace) -> None:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        say("e2e: not run: tokenizers is not installed (the [text] extra)")
        return
    import torch

    import datapipes

    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # both loaders' workers encode on one CPU each
    texts = make_texts(args.texts, 400)
    tok = train_tokenizer(texts)
    with tempfile.TemporaryDirectory() as root:
        paths = write_shards(root, texts, args.shards)
        ours_loader = datapipes.DataLoader(our_pipe(root, tok, args.e2e_seq_len, 8), batch_size=None, num_workers=2)
        theirs = torch.utils.data.DataLoader(torch_iterable_dataset(paths, tok, args.e2e_seq_len, 8),
                                             batch_size=None, num_workers=2)
        n = {"datapipes": delivered_tokens(iter(ours_loader)), "torch": delivered_tokens(iter(theirs))}
        if n["datapipes"] != n["torch"]:
            FAILED.append(f"e2e: the loaders delivered {n['datapipes']:,} and {n['torch']:,} tokens")
        times = timings({"datapipes": drain(lambda: iter(ours_loader)), "torch": drain(lambda: iter(theirs))},
                        args.repeats)
    rates = {k: n[k] / statistics.median(v) for k, v in times.items()}
    names = {"datapipes": "datapipes.DataLoader(num_workers=2): tokenize -> pack_tokens -> batch(8)",
             "torch": "torch DataLoader(num_workers=2) over a hand-written IterableDataset"}
    w = {"name": "e2e", "title": f"JSONL ({args.shards} files, {len(texts):,} texts) -> tokenize -> pack "
         f"{args.e2e_seq_len} -> batch 8 -> DataLoader(num_workers=2)", "unit": "tokens/s",
         "baseline": names["torch"], "systems": [], "targets": []}
    say(f"e2e: {w['title']}, {n['datapipes']:,} tokens, {args.repeats} repeats")
    say("| system | tokens/s | vs torch |")
    for k, rate in rates.items():
        say(f"| {names[k]} | {rate:,.0f} | {rate / rates['torch']:.2f}x |")
        w["systems"].append(_results.system(names[k], "datapipes" if k == "datapipes" else "reference", rate,
                                            runs=[n[k] / t for t in times[k]]))
    _results.target(
        w, FAILED, "e2e: datapipes ahead of the hand-written torch loader", rates["datapipes"] / rates["torch"],
           rates["datapipes"] > rates["torch"])
    WORKLOADS.append(_results.add_ratios(w))


# -- resume ---------------------------------------------------------------------------------------


def bench_resume(args: argparse.Namespace) -> None:
    try:
        import tokenizers  # noqa: F401
    except ImportError:
        say("resume: not run: tokenizers is not installed (the [text] extra)")
        return
    import torch

    import datapipes

    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    texts = make_texts(args.resume_texts, 200, seed=2)
    tok = train_tokenizer(texts)
    rng = random.Random(0)
    w = {"name": "resume", "title": f"resume the e2e pipe ({len(texts):,} texts) from a state taken at "
         f"{args.points} random batches", "unit": "states", "baseline": None, "systems": [], "targets": []}
    with tempfile.TemporaryDirectory() as root:
        write_shards(root, texts, args.shards)
        for workers in (0, 2):
            def loader() -> Any:
                return datapipes.DataLoader(our_pipe(root, tok, args.e2e_seq_len, 8), batch_size=None,
                                            num_workers=workers)
            reference = [b["tokens"] for b in loader()]
            sizes, bad = [], 0
            for _ in range(args.points):
                k = rng.randrange(len(reference))
                first = loader()
                it = iter(first)
                for _ in range(k):
                    next(it)
                state = first.state_dict()
                del it, first
                buf = io.BytesIO()
                torch.save(state, buf)
                sizes.append(buf.tell())
                resumed = loader()
                resumed.load_state_dict(torch.load(io.BytesIO(buf.getvalue()), weights_only=True))
                rest = [b["tokens"] for b in resumed]
                if len(rest) != len(reference) - k or any(not torch.equal(a, b) for a, b in zip(rest, reference[k:])):
                    bad += 1
            size = statistics.median(sizes)
            say(f"resume, num_workers={workers}: {args.points - bad} of {args.points} resumed streams equal the "
                f"uninterrupted one ({len(reference)} batches); saved state (torch.save) median {size:,.0f} bytes, "
                f"largest {max(sizes):,}")
            w["systems"].append(_results.system(f"datapipes num_workers={workers}", "datapipes", None,
                                                status="ok", identical=args.points - bad, points=args.points,
                                                state_bytes_median=size, state_bytes_max=max(sizes)))
            _results.target(
                w, FAILED, f"num_workers={workers}: every resumed stream identical", args.points - bad, bad == 0)
    WORKLOADS.append(w)


# -- main -----------------------------------------------------------------------------------------


SECTIONS: dict[str, Callable[[argparse.Namespace], None]] = {
    "pack": bench_pack, "tokenize": bench_tokenize, "e2e": bench_e2e, "resume": bench_resume}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=200_000, help="documents packed (pack)")
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--bins", type=int, default=16, help="open rows of the fit strategies, ours and Grain's")
    parser.add_argument("--texts", type=int, default=20_000, help="texts tokenized (tokenize, e2e)")
    parser.add_argument("--shards", type=int, default=8, help="JSONL files (e2e, resume)")
    parser.add_argument("--e2e-seq-len", type=int, default=2048, help="row length of the e2e and resume pipes")
    parser.add_argument("--resume-texts", type=int, default=2_000, help="texts of the resume pipe")
    parser.add_argument("--points", type=int, default=200, help="states taken and resumed, per num_workers")
    parser.add_argument("--repeats", type=int, default=5)
    return _results.run_sections("packing", parser, SECTIONS, WORKLOADS, FAILED, argv)


if __name__ == "__main__":
    sys.exit(main())

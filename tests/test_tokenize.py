"""TokenizerStage [tokenize] (datapipes/iter/tokenize.py): outputs equal to a plain encode loop, order
kept on threads and processes, the items' errors at their positions, exact resume after any item
(serially, concurrently, in DataLoader workers), and the tokens counted in the statistics.

The Hugging Face tokenizer is a small BPE trained here on generated text (nothing downloaded); the
tests that need it skip where ``tokenizers`` is not installed (free-threaded CPython, which it
publishes no wheel for). The pure-Python tokenizers run everywhere.
"""

from __future__ import annotations

import io
import pickle
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from datapipes.iter import IterableWrapper
from datapipes.iter.tokenize import DEFAULT_BATCH_SIZE, TokenizerStage
from datapipes.profiling import profile
from datapipes.testing import check_datapipe, check_resume, items_equal

from helpers import is_plain, plain_process  # noqa: F401 - plain_process: an autouse fixture (no RANK/WORLD_SIZE)

NO_TOKENIZERS = "tokenizers (the [text] extra) is not installed: it publishes no free-threaded (cp313t) wheel"


# -- tokenizers ------------------------------------------------------------------------------------


def make_texts(n, seed=0, words=(3, 30)):
    rng = random.Random(seed)
    vocab = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 7))) for _ in range(300)]
    return [" ".join(rng.choices(vocab, k=rng.randint(*words))) for _ in range(n)]


TEXTS = make_texts(120)


@pytest.fixture(scope="module")
def tok():
    tokenizers = pytest.importorskip("tokenizers", reason=NO_TOKENIZERS)
    from tokenizers import models, pre_tokenizers, trainers

    t = tokenizers.Tokenizer(models.BPE(unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.BpeTrainer(vocab_size=600, special_tokens=["[UNK]", "[BOS]", "[EOS]"], show_progress=False)
    t.train_from_iterator(make_texts(400, seed=1), trainer)
    return t


def reference(tok, texts, eos=None):
    """What a plain loop of ``encode_batch`` gives, as int32 arrays."""
    return [np.array(e.ids + ([] if eos is None else [eos]), np.int32) for e in tok.encode_batch(texts)]


def char_codes(texts):
    """A pure-Python tokenizer: each character's code point (module level: it pickles to processes)."""
    return [[ord(c) for c in t] for t in texts]


def sent_by_value():
    """``char_codes`` and ``pair_codes`` (``ord`` of a 2-character string: a ``TypeError``) as local
    functions, which cloudpickle sends to worker processes by value: a worker started as a fresh
    interpreter (the parent's threads, Rayon's included, make forking unclean) then need not import
    this module, and with it torch, before its first batch."""
    def char_codes(texts):
        return [[ord(c) for c in t] for t in texts]

    def pair_codes(texts):
        return [[ord(t + t)] for t in texts]

    return char_codes, pair_codes


def char_arrays(texts):
    return [np.array([ord(c) for c in t], np.int64) for t in texts]


class FakeFast:
    """Quacks like a transformers fast tokenizer: called on a list of texts, gives a dict-like
    ``BatchEncoding`` with ``input_ids``; a BOS (id 1) unless ``add_special_tokens=False``."""

    is_fast = True

    def __init__(self):
        self.calls = []

    def __call__(self, texts, add_special_tokens=True, return_attention_mask=True, return_token_type_ids=True):
        self.calls.append(dict(n=len(texts), add_special_tokens=add_special_tokens,
                               return_attention_mask=return_attention_mask,
                               return_token_type_ids=return_token_type_ids))
        ids = [([1] if add_special_tokens else []) + [ord(c) for c in t] for t in texts]
        masks = {"attention_mask": [[1] * len(i) for i in ids]} if return_attention_mask else {}
        return {"input_ids": ids, **masks}


def arrays_equal(got, want):
    assert len(got) == len(want)
    for k, (a, b) in enumerate(zip(got, want)):
        assert isinstance(a, np.ndarray) and a.dtype == np.int32 and a.ndim == 1, (k, a)
        assert np.array_equal(a, b), k


def run(pipe):
    it = iter(pipe)
    try:
        return list(it), it.stats()
    finally:
        it.close()


# -- outputs ---------------------------------------------------------------------------------------


class TestOutputs:
    @pytest.mark.parametrize("kw", [{}, {"concurrency": 2}, {"concurrency": 2, "executor": "process"},
                                    {"concurrency": "auto"}], ids=["serial", "threads", "processes", "auto"])
    def test_equal_to_a_plain_encode_batch_loop(self, tok, kw):
        out = list(IterableWrapper(TEXTS).tokenize(tok, batch_size=16, **kw))
        arrays_equal(out, reference(tok, TEXTS))

    def test_eos_appended(self, tok):
        eos = tok.token_to_id("[EOS]")
        out = list(IterableWrapper(TEXTS).tokenize(tok, eos_id=eos, batch_size=7, concurrency=2))
        arrays_equal(out, reference(tok, TEXTS, eos))
        assert all(a[-1] == eos for a in out)

    def test_add_special_tokens_reaches_the_post_processor(self, tok):
        from tokenizers import Tokenizer, processors

        bos_tok = Tokenizer.from_str(tok.to_str())
        bos = bos_tok.token_to_id("[BOS]")
        bos_tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", bos)])
        default = list(IterableWrapper(TEXTS[:5]).tokenize(bos_tok))
        off = list(IterableWrapper(TEXTS[:5]).tokenize(bos_tok, add_special_tokens=False))
        assert all(a[0] == bos for a in default)
        arrays_equal(off, reference(tok, TEXTS[:5]))
        arrays_equal([a[1:] for a in default], off)

    def test_order_kept_when_batches_finish_out_of_order(self):
        rng = random.Random(3)
        lock = threading.Lock()

        def slow(texts):
            with lock:
                pause = rng.random() * 0.004
            time.sleep(pause)  # later batches often finish first
            return char_codes(texts)

        texts = make_texts(200, seed=4)
        out = list(IterableWrapper(texts).tokenize(slow, batch_size=5, concurrency=4))
        arrays_equal(out, [np.array(c, np.int32) for c in char_codes(texts)])

    def test_a_pure_python_function_on_processes(self):
        texts = make_texts(50, seed=5)
        out = list(IterableWrapper(texts).tokenize(sent_by_value()[0], batch_size=4, eos_id=0, concurrency=2,
                                                   executor="process"))
        arrays_equal(out, [np.array(c + [0], np.int32) for c in char_codes(texts)])

    @pytest.mark.parametrize("concurrency", [1, 3])
    def test_on_an_executor_of_the_callers_and_on_one_thread(self, concurrency):
        texts = make_texts(40, seed=10)
        want = [np.array(c, np.int32) for c in char_codes(texts)]
        with ThreadPoolExecutor(2) as pool:
            arrays_equal(list(IterableWrapper(texts).tokenize(char_codes, batch_size=3, concurrency=concurrency,
                                                              executor=pool)), want)
        arrays_equal(list(IterableWrapper(texts).tokenize(char_codes, batch_size=3, concurrency=concurrency)), want)

    def test_integer_arrays_become_new_int32_arrays(self):
        shared = np.arange(5, dtype=np.int32)
        out = list(IterableWrapper(["ab", "c"]).tokenize(char_arrays, eos_id=9))
        arrays_equal(out, [np.array([97, 98, 9]), np.array([99, 9])])
        again = list(IterableWrapper(["x"]).tokenize(lambda texts: [shared]))
        assert np.array_equal(again[0], shared) and not np.shares_memory(again[0], shared)

    def test_a_transformers_tokenizer_is_called_on_the_batch(self):
        fake = FakeFast()
        texts = ["ab", "", "c"]
        out = list(IterableWrapper(texts).tokenize(fake, batch_size=2, eos_id=0))
        arrays_equal(out, [np.array([1, 97, 98, 0]), np.array([1, 0]), np.array([1, 99, 0])])
        assert fake.calls[0] == dict(n=2, add_special_tokens=True, return_attention_mask=False,
                                     return_token_type_ids=False)
        out = list(IterableWrapper(texts).tokenize(fake, add_special_tokens=False))
        arrays_equal(out, [np.array([97, 98]), np.array([], np.int32), np.array([99])])
        assert fake.calls[-1]["add_special_tokens"] is False

    def test_dict_items_keep_their_keys_and_are_not_changed(self, tok):
        items = [{"text": t, "id": k, "meta": {"k": k}} for k, t in enumerate(TEXTS[:30])]
        before = pickle.dumps(items)
        out = list(IterableWrapper(items).tokenize(tok, field="text", batch_size=4, concurrency=2))
        assert pickle.dumps(items) == before
        for x, y, ids in zip(items, out, reference(tok, TEXTS[:30])):
            assert y is not x and set(y) == {"text", "id", "meta", "tokens"}
            assert y["id"] == x["id"] and y["meta"] == x["meta"] and np.array_equal(y["tokens"], ids)

    def test_empty_texts_and_an_empty_source(self, tok):
        arrays_equal(list(IterableWrapper(["", "a"]).tokenize(tok, eos_id=5)),
                     [np.array([5]), reference(tok, ["a"], 5)[0]])
        assert list(IterableWrapper([]).tokenize(tok, concurrency=2)) == []

    def test_len_is_the_sources(self):
        assert len(IterableWrapper(TEXTS).tokenize(char_codes, batch_size=7)) == len(TEXTS)

    def test_the_pipe_contract(self, tok):
        pipe = IterableWrapper(TEXTS[:20]).tokenize(tok, batch_size=3, concurrency=2)
        check_datapipe(pipe, reference(tok, TEXTS[:20]),
                       build=lambda src: src.map(str).tokenize(tok, batch_size=3, concurrency=2))

    @pytest.mark.parametrize("kw", [{}, {"concurrency": 2}], ids=["serial", "threads"])
    def test_the_pipe_contract_with_a_function(self, kw):
        check_datapipe(IterableWrapper(TEXTS[:20]).tokenize(char_codes, batch_size=3, **kw),
                       [np.array(c, np.int32) for c in char_codes(TEXTS[:20])],
                       build=lambda src: src.map(str).tokenize(char_codes, batch_size=3, **kw))

    def test_label_and_defaults(self, tok):
        pipe = IterableWrapper(["a"]).tokenize(tok)
        assert isinstance(pipe, TokenizerStage) and pipe.batch_size == DEFAULT_BATCH_SIZE
        assert pipe.concurrency is None and pipe.executor == "thread"
        assert repr(pipe) == "IterableWrapper -> TokenizerStage(BPE)"
        assert repr(IterableWrapper(["a"]).tokenize(char_codes)) == "IterableWrapper -> TokenizerStage(char_codes)"
        assert repr(IterableWrapper(["a"]).tokenize(FakeFast())) == "IterableWrapper -> TokenizerStage(FakeFast)"


# -- errors ----------------------------------------------------------------------------------------


def bad_at(items, k, value):
    items = list(items)
    items[k] = value
    return items


class TestErrors:
    def test_a_tokenizer_of_no_kind(self):
        with pytest.raises(TypeError, match=r"TokenizerStage: tokenizer must be a tokenizers.Tokenizer .*got int"):
            IterableWrapper(["a"]).tokenize(3)

    def test_padding_is_refused(self, tok):
        from tokenizers import Tokenizer

        padded = Tokenizer.from_str(tok.to_str())
        padded.enable_padding()
        with pytest.raises(ValueError, match=r"TokenizerStage: the tokenizer pads .*no_padding\(\)"):
            IterableWrapper(["a"]).tokenize(padded)

    @pytest.mark.parametrize("kw, error, words", [
        ({"eos_id": 2**31}, ValueError, "eos_id must fit int32"),
        ({"eos_id": -1}, ValueError, "eos_id must be >= 0"),
        ({"eos_id": True}, TypeError, "eos_id"),
        ({"batch_size": 0}, ValueError, "batch_size must be >= 1"),
        ({"field": 3}, TypeError, "field must be a str"),
        ({"add_special_tokens": False}, ValueError, "add_special_tokens applies to a tokenizers or transformers"),
        ({"add_special_tokens": 1}, TypeError, "add_special_tokens must be a bool"),
        ({"executor": "process"}, ValueError, "executor='process' needs concurrency"),
        ({"concurrency": 0}, ValueError, "concurrency"),
        ({"concurrency": 2, "executor": "fibre"}, ValueError, "executor must be"),
    ])
    def test_arguments(self, kw, error, words):
        with pytest.raises(error, match=words):
            IterableWrapper(["a"]).tokenize(char_codes, **kw)

    def test_an_async_function_is_refused(self):
        async def tokenize(texts):
            return char_codes(texts)

        with pytest.raises(TypeError, match="not an async one"):
            IterableWrapper(["a"]).tokenize(tokenize)

    @pytest.mark.parametrize("kw", [{}, {"concurrency": 2}], ids=["serial", "threads"])
    def test_an_item_that_is_not_a_str(self, kw):
        texts = bad_at(make_texts(20), 9, 42)
        it = iter(IterableWrapper(texts).tokenize(char_codes, batch_size=4, **kw))
        got = [next(it) for _ in range(9)]  # the items before it, its own batch's included
        arrays_equal(got, [np.array(c, np.int32) for c in char_codes(texts[:9])])
        with pytest.raises(TypeError, match=r"TokenizerStage\(char_codes\): item 9 is an int, not a str") as e:
            next(it)
        assert "[datapipes] raised in stage TokenizerStage(char_codes) at item 9" in e.value.__notes__

    def test_dict_items_without_their_text(self):
        items = [{"text": t} for t in make_texts(6)]
        cases = [
            (bad_at(items, 4, {"body": "x", "id": 1}), ValueError,
             r"item 4 has no key 'text' \(its keys: 'body', 'id'\)"),
            (bad_at(items, 2, {"text": b"bytes"}), TypeError, r"item 2\['text'\] is a bytes, not a str"),
            (bad_at(items, 5, "just text"), TypeError, r"item 5 is a str, not a dict: with field='text'"),
        ]
        for data, error, words in cases:
            with pytest.raises(error, match=words):
                list(IterableWrapper(data).tokenize(char_codes, field="text", batch_size=4, concurrency=2))
        with pytest.raises(TypeError, match=r"item 0 is a dict, not a str: pass field="):
            list(IterableWrapper(items).tokenize(char_codes))

    @pytest.mark.parametrize("ids, error, words", [
        ([[1, 2], [2**31, 3]], ValueError, r"item 3: the tokenizer gave the id 2147483648, which does not fit int32"),
        ([[1, 2], [-(2**31) - 1]], ValueError, r"item 3: the tokenizer gave the id -2147483649"),
        ([[1, 2], [2**70]], ValueError, r"item 3: .*does not fit int32"),
        ([[1, 2], [1.5]], TypeError, r"item 3: the tokenizer gave ids of dtype float64, not integers"),
        ([[1, 2], [[1], [2]]], TypeError, r"item 3: .*shape \(2, 1\)"),
        ([[1, 2]], ValueError, r"item 2: the tokenizer returned 1 id sequences for a batch of 2 texts"),
        ("nope", TypeError, r"item 2: the tokenizer returned str for a batch of 2 texts"),
    ])
    def test_ids_that_cannot_be_int32_arrays(self, ids, error, words):
        def tokenizer(texts):
            return [[7]] * len(texts) if texts[0] != "bad" else ids

        texts = ["a", "b", "bad", "c", "d"]
        for kw in ({}, {"concurrency": 2}):
            it = iter(IterableWrapper(texts).tokenize(tokenizer, batch_size=2, **kw))
            first = [next(it) for _ in range(2)]
            arrays_equal(first, [np.array([7]), np.array([7])])
            if ids != "nope" and len(ids) == 2:
                arrays_equal([next(it)], [np.array([1, 2])])  # the good document of the batch comes first
            with pytest.raises(error, match=words) as e:
                next(it)
            assert any(n.startswith("[datapipes] raised in stage TokenizerStage(tokenizer)") for n in e.value.__notes__)

    @pytest.mark.parametrize("kw", [{}, {"concurrency": 2}], ids=["serial", "threads"])
    def test_the_tokenizers_exception_passes_through(self, kw):
        boom = RuntimeError("tokenizer broke")

        def tokenizer(texts):
            if "x" in texts:
                raise boom
            return char_codes(texts)

        texts = ["a"] * 10 + ["x"] + ["b"] * 3
        it = iter(IterableWrapper(texts).tokenize(tokenizer, batch_size=4, **kw))
        got = [next(it) for _ in range(8)]  # the batches before the one that failed
        assert len(got) == 8
        with pytest.raises(RuntimeError) as e:
            next(it)
        assert e.value is boom
        assert e.value.__notes__ == [
            "[datapipes] raised in stage TokenizerStage(tokenizer) at item 8",
            "[datapipes] TokenizerStage(tokenizer) was encoding items 8 to 11 in one call of the tokenizer "
            "(batch_size=4)",
        ]

    def test_errors_with_worker_processes(self):
        # the items are checked on the consumer's thread, before any worker sees them
        with pytest.raises(TypeError, match="item 2 is a float"):
            list(IterableWrapper(["a", "b", 3.5]).tokenize(sent_by_value()[0], concurrency=2, executor="process"))
        with pytest.raises(TypeError) as e:  # ord() of a 2-character string, raised in a worker
            list(IterableWrapper(["a", "b", "c"]).tokenize(sent_by_value()[1], batch_size=2, concurrency=2,
                                                           executor="process"))
        assert "[datapipes] raised in stage TokenizerStage(pair_codes) at item 0" in e.value.__notes__


# -- resume ----------------------------------------------------------------------------------------


def state_after(pipe, k):
    it = iter(pipe)
    head = [next(it) for _ in range(k)]
    state = it.state_dict()
    it.close()
    return head, state


class TestResume:
    @pytest.mark.parametrize("kw", [{}, {"concurrency": 2}], ids=["serial", "threads"])
    def test_after_any_item(self, tok, kw):
        texts = TEXTS[:23]
        full = check_resume(lambda: IterableWrapper(texts).tokenize(tok, batch_size=4, eos_id=2, **kw),
                            ks=range(len(texts) + 1))
        arrays_equal(full, reference(tok, texts, 2))

    def test_dict_items_through_torch_save(self):
        pytest.importorskip("torch")
        items = [{"text": t, "n": k} for k, t in enumerate(make_texts(14))]
        check_resume(lambda: IterableWrapper(items).tokenize(char_codes, field="text", batch_size=3, concurrency=2),
                     ks=range(15), through="torch")

    def test_on_processes(self):
        texts = make_texts(17, seed=6)
        check_resume(lambda: IterableWrapper(texts).tokenize(sent_by_value()[0], batch_size=3, concurrency=2,
                                                             executor="process"), ks=(5, 13))

    def test_a_resumed_pass_saves_and_resumes_again(self):
        texts = make_texts(40, seed=7)
        build = lambda: IterableWrapper(texts).tokenize(char_codes, batch_size=3, concurrency=2)  # noqa: E731
        want = list(build())
        head, state = state_after(build(), 5)
        assert len(state["stages"]["0:TokenizerStage"]["pending"]) > 3  # batches in flight were saved
        it = iter(build())
        it.load_state_dict(state)
        middle = [next(it) for _ in range(2)]  # still inside what the first state held
        again = it.state_dict()
        it.close()
        it = iter(build())
        it.load_state_dict(again)
        assert items_equal(head + middle + list(it), want)

    def test_the_state_is_plain_data_bounded_by_the_window(self):
        texts = make_texts(200, seed=8)
        for kw, bound in (({}, 4), ({"concurrency": 2}, 5 * 4)):
            for k in (1, 50, 123):
                _, state = state_after(IterableWrapper(texts).tokenize(char_codes, batch_size=4, **kw), k)
                own = state["stages"]["0:TokenizerStage"]
                assert is_plain(state) and own["next"] == k
                assert own["pending"] == texts[k:k + len(own["pending"])] and len(own["pending"]) <= bound

    def test_worker_processes_hold_as_many_batches_as_threads(self):
        # tiny documents: the engine would otherwise send many batches per chunk to a process
        texts = ["ab"] * 400
        it = iter(IterableWrapper(texts).tokenize(sent_by_value()[0], batch_size=4, concurrency=2,
                                                  executor="process"))
        next(it)
        time.sleep(0.2)  # the workers fill what they may
        assert len(it.state_dict()["stages"]["0:TokenizerStage"]["pending"]) <= 5 * 4
        it.close()

    def test_a_state_taken_before_a_failing_item_fails_there_again(self):
        texts = bad_at(make_texts(12), 7, None)
        head, state = state_after(IterableWrapper(texts).tokenize(char_codes, batch_size=4, concurrency=2), 5)
        it = iter(IterableWrapper(texts).tokenize(char_codes, batch_size=4, concurrency=2))
        it.load_state_dict(state)
        assert len([next(it) for _ in range(2)]) == 2
        with pytest.raises(TypeError, match="item 7 is a NoneType"):
            next(it)

    @pytest.mark.parametrize("mangle, words", [
        (lambda s: s.update(next=-1), r"state\['next'\] must be an int >= 0"),
        (lambda s: s.update(next="3"), r"state\['next'\] must be an int"),
        (lambda s: s.update(pending="abc"), r"state\['pending'\] must be a list"),
        (lambda s: s.update(pending=["x"] * 10**5), r"more than the stage's bound"),
        (lambda s: s.pop("pending"), "pending"),
    ])
    def test_a_hostile_state_is_refused_naming_the_stage(self, mangle, words):
        build = lambda: IterableWrapper(make_texts(10)).tokenize(char_codes, batch_size=2, concurrency=2)  # noqa: E731
        _, state = state_after(build(), 3)
        mangle(state["stages"]["0:TokenizerStage"])
        it = iter(build())
        with pytest.raises(ValueError, match=words) as e:
            it.load_state_dict(state)
        assert "TokenizerStage" in str(e.value)
        it.close()

    def test_dataloader_workers_resume_exactly(self, tok):
        pytest.importorskip("torch")
        from datapipes import DataLoader

        texts = make_texts(60, seed=9)

        def make():
            pipe = IterableWrapper(texts).sharding_filter().tokenize(tok, batch_size=3, concurrency=2)
            return DataLoader(pipe, batch_size=4, num_workers=2, seed=5, collate_fn=list,
                              multiprocessing_context="fork")

        def flat(batches):
            return [[a.tolist() for a in b] for b in batches]

        full = flat(make())
        assert sorted(a for b in full for a in b) == sorted(a.tolist() for a in reference(tok, texts))
        for k in (1, 6):
            loader = make()
            it = iter(loader)
            head = flat(next(it) for _ in range(k))
            state = pickle.loads(pickle.dumps(loader.state_dict()))
            it.close()
            again = make()
            again.load_state_dict(state)
            assert head + flat(again) == full, k


# -- statistics ------------------------------------------------------------------------------------


class TestStats:
    @pytest.mark.parametrize("kw", [{}, {"concurrency": 2}], ids=["serial", "threads"])
    def test_tokens_and_documents_counted(self, tok, kw):
        out, stats = run(IterableWrapper(TEXTS).tokenize(tok, batch_size=16, eos_id=2, **kw))
        (stage, s), = [(p, s) for p, s in stats if isinstance(p, TokenizerStage)]
        assert s.tokens == sum(map(len, out)) > len(out)
        assert s.items_out == s.items_in == len(TEXTS) and s.failures == 0
        d = s.as_dict()
        assert d["tokens"] == s.tokens and d["tokens_per_s"] > 0 and d["items_out"] == len(TEXTS)
        assert f"{s.tokens} tokens" in repr(s)
        assert pickle.loads(pickle.dumps(s)).tokens == s.tokens

    def test_live_counts_are_documents(self):
        it = iter(IterableWrapper(make_texts(30)).tokenize(char_codes, batch_size=4, concurrency=2))
        for _ in range(6):
            next(it)
        (_, s), = it.stats()
        assert s.running and s.items_out == 6 and 8 <= s.items_in <= 30 and s.tokens > 0
        it.close()

    def test_failures_count_the_stages_own(self):
        boom = ValueError("upstream")

        def source():
            yield from ["a", "b"]
            raise boom

        for texts, error, failures in ((["a", 3], TypeError, 1), (IterableWrapper(source()), ValueError, 0)):
            src = texts if isinstance(texts, IterableWrapper) else IterableWrapper(texts)
            it = iter(src.tokenize(char_codes, concurrency=2))
            with pytest.raises(error):
                list(it)
            (_, s), = [(p, s) for p, s in it.stats() if isinstance(p, TokenizerStage)]
            assert s.failures == failures

    def test_other_stages_count_no_tokens(self):
        _, stats = run(IterableWrapper(range(5)).map(str, concurrency=2))
        assert all(s.tokens == 0 and s.as_dict()["tokens"] == 0 for _, s in stats)

    @pytest.mark.parametrize("kw", [{}, {"concurrency": 2}], ids=["serial", "threads"])
    def test_profile_shows_tokens_per_second(self, kw):
        out = io.StringIO()
        report = profile(IterableWrapper(make_texts(40)).tokenize(char_codes, batch_size=8, **kw), num_items=None,
                         file=out)
        row = report.stages[-1]
        assert row["items_out"] == 40 and row["tokens"] == sum(len(t) for t in make_texts(40))
        assert f"TokenizerStage(char_codes): {row['tokens']} tokens, " in out.getvalue()
        assert "tokens/s" in out.getvalue()

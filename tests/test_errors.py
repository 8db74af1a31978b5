"""The shared error policy."""

import pickle

import pytest

from datapipes.errors import ErrorPolicy, FailureLog, PassFailures, add_stage_note, call_lines, raised_at


class TestErrorPolicy:
    def test_defaults(self):
        p = ErrorPolicy()
        assert p.on_error == "raise" and p.max_failures is None and not p.skips

    @pytest.mark.parametrize("bad", ["ignore", None, 1])
    def test_bad_on_error(self, bad):
        with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip'"):
            ErrorPolicy(bad)

    def test_bad_max_failures(self):
        with pytest.raises(TypeError, match="max_failures must be an int or None, got str"):
            ErrorPolicy("skip", "3")
        with pytest.raises(TypeError, match="got bool"):
            ErrorPolicy("skip", True)
        with pytest.raises(ValueError, match="max_failures must be >= 0"):
            ErrorPolicy("skip", -1)
        with pytest.raises(ValueError, match="max_failures applies only with on_error='skip'"):
            ErrorPolicy("raise", 2)

    def test_pickles_and_compares(self):
        p = ErrorPolicy("skip", 3)
        assert pickle.loads(pickle.dumps(p)) == p
        assert repr(p) == "ErrorPolicy(on_error='skip', max_failures=3)"


class TestPassFailures:
    def test_budget_then_exception_group(self):
        log = FailureLog()
        failures = ErrorPolicy("skip", 1).new_pass("Mapper(f)", log)
        e1, e2 = KeyError("a"), ValueError("b")
        failures.skip(e1, 3)
        with pytest.raises(ExceptionGroup, match=r"stage Mapper\(f\): 2 failures, more than max_failures=1") as info:
            failures.skip(e2, 9)
        assert info.value.exceptions == (e1, e2)
        assert e1.__notes__ == ["[datapipes] raised in stage Mapper(f) at item 3"]
        assert log.count == 2 and [f.position for f in log.recent] == [3, 9]

    def test_unlimited_keeps_no_list(self):
        log = FailureLog()
        failures = PassFailures("S", None, log)
        for i in range(100):
            failures.skip(RuntimeError(i), i)
        assert failures.kept == [] and log.count == 100 and len(log.recent) == 16

    def test_log_clear_and_pickle(self):
        log = FailureLog()
        log_failures = PassFailures("S", None, log)
        log_failures.skip(RuntimeError(), 0)
        assert repr(log) == "FailureLog(count=1)"
        assert pickle.loads(pickle.dumps(log)).count == 0
        log.clear()
        assert log.count == 0 and not log.recent


class TestNotes:
    def test_note_added_once(self):
        e = ValueError("x")
        add_stage_note(e, "Mapper(f)", 2)
        add_stage_note(e, "Mapper(f)", 2)
        assert e.__notes__ == ["[datapipes] raised in stage Mapper(f) at item 2"]
        add_stage_note(e, "CSVParser", 5, what="line")
        assert e.__notes__[-1] == "[datapipes] raised in stage CSVParser at line 5"

    def test_call_lines_and_raised_at(self):
        def loop(fn, src):
            try:
                for x in src:
                    fn(x)
            except Exception as e:
                return raised_at(e, call_lines(loop))

        def bad_source():
            yield 1
            raise KeyError

        assert loop(lambda x: 1 / 0, [1]) is True
        assert loop(lambda x: x, bad_source()) is False
        with pytest.raises(ValueError, match="never loads 'fn'"):
            call_lines(lambda: None)

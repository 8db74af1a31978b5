"""Skipping is not silent: what a pass under ``on_error="skip"`` logs and warns, and
``max_failures`` as a share of the items (datapipes.errors, docs/howto/errors.rst).

The same mechanism serves every stage that skips: a serial map, a concurrent map (threads), the
readers (JSON files, CSV rows), an opener."""

import io
import logging
import re
import warnings

import pytest

from datapipes import errors
from datapipes.errors import MIN_ITEMS_FOR_SHARE, ErrorPolicy
from datapipes.iter import IterableWrapper

pytestmark = pytest.mark.timeout(30)


def fails_on_thirds(x):
    if x % 3 == 0:
        raise ValueError(f"bad {x}")
    return x


def fails_on_fives(x):
    if x % 5 == 2:
        raise KeyError(x)
    return x


def never_fails(x):
    return x


def skip_lines(caplog):
    """The messages the ``datapipes`` logger wrote at WARNING."""
    return [r.getMessage() for r in caplog.records if r.name == "datapipes" and r.levelno == logging.WARNING]


def loud(caught):
    return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]


@pytest.fixture
def logged(caplog):
    caplog.set_level(logging.WARNING, logger="datapipes")
    return caplog


@pytest.fixture
def caught():
    with warnings.catch_warnings(record=True) as records:
        warnings.simplefilter("always")
        yield records


def json_files(docs):
    return IterableWrapper([(f"{i}.json", io.StringIO(doc)) for i, doc in enumerate(docs)])


# -- each skipped item, then a line every LOG_INTERVAL ------------------------------------------------


class TestEachSkip:
    def test_serial_map_logs_stage_position_and_exception(self, logged, caught):
        out = list(IterableWrapper(range(10)).map(fails_on_fives, on_error="skip"))
        assert out == [0, 1, 3, 4, 5, 6, 8, 9]
        lines = skip_lines(logged)
        assert lines[:2] == ["stage Mapper(fails_on_fives) skipped item 2: KeyError: 2",
                             "stage Mapper(fails_on_fives) skipped item 7: KeyError: 7"]
        assert lines[2].startswith("stage Mapper(fails_on_fives) skipped 2 of 10 items (20%) in this pass")
        assert len(lines) == 3

    def test_concurrent_map_logs_the_same(self, logged, caught):
        pipe = IterableWrapper(range(10)).map(fails_on_fives, concurrency=3, on_error="skip")
        assert list(pipe) == [0, 1, 3, 4, 5, 6, 8, 9]
        assert skip_lines(logged) == [
            "stage Mapper(fails_on_fives) skipped item 2: KeyError: 2",
            "stage Mapper(fails_on_fives) skipped item 7: KeyError: 7",
            "stage Mapper(fails_on_fives) skipped 2 of 10 items (20%) in this pass; its failures.recent holds the "
            "latest",
        ]

    def test_a_reader_logs_the_file_and_line(self, logged, caught):
        pipe = json_files(['{"a": 1}', "not json", "[2]", "{}"]).parse_json_files(on_error="skip")
        assert [obj for _, obj in pipe] == [{"a": 1}, [2], {}]
        lines = skip_lines(logged)
        assert lines[0] == ("stage JsonParser skipped file '1.json', line 1: JSONDecodeError: "
                            "Expecting value: line 1 column 1 (char 0)")
        assert lines[1].startswith("stage JsonParser skipped 1 of 4 items (25%) in this pass")
        assert len(lines) == 2

    def test_csv_rows_are_counted_as_items(self, logged, caught):
        text = "a,b\n" + "".join("9\n" if i == 5 else f"{i},{i}\n" for i in range(20))
        rows = IterableWrapper([("t.csv", io.StringIO(text))]).parse_csv_as_dict(on_error="skip")
        assert len(list(rows)) == 19
        lines = skip_lines(logged)
        assert lines[0].startswith("stage CSVDictParser skipped file 't.csv', line 7: Error: ")
        # the records read: the file's lines, its header included
        assert lines[1].startswith("stage CSVDictParser skipped 1 of 21 items (4.76%) in this pass")

    def test_the_first_ones_one_by_one_then_quiet(self, logged, caught):
        out = list(IterableWrapper(range(300)).map(fails_on_thirds, on_error="skip", warn_failures=None))
        assert len(out) == 200
        lines = skip_lines(logged)
        n = errors.LOGGED_ONE_BY_ONE
        assert lines[:n - 1] == [f"stage Mapper(fails_on_thirds) skipped item {3 * k}: ValueError: bad {3 * k}"
                                 for k in range(n - 1)]
        assert lines[n - 1].startswith(f"stage Mapper(fails_on_thirds) skipped item {3 * (n - 1)}: ValueError: ")
        assert f"({n} failures logged one by one: the next ones are counted, in one line every 10 s at most)" in lines[n - 1]
        # the other 90 came faster than the interval: only the summary counts them
        assert lines[n:] == ["stage Mapper(fails_on_thirds) skipped 100 of 300 items (33.3%) in this pass; its "
                             "failures.recent holds the latest"]

    def test_then_one_line_every_interval(self, logged, caught, monkeypatch):
        class Clock:  # a second passes at every reading
            now = 0.0

            @classmethod
            def monotonic(cls):
                cls.now += 1.0
                return cls.now

        monkeypatch.setattr(errors, "time", Clock)
        n = errors.LOGGED_ONE_BY_ONE
        list(IterableWrapper(range(3 * (n + 35))).map(fails_on_thirds, on_error="skip", warn_failures=None))
        counting = [line for line in skip_lines(logged) if " more in " in line]
        # 35 failures after the first n, a clock reading each, one line per 10 readings
        assert counting == [
            f"stage Mapper(fails_on_thirds) skipped 10 more in 10.0 s ({n + 10 * k} in this pass so far), the latest "
            f"item {3 * (n + 10 * k - 1)}: ValueError: bad {3 * (n + 10 * k - 1)}"
            for k in (1, 2, 3)
        ]

    def test_each_pass_logs_its_own(self, logged, caught):
        pipe = IterableWrapper(range(5)).map(fails_on_fives, on_error="skip")
        list(pipe)
        list(pipe)
        assert [line for line in skip_lines(logged) if "item 2" in line] == [
            "stage Mapper(fails_on_fives) skipped item 2: KeyError: 2"] * 2

    def test_a_pass_without_failures_logs_and_warns_nothing(self, logged, caught):
        for pipe in (
            IterableWrapper(range(50)).map(never_fails, on_error="skip"),
            IterableWrapper(range(50)).map(never_fails, concurrency=3, on_error="skip"),
            IterableWrapper(range(50)).filter(bool, on_error="skip", max_failures=0.1),  # filter_fn returns a bool
            json_files(["[1]", "[2]"]).parse_json_files(on_error="skip"),
        ):
            assert len(list(pipe)) in (2, 49, 50)
        assert skip_lines(logged) == [] and loud(caught) == []

    def test_a_pass_closed_early_sums_up_what_it_saw(self, logged, caught):
        it = iter(IterableWrapper(range(100)).map(fails_on_fives, on_error="skip", warn_failures=None))
        assert [next(it) for _ in range(4)] == [0, 1, 3, 4]
        it.close()
        assert skip_lines(logged)[-1].startswith("stage Mapper(fails_on_fives) skipped 1 of 5 items (20%) in this pass")


# -- the loud warning ---------------------------------------------------------------------------------


class TestWarnFailures:
    def test_over_the_default_share_warns_once_at_the_end(self, logged, caught):
        assert list(IterableWrapper(range(10)).map(fails_on_fives, on_error="skip")) == [0, 1, 3, 4, 5, 6, 8, 9]
        assert loud(caught) == [
            "stage Mapper(fails_on_fives) skipped 2 of 10 items (20%) in this pass, more than warn_failures=0.1 "
            "(10%): is a source or a function failing? Pass warn_failures= to the stage to change this threshold "
            "(a number, a share, or None: never warn), or max_failures= to stop the pass past a budget; its "
            "failures.recent holds the latest failures"
        ]

    def test_under_the_share_no_warning(self, logged, caught):
        list(IterableWrapper(range(30)).map(fails_on_fives, on_error="skip", warn_failures=0.25))  # 20%
        list(IterableWrapper(range(30)).map(fails_on_fives, on_error="skip", warn_failures=None))
        list(IterableWrapper(range(30)).map(fails_on_fives, on_error="skip", warn_failures=6))
        assert loud(caught) == []

    def test_a_number_warns_as_soon_as_it_is_passed(self, logged, caught):
        it = iter(IterableWrapper(range(100)).map(fails_on_fives, concurrency=2, on_error="skip", warn_failures=2))
        for _ in range(10):  # items 0 to 11: failures at 2 and 7
            next(it)
        assert loud(caught) == []
        assert next(it) == 13  # past the third failure, at 12
        assert [m.split(":")[0] for m in loud(caught)] == [
            "stage Mapper(fails_on_fives) skipped 3 items so far in this pass, more than warn_failures=2"]
        list(it)
        assert len(loud(caught)) == 1  # once per pass

    def test_a_share_warns_mid_pass_once_enough_items_were_seen(self, logged, caught):
        it = iter(IterableWrapper(range(1000)).map(fails_on_thirds, on_error="skip"))
        for _ in range(MIN_ITEMS_FOR_SHARE * 2 // 3):  # items 0 to 98: 33 failures of 99 items
            next(it)
        assert loud(caught) == []
        assert next(it) == 100  # past the failure at 99, the 100th item
        assert [m.split(":")[0] for m in loud(caught)] == [
            "stage Mapper(fails_on_thirds) skipped 34 of 100 items (34%) so far in this pass, more than "
            "warn_failures=0.1 (10%)"]
        list(it)
        assert len(loud(caught)) == 1

    def test_a_reader_warns_too(self, logged, caught):
        list(json_files(["[1]", "no", "[3]"]).parse_json_files(on_error="skip"))
        assert [m.split(":")[0] for m in loud(caught)] == [
            "stage JsonParser skipped 1 of 3 items (33.3%) in this pass, more than warn_failures=0.1 (10%)"]

    def test_an_opener_warns_and_logs(self, logged, caught, tmp_path):
        (tmp_path / "a.txt").write_text("a")
        paths = [str(tmp_path / "a.txt"), str(tmp_path / "missing.txt")]
        opened = list(IterableWrapper(paths).open_files(on_error="skip"))
        assert len(opened) == 1
        opened[0][1].close()
        lines = skip_lines(logged)
        assert lines[0].startswith("stage FileOpener('r') skipped item 1: FileNotFoundError: ")
        assert lines[1].startswith("stage FileOpener('r') skipped 1 of 2 items (50%) in this pass")
        assert len(loud(caught)) == 1

    def test_raise_policy_logs_nothing(self, logged, caught):
        with pytest.raises(KeyError):
            list(IterableWrapper(range(10)).map(fails_on_fives))
        assert skip_lines(logged) == [] and loud(caught) == []


# -- max_failures as a share -----------------------------------------------------------------------------


class TestShareBudget:
    @pytest.mark.parametrize("concurrency", [1, 3])
    def test_gives_up_once_over_the_share(self, concurrency, logged, caught):
        pipe = IterableWrapper(range(1000)).map(fails_on_thirds, concurrency=concurrency, on_error="skip",
                                                max_failures=0.25, warn_failures=None)
        out = []
        with pytest.raises(ExceptionGroup) as info:
            for x in pipe:
                out.append(x)
        # not before the pass has taken in MIN_ITEMS_FOR_SHARE items: the first failure after is item 99
        assert out == [x for x in range(99) if x % 3]
        assert info.value.message == (f"stage Mapper(fails_on_thirds): 34 failures in 100 items (34%), more than "
                                      f"max_failures=0.25 (25%) of them")
        assert len(info.value.exceptions) == 34 and all(isinstance(e, ValueError) for e in info.value.exceptions)
        # the group reports the pass: no summary line after it
        assert not [line for line in skip_lines(logged) if " in this pass;" in line]

    def test_under_the_share_the_pass_goes_on(self, caught):
        out = list(IterableWrapper(range(500)).map(fails_on_fives, on_error="skip", max_failures=0.25))
        assert len(out) == 400

    def test_short_passes_are_not_judged(self, caught):
        assert len(list(IterableWrapper(range(90)).map(fails_on_thirds, on_error="skip", max_failures=0.1))) == 60

    def test_the_group_holds_the_latest_hundred(self, caught):
        def mostly_fails(x):
            if x >= 20 and x % 10:
                raise ValueError(x)
            return x

        with pytest.raises(ExceptionGroup) as info:
            list(IterableWrapper(range(1000)).map(mostly_fails, on_error="skip", max_failures=0.8))
        group = info.value  # 149 failures in 186 items: more than the 100 it holds
        assert re.fullmatch(r"stage Mapper\(mostly_fails\): \d+ failures in \d+ items \([\d.]+%\), more than "
                            r"max_failures=0.8 \(80%\) of them; the group holds the latest 100", group.message)
        assert len(group.exceptions) == 100

    def test_a_reader_gives_up_over_its_share(self, caught):
        docs = ["[1]" if i % 4 else "no" for i in range(400)]
        pipe = json_files(docs).parse_json_files(on_error="skip", max_failures=0.2)
        with pytest.raises(ExceptionGroup, match=r"stage JsonParser: 26 failures in 101 items \(25.7%\), more than "
                                                 r"max_failures=0.2 \(20%\) of them"):
            list(pipe)


# -- arguments ----------------------------------------------------------------------------------------


class TestArguments:
    @pytest.mark.parametrize("bad", [0.0, 1.0, 1.5, -0.5, float("nan")])
    def test_bad_shares(self, bad):
        with pytest.raises(ValueError, match=r"Mapper: max_failures as a share of the items must be a float "
                                             r"between 0 and 1"):
            IterableWrapper([1]).map(str, on_error="skip", max_failures=bad)
        with pytest.raises(ValueError, match=r"FileOpener: warn_failures as a share of the items must be a float "
                                             r"between 0 and 1"):
            IterableWrapper(["a"]).open_files(on_error="skip", warn_failures=bad)

    def test_bad_types_and_numbers(self):
        with pytest.raises(TypeError, match="JsonParser: warn_failures must be an int or None, got str"):
            json_files([]).parse_json_files(on_error="skip", warn_failures="10%")
        with pytest.raises(TypeError, match="Filter: max_failures must be an int or None, got bool"):
            IterableWrapper([1]).filter(bool, on_error="skip", max_failures=True)
        with pytest.raises(ValueError, match="Mapper: warn_failures must be >= 0 or None, got -1"):
            IterableWrapper([1]).map(str, warn_failures=-1)
        with pytest.raises(ValueError, match="max_failures applies only with on_error='skip'"):
            IterableWrapper([1]).map(str, max_failures=0.5)

    def test_a_stage_that_does_not_count_refuses_a_share(self):
        with pytest.raises(ValueError, match="S: max_failures cannot be a share here"):
            ErrorPolicy("skip", 0.1, "S", counts=False)
        assert ErrorPolicy("skip", 3, "S", counts=False).max_failures == 3

    def test_policy_keeps_and_shows_warn_failures(self):
        import pickle

        p = ErrorPolicy("skip", 0.05, warn_failures=None)
        assert repr(p) == "ErrorPolicy(on_error='skip', max_failures=0.05, warn_failures=None)"
        assert pickle.loads(pickle.dumps(p)) == p and p != ErrorPolicy("skip", 0.05)
        assert repr(ErrorPolicy("skip", 3)) == "ErrorPolicy(on_error='skip', max_failures=3)"


# -- SPDL logs its own failures ------------------------------------------------------------------------


def test_spdl_pipes_are_not_logged_twice(caplog, caught):
    from datapipes.spdl import PipelineBuilder

    caplog.set_level(logging.WARNING)
    pipeline = PipelineBuilder().add_source(range(10)).pipe(fails_on_fives, concurrency=2).add_sink(3).build(num_threads=2)
    with pipeline.auto_stop():
        out = list(pipeline.get_iterator(timeout=10))
    assert sorted(out) == [0, 1, 3, 4, 5, 6, 8, 9]
    assert [r.name for r in caplog.records] == ["datapipes.spdl"] * 2
    assert loud(caught) == []

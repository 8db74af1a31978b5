"""A failure budget (``on_error="skip"``, ``max_failures``) across a resume: the failures counted
before the state was taken count after it, so a resumed pass gives up (its ``ExceptionGroup``)
exactly where the uninterrupted pass does, for every stage that skips items. (In completion order
which items come out before the pass gives up depends on timing, resumed or not.)"""

import asyncio
import io
import math

import pytest

from datapipes.iter import IterableWrapper

from helpers import resumed, saved_after

N = 24


def odd_fails(x):
    if x % 2:
        raise ValueError(f"odd {x}")
    return x


async def odd_fails_async(x):
    await asyncio.sleep(0)
    return odd_fails(x)


def keep_fours(x):
    return odd_fails(x) % 4 == 0


def twice(x):
    return [odd_fails(x)] * 2


def seeded(x, rng):
    return odd_fails(x), rng.randrange(100)


BUDGETED = {
    "map": lambda: IterableWrapper(range(N)).map(odd_fails, on_error="skip", max_failures=3),
    "map threads": lambda: IterableWrapper(range(N)).map(odd_fails, concurrency=3, on_error="skip", max_failures=3),
    "map async": lambda: IterableWrapper(range(N)).map(odd_fails_async, concurrency=3, on_error="skip",
                                                       max_failures=3),
    "map rng": lambda: IterableWrapper(range(N)).map(seeded, rng="python", on_error="skip", max_failures=3).set_seed(1),
    "filter": lambda: IterableWrapper(range(N)).filter(keep_fours, on_error="skip", max_failures=3),
    "flatmap": lambda: IterableWrapper(range(N)).flatmap(twice, on_error="skip", max_failures=3),
    "flatmap threads": lambda: IterableWrapper(range(N)).flatmap(twice, concurrency=2, on_error="skip",
                                                                 max_failures=3),
    # math.sqrt fails on the negative items; a builtin, so that the workers import nothing of this module
    "map processes": lambda: IterableWrapper([(-1) ** i * i for i in range(N)]).map(
        math.sqrt, concurrency=2, executor="process", on_error="skip", max_failures=3),
}


def until_error(it, gave_up=lambda e: len(e.exceptions)):
    """The items before the pass gave up, then ``("gave up", gave_up(group))``: by default how many
    failures its group holds."""
    out = []
    try:
        for x in it:
            out.append(x)
    except ExceptionGroup as e:
        out.append(("gave up", gave_up(e)))
    return out


@pytest.mark.parametrize("name", sorted(BUDGETED))
def test_a_resumed_pass_gives_up_where_the_uninterrupted_one_does(name):
    build = BUDGETED[name]
    full = until_error(iter(build()))
    assert full[-1][0] == "gave up"
    for k in range(len(full)):
        head, state = saved_after(iter(build()), k)
        rest = until_error(resumed(build(), state))
        assert head + rest[:-1] == full[:-1], k
        assert rest[-1][0] == "gave up", k  # after the same number of failures in all


# A share as the budget (max_failures=0.2): judged against the items taken in, which a resumed pass
# must count from where the saved one stood (positions for item-wise stages; for a reader of rows,
# the records of the files it had read, which its state saves).

M = 300


def third_fails(x):
    if x % 3 == 0:
        raise ValueError(f"third {x}")
    return x


def csv_files():
    # 150 good rows, then a file of which every other row has a missing field (a csv.Error): the
    # pass gives up inside the second file, so a state taken there must know the rows before it
    good = "k,v\n" + "".join(f"{i},{i}\n" for i in range(150))
    bad = "k,v\n" + "".join(f"{i}\n" if i % 2 else f"{i},{i}\n" for i in range(150))
    return IterableWrapper([("good.csv", io.StringIO(good)), ("bad.csv", io.StringIO(bad))])


SHARED = {
    "map": lambda: IterableWrapper(range(M)).map(third_fails, on_error="skip", max_failures=0.2, warn_failures=None),
    "map threads": lambda: IterableWrapper(range(M)).map(third_fails, concurrency=3, on_error="skip",
                                                         max_failures=0.2, warn_failures=None),
    "filter": lambda: IterableWrapper(range(M)).filter(third_fails, on_error="skip", max_failures=0.2,
                                                       warn_failures=None),
    "csv rows": lambda: csv_files().parse_csv_as_dict(on_error="skip", max_failures=0.2, warn_failures=None),
}


def until_given_up(it):
    """The items before the pass gave up, then the message of its group up to what the group holds
    (a resumed pass holds only the failures since the resume)."""
    return until_error(it, lambda e: e.message.split(";")[0])


@pytest.mark.parametrize("name", sorted(SHARED))
def test_a_share_resumes_where_the_uninterrupted_pass_gives_up(name):
    build = SHARED[name]
    full = until_given_up(iter(build()))
    assert full[-1][0] == "gave up"
    for k in list(range(0, len(full) - 1, 17)) + [len(full) - 2]:
        head, state = saved_after(iter(build()), k)
        rest = until_given_up(resumed(build(), state))
        assert head + rest[:-1] == full[:-1], k
        assert rest[-1] == full[-1], k  # after the same failures, in the same number of items

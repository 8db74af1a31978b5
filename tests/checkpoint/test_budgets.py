"""A failure budget (``on_error="skip"``, ``max_failures``) across a resume: the failures counted
before the state was taken count after it, so a resumed pass gives up (its ``ExceptionGroup``)
exactly where the uninterrupted pass does, for every stage that skips items. (In completion order
which items come out before the pass gives up depends on timing, resumed or not.)"""

import asyncio
import math
import pickle

import pytest

from datapipes.iter import IterableWrapper

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


def until_error(it):
    out = []
    try:
        for x in it:
            out.append(x)
    except ExceptionGroup as e:
        out.append(("gave up", len(e.exceptions)))
    return out


@pytest.mark.parametrize("name", sorted(BUDGETED))
def test_a_resumed_pass_gives_up_where_the_uninterrupted_one_does(name):
    build = BUDGETED[name]
    full = until_error(iter(build()))
    assert full[-1][0] == "gave up"
    for k in range(len(full)):
        it = iter(build())
        head = [next(it) for _ in range(k)]
        state = pickle.loads(pickle.dumps(it.state_dict()))
        it.close()
        again = iter(build())
        again.load_state_dict(state)
        rest = until_error(again)
        assert head + rest[:-1] == full[:-1], k
        assert rest[-1][0] == "gave up", k  # after the same number of failures in all

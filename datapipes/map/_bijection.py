"""A seeded permutation of ``range(n)`` computed position by position, in constant memory.

The map-style ``shuffle`` reads its source in the order ``at(0), at(1), ..., at(n - 1)`` of a
:class:`Permutation`, computed a block of positions at a time, so that neither a list of ``n``
indices (36 bytes an index as Python ints: 36 GB at a billion rows) nor the time to draw one is
needed before the first item, and a pass resumes from its position and seed alone.

The permutation is a Feistel network over ``2 h`` bits, ``h`` the smallest with ``4**h >= n``: a
value is cut into two halves ``L, R`` of ``h`` bits, and each of :data:`ROUNDS` rounds
(:data:`SMALL_ROUNDS` over a few bits) maps ``(L, R)`` to ``(R, L ^ F(R, k_i))``, a bijection of
``[0, 4**h)`` whatever ``F`` is. The round function is two steps of splitmix64's 64-bit finalizer,
``F(R, k) = top h bits of M2 * xs27(M1 * (R ^ k))`` (``xs27(z) = z ^ (z >> 27)``): the first multiply
spreads each bit of ``R`` upwards, the xorshift folds them down, the second multiply spreads them
again, and the top bits kept depend on every bit of ``R``. The round keys ``k_i`` are drawn from the
seed by numpy's ``SeedSequence``. A value at or past ``n`` goes through the network again until it
lands in ``range(n)`` (*cycle-walking*): the walk from a position follows the network's cycle
through it to the next value of ``range(n)`` on that cycle, so the result is a bijection of
``range(n)``; as ``4**h < 4 n``, a walk takes fewer than 4 steps on average.

:meth:`Permutation.blocks` computes :data:`BLOCK` positions at a time with numpy on ``uint64``
arrays, each step of the walk on the values still out of range. A numpy call has a fixed cost
that dwarfs its work on a few values, and the longest walk of a block takes tens of steps where
``n`` is just above a power of 4; so the values still walking go through the network together
with the next blocks' (a block is handed out once all its values have landed; at most
:data:`WINDOW` blocks in flight): a position costs tens of nanoseconds, under a hundred
where ``n`` is just above a power of 4.
:meth:`Permutation.at` computes one position with Python ints.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

__all__ = ["BLOCK", "MAX_LENGTH", "ROUNDS", "SMALL_ROUNDS", "Permutation"]

#: the rounds of the Feistel network (Luby and Rackoff: 4 make a pseudorandom permutation of a
#: random round function)
ROUNDS = 6
#: the rounds over halves of at most SMALL_HALF bits (``n <= 256``): 6 rounds over 2-bit halves put
#: an item at some positions a few percent more often than at others (chi-square over 40,000 seeds,
#: ``n = 5`` and ``10``); 12 do not, and cost nothing at that size
SMALL_ROUNDS, SMALL_HALF = 12, 4
#: positions per block
BLOCK = 4096
#: the blocks in flight at most (their values are held: WINDOW * BLOCK * 8 bytes)
WINDOW = 8
#: the largest ``n``: the halves of ``4**31 = 2**62`` values are 31 bits
MAX_LENGTH = 1 << 62

_MASK64 = (1 << 64) - 1
_M1 = 0xBF58476D1CE4E5B9  # splitmix64's multipliers
_M2 = 0x94D049BB133111EB
#: the last values of a range still walking, this many or fewer, walk with Python ints (cheaper
#: than numpy calls on a few values)
_SCALAR_TAIL = 8


class Permutation:
    """A bijection of ``range(n)`` drawn from ``seed`` (an int, taken modulo ``2**64``).

    ``at(p)`` is the value at position ``p``; ``blocks(start, stop)`` the values at positions
    ``start .. stop - 1`` in ``uint64`` arrays of :data:`BLOCK`; ``block(start, stop)`` those as one
    array. Same ``n`` and seed, same permutation, in every process and on every machine.

    Raises:
        ValueError: ``n`` is negative or more than ``2**62`` (:data:`MAX_LENGTH`).

    >>> order = Permutation(10, seed=0)
    >>> values = order.block(0, 10).tolist()
    >>> sorted(values) == list(range(10)), [order.at(p) for p in range(10)] == values
    (True, True)
    """

    __slots__ = ("n", "half", "keys", "_keys", "_c")

    def __init__(self, n: int, seed: int) -> None:
        if not 0 <= n <= MAX_LENGTH:
            raise ValueError(f"a seeded permutation covers 0 to 2**62 ({MAX_LENGTH}) positions, got {n}")
        self.n = n
        bits = (n - 1).bit_length() if n > 1 else 0
        self.half = (bits + 1) // 2  # the smallest h with 4**h >= n
        #: the round keys, as Python ints (for at) and as uint64 scalars (for blocks)
        rounds = SMALL_ROUNDS if self.half <= SMALL_HALF else ROUNDS
        self.keys = [int(k) for k in np.random.SeedSequence(seed & _MASK64).generate_state(rounds, np.uint64)]
        self._keys = [np.uint64(k) for k in self.keys]
        self._c = tuple(np.uint64(c) for c in (self.half, (1 << self.half) - 1, 64 - self.half, _M1, _M2, 27, n))

    def __len__(self) -> int:
        return self.n

    # -- one position, with Python ints ----------------------------------------------------------

    def _encrypt(self, x: int) -> int:
        h = self.half
        mask, top = (1 << h) - 1, 64 - h
        left, right = x >> h, x & mask
        for k in self.keys:
            z = ((right ^ k) * _M1) & _MASK64
            z = ((z ^ (z >> 27)) * _M2) & _MASK64
            left, right = right, left ^ (z >> top)
        return (left << h) | right

    def _walk(self, x: int) -> int:
        """The first value of ``range(n)`` after ``x`` on its cycle of the network."""
        n = self.n
        x = self._encrypt(x)
        while x >= n:
            x = self._encrypt(x)
        return x

    def at(self, position: int) -> int:
        """The value at ``position`` (``0 <= position < n``; ``IndexError`` otherwise)."""
        if not 0 <= position < self.n:
            raise IndexError(f"position {position} is out of range for a permutation of {self.n}")
        return position if self.n == 1 else self._walk(position)

    # -- blocks of positions, with numpy ---------------------------------------------------------

    def _encrypt_array(self, x: np.ndarray) -> np.ndarray:
        """The network applied to each value of ``x`` (``uint64``), as a new array."""
        h, mask, top, m1, m2, s27, _ = self._c
        left = x >> h
        right = x & mask
        t = np.empty_like(x)
        u = np.empty_like(x)
        xor, shr, mul = np.bitwise_xor, np.right_shift, np.multiply
        for k in self._keys:  # F(right, k), then left ^= F; the halves swap
            xor(right, k, out=t)
            mul(t, m1, out=t)
            xor(t, shr(t, s27, out=u), out=t)
            mul(t, m2, out=t)
            shr(t, top, out=t)
            xor(left, t, out=left)
            left, right = right, left
        np.left_shift(left, h, out=left)
        np.bitwise_or(left, right, out=left)
        return left

    def blocks(self, start: int = 0, stop: int | None = None, size: int = BLOCK) -> Iterator[np.ndarray]:
        """The values at positions ``start .. stop - 1`` (``stop`` default ``n``), in consecutive
        ``uint64`` arrays of ``size`` values (the last one shorter), each a new array."""
        stop = self.n if stop is None else stop
        if not 0 <= start <= stop <= self.n:
            raise IndexError(f"positions {start} to {stop} are out of range for a permutation of {self.n}")
        if self.n <= 1:
            for a in range(start, stop, size):
                yield np.arange(a, min(a + size, stop), dtype=np.uint64)
            return
        n = self._c[-1]
        capacity = WINDOW * size
        out = np.empty(capacity, np.uint64)  # a ring: position p at (p - start) % capacity
        walking = np.empty(0, np.uint64)  # the values still out of range ...
        owner = np.empty(0, np.int64)  # ... and their positions less start, rising
        entered = emitted = start  # positions that went through the network once / were handed out
        while emitted < stop:
            # hand out the blocks whose values all landed
            while emitted < entered and (not owner.size or owner[0] >= min(emitted + size, stop) - start):
                end = min(emitted + size, stop)
                at = (emitted - start) % capacity
                yield out[at:at + end - emitted].copy()
                emitted = end
            if emitted == stop:
                return
            if walking.size < size and entered < stop and entered + size - emitted <= capacity:
                # a new block goes through the network with the values still walking
                end = min(entered + size, stop)
                walking = np.concatenate((walking, np.arange(entered, end, dtype=np.uint64)))
                owner = np.concatenate((owner, np.arange(entered - start, end - start, dtype=np.int64)))
                entered = end
            elif walking.size <= _SCALAR_TAIL and entered == stop:
                for p, x in zip(owner.tolist(), walking.tolist()):
                    out[p % capacity] = self._walk(x)
                walking, owner = walking[:0], owner[:0]
                continue
            z = self._encrypt_array(walking)
            out[owner % capacity] = z
            still = z >= n
            walking, owner = z[still], owner[still]

    def block(self, start: int, stop: int) -> np.ndarray:
        """The values at positions ``start .. stop - 1``, one ``uint64`` array."""
        parts = list(self.blocks(start, stop))
        return np.concatenate(parts) if parts else np.empty(0, np.uint64)

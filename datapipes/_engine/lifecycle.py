"""The close/``with`` protocol shared by the engine's worker pools, loop references and producers."""

from __future__ import annotations

from typing import Any, Callable, Self


class Closeable:
    """``close()`` runs the object's ``weakref.finalize`` (``_finalizer``, set in its constructor;
    ``None`` while there is nothing to stop), so it is idempotent and also runs when the object is
    collected; ``with obj:`` closes it on exit."""

    _finalizer: Callable[[], Any] | None

    def close(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

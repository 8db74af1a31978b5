"""Helpers shared by the stages that read several pipes or build a source later in the pass
(:mod:`.zipping`, :mod:`.muxing`, :mod:`.broadcast`) and by :mod:`.reshaping`: the checks of
several inputs and of their lengths, releasing the inputs of a failed pass, building an input in the
pass that built the stage, and warnings pointed at the user's line; and by torchdata's stages
(:mod:`.shuffling`, :mod:`.bucketing`, :mod:`.mapping.batches`): the refusal to restore a pass
already started, and torchdata's words for a length that relies on a function's output.
"""

from __future__ import annotations

import os
import sys
import warnings
import weakref
from typing import Any, Iterator, Sequence

from .._runtime import passes as _pass
from .._engine import abandon
from ..datapipe import IterDataPipe, source_len


def _check_inputs(stage: str, datapipes: tuple[Any, ...]) -> None:
    # torch's phrases end the messages (code ported from torch DataPipes may match them)
    if not datapipes:
        raise ValueError(f"{stage}: Expected at least one DataPipe, but got nothing")
    for k, dp in enumerate(datapipes):
        if not isinstance(dp, IterDataPipe):
            expected = ("All inputs are required to be `IterDataPipe` for `ZipIterDataPipe`." if stage == "Zipper"
                        else "Expected all inputs to be `IterDataPipe`")
            raise TypeError(f"{stage}: datapipes[{k}] is of type {type(dp).__name__}: {expected}")


def _check_torchdata_inputs(stage: str, datapipes: tuple[Any, ...]) -> None:
    # torchdata's phrase, naming its class, ends the message (ported code may match it)
    if not datapipes:
        raise ValueError(f"{stage}: Expected at least one DataPipe, but got nothing")
    for k, dp in enumerate(datapipes):
        if not isinstance(dp, IterDataPipe):
            raise TypeError(f"{stage}: datapipes[{k}] is of type {type(dp).__name__}: "
                            f"All inputs are required to be `IterDataPipe` for `{stage}IterDataPipe`.")


def _input_lengths(pipe: Any) -> list[int]:
    lengths = []
    for k, dp in enumerate(pipe.datapipes):
        lengths.append(source_len(pipe, dp, f"datapipes[{k}]"))
    return lengths


def _abandon_all(its: Sequence[Iterator[Any]]) -> None:
    for it in its:
        abandon(it)


def _weak(pass_: _pass.Pass | None) -> Any:
    return None if pass_ is None else weakref.ref(pass_)


_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # datapipes/ (this file is in iter/)


def _warn(message: str) -> None:
    """A ``UserWarning`` attributed to the first caller outside this package."""
    frame = sys._getframe(1)
    level = 2  # stacklevel 1 is this function, 2 its caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE_DIR):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, UserWarning, stacklevel=level)


#: torchdata's words for the length of a stage whose fn decides how many items come out (len_unknown).
_RELIES = "length relies on the output of its function"


def _check_started(run: Any) -> None:
    if run.started:
        raise RuntimeError(_pass.STARTED)

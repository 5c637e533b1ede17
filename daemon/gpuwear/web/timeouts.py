"""Deadlines for the front door's coroutines: ``asyncio.timeout`` and ``asyncio.timeout_at`` (Python 3.11+), and on
Python 3.10, which has neither, the same for how the door uses them (:class:`Deadline`).

On expiry the task is cancelled and the block ends in ``TimeoutError`` (the builtin, as from 3.11 on, which the door
catches). A cancellation from elsewhere propagates as it came. The deadline's timer runs only while the task waits
at an await inside the block (its handle is cancelled as the block ends), so the cancellation it makes always lands
there: Python 3.10's lack of ``Task.uncancel`` (3.11) costs nothing here.
"""

from __future__ import annotations

import asyncio
import sys
from types import TracebackType


class Deadline:
    """``async with Deadline(when):`` cancels the task at loop time ``when`` (None: never) and turns that
    cancellation into ``TimeoutError`` as the block ends."""

    def __init__(self, when: float | None) -> None:
        self._when = when
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[object] | None = None
        self._expired = False

    async def __aenter__(self) -> Deadline:
        self._task = asyncio.current_task()
        if self._task is None:
            raise RuntimeError("a deadline is for a task")
        if self._when is not None:
            self._handle = asyncio.get_running_loop().call_at(self._when, self._expire)
        return self

    def _expire(self) -> None:
        assert self._task is not None
        self._expired = True
        self._task.cancel()

    def expired(self) -> bool:
        return self._expired

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._handle is not None:
            self._handle.cancel()
        self._task = None
        if self._expired and kind is asyncio.CancelledError:
            raise TimeoutError from exc


def deadline_in(delay: float | None) -> Deadline:
    return Deadline(None if delay is None else asyncio.get_running_loop().time() + delay)


if sys.version_info >= (3, 11):
    timeout, timeout_at = asyncio.timeout, asyncio.timeout_at
else:  # pragma: no cover - the oldest Python pyproject accepts (test.sh's floor stage runs the door's tests there)
    timeout, timeout_at = deadline_in, Deadline

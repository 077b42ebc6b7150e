"""Stopping long work gracefully on SIGINT (Ctrl-C) and SIGTERM (a scheduler's stop).

:class:`GracefulStop` turns the first signal into :class:`StopRequested`, raised in the main
thread where the work runs, so that the caller can save what is finished (the builder commits
every finished sample) and then raise :class:`~osprey_data.errors.Interrupted`. Inside
:meth:`GracefulStop.deferred` blocks the signal is only noted and raised when the block ends, so
a step that must not be cut in half (handing a batch's samples to the store writer) completes
first. A second signal stops at once (``KeyboardInterrupt``): the store's crash safety still
leaves a valid store.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["GracefulStop", "StopRequested", "signal_name"]

HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # pragma: no cover - not a known signal
        return f"signal {signum}"


class StopRequested(BaseException):
    """Raised in the main thread on the first SIGINT/SIGTERM (a BaseException, like
    KeyboardInterrupt, so no ``except Exception`` on the way swallows it)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal_name(signum))
        self.signum = signum


class GracefulStop:
    """Context manager installing the SIGINT/SIGTERM handlers for the duration of some work.

    Outside the main thread (where Python cannot install handlers) it does nothing: signals then
    keep their usual effect.
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._defer = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> GracefulStop:
        if threading.current_thread() is threading.main_thread():
            for sig in HANDLED_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None:  # the second signal: stop now
            raise KeyboardInterrupt
        self.signum = signum
        if not self._defer:
            raise StopRequested(signum)

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @contextmanager
    def deferred(self, *, raise_after: bool = True) -> Iterator[None]:
        """Note a signal arriving inside the block; raise StopRequested once it is left
        (unless ``raise_after`` is False: the caller checks :attr:`requested` itself)."""
        self._defer += 1
        try:
            yield
        finally:
            self._defer -= 1
        if raise_after and not self._defer and self.signum is not None:
            raise StopRequested(self.signum)

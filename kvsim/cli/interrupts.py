"""A Ctrl-C the CLI cannot lose.

Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be. If that is
inside code that swallows it (a library's `except BaseException`, a finalizer, a C call that clears
errors), the command would go on as if nothing happened. `install` puts in a handler that raises the
same KeyboardInterrupt and also remembers it; the long commands call `raise_if_interrupted` each time
they report progress (`kvsim.cli.progress`: every 64 engine steps of a run), so an interrupt lost where
it landed is raised again there, at the latest a few steps later. Where Python itself cannot raise it (a
finalizer, a weakref callback such as an import lock's), it would print "Exception ignored in ..." and a
traceback above the one-line message: such a lost interrupt is not printed (`sys.unraisablehook`).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

_interrupted = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


def _quiet_when_lost(previous: Callable[[Any], object]) -> Callable[[Any], None]:
    """An unraisable-exception hook that leaves out a KeyboardInterrupt of ours (raised again later by
    `raise_if_interrupted`) and hands every other report to `previous`."""
    def hook(unraisable: Any) -> None:
        if not (issubclass(unraisable.exc_type, KeyboardInterrupt) and _interrupted.is_set()):
            previous(unraisable)
    return hook


def install() -> None:
    """Take over SIGINT from Python's default handler (in the main thread only; a SIGINT ignored, as
    in a background job started with `nohup`, or handled by someone else, stays as it is), and keep an
    interrupt lost in a finalizer or callback from printing a traceback."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)
        sys.unraisablehook = _quiet_when_lost(sys.unraisablehook)


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if a SIGINT came (and was lost where it landed)."""
    if _interrupted.is_set():
        raise KeyboardInterrupt

"""A Ctrl-C the CLI cannot lose.

Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be. If that is
inside code that swallows it (a library's `except BaseException`, a finalizer, a C call that clears
errors), the command would go on as if nothing happened. `install` puts in a handler that raises the
same KeyboardInterrupt and also remembers it; the long commands call `raise_if_interrupted` each time
they report progress (`kvsim.cli.progress`: every 64 engine steps of a run), so an interrupt lost where
it landed is raised again there, at the latest a few steps later.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

_interrupted = threading.Event()


def _on_sigint(signum: int, frame: FrameType | None) -> None:
    _interrupted.set()
    raise KeyboardInterrupt


def install() -> None:
    """Take over SIGINT from Python's default handler (in the main thread only; a SIGINT ignored, as
    in a background job started with `nohup`, or handled by someone else, stays as it is)."""
    if threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _on_sigint)


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if a SIGINT came (and was lost where it landed)."""
    if _interrupted.is_set():
        raise KeyboardInterrupt

"""A Ctrl-C the CLI cannot lose.

Python's own SIGINT handler raises KeyboardInterrupt wherever the main thread happens to be. If that is
inside code that swallows it (a library's `except BaseException`, a finalizer, a C call that clears
errors), the command would go on as if nothing happened. `install` puts in a handler that raises the
same KeyboardInterrupt and also remembers it; the long commands call `raise_if_interrupted` each time
they report progress (`kvsim.cli.progress`: every 64 engine steps of a run), so an interrupt lost where
it landed is raised again there, at the latest a few steps later. Where Python itself cannot raise it (a
finalizer, a weakref callback such as an import lock's), it would print "Exception ignored in ..." and a
traceback above the one-line message: such a lost interrupt is not printed (`sys.unraisablehook`).

A SIGTERM (`kill PID`, a job scheduler's stop) is handled as a Ctrl-C: without a handler Python died on the spot,
leaving the hidden temporary folder of the output it was writing; now the output's temporary is removed, the
same one line is printed and the exit status is 143 (128 + SIGTERM; the KeyboardInterrupt's `kvsim_exit_status`).
So is a SIGHUP (the terminal closed, an SSH session dropped), with exit status 129 (128 + SIGHUP).

The interrupt raised is an `Interrupted`, a subclass of KeyboardInterrupt (every `except KeyboardInterrupt` takes it):
CPython remembers a KeyboardInterrupt itself (the exact type) that ends code a string `exec` ran (a dataclass's or a
namedtuple's, made by a lazy import) and, at the exit of `python -m kvsim` (not of the `kvsim` script), kills the
process with SIGINT whatever status kvsim exits with (`Py_RunMain`: `unhandled_keyboard_interrupt`), so a SIGHUP or
SIGTERM that landed there ended as a SIGINT: a shell's 130, not 129 or 143.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

TERMINATING = (signal.SIGTERM, signal.SIGHUP)  # handled as a Ctrl-C where the system would end the process
_interrupted = threading.Event()
_signals: list[int] = []  # the signals taken, in the order they came


class Interrupted(KeyboardInterrupt):
    """The CLI's interrupt: a KeyboardInterrupt that CPython does not turn into a SIGINT at exit (module docstring)."""


def _interrupt() -> KeyboardInterrupt:
    """The KeyboardInterrupt of the first signal taken, carrying the exit status (128 + its number)."""
    interrupt = Interrupted()
    interrupt.kvsim_exit_status = 128 + (_signals[0] if _signals else signal.SIGINT)  # type: ignore[attr-defined]
    return interrupt


def _on_signal(signum: int, frame: FrameType | None) -> None:
    _signals.append(signum)
    _interrupted.set()
    raise _interrupt()


def _quiet_when_lost(previous: Callable[[Any], object]) -> Callable[[Any], None]:
    """An unraisable-exception hook that leaves out a KeyboardInterrupt of ours (raised again later by
    `raise_if_interrupted`) and hands every other report to `previous`."""
    def hook(unraisable: Any) -> None:
        if not (issubclass(unraisable.exc_type, KeyboardInterrupt) and _interrupted.is_set()):
            previous(unraisable)
    return hook


def install() -> None:
    """Take over SIGINT from Python's default handler and SIGTERM and SIGHUP from the system's (in the main thread
    only; a signal ignored, as SIGINT in a background job and SIGHUP under `nohup`, or handled by someone else,
    stays as it is), and keep an interrupt lost in a finalizer or callback from printing a traceback."""
    if threading.current_thread() is not threading.main_thread():
        return
    _signals.clear()  # a command starts uninterrupted: a signal an earlier command in this process took (a
    _interrupted.clear()  # notebook's second `kvsim.cli.main()`) stopped it at once, with that signal's status
    taken = False
    for signum, default in ((signal.SIGINT, signal.default_int_handler), *((s, signal.SIG_DFL) for s in TERMINATING)):
        if signal.getsignal(signum) is default:
            signal.signal(signum, _on_signal)
            taken = True
    if taken:
        sys.unraisablehook = _quiet_when_lost(sys.unraisablehook)


@contextmanager
def installed() -> Iterator[None]:
    """`install` for one command, undone when it ends: the signal handlers and the unraisable-exception hook it
    found are put back, so a process that goes on after the command (a notebook's kernel calling
    `kvsim.cli.main()`) is stopped by a later SIGTERM or SIGHUP as before, not sent an exception, and its hooks do
    not pile up one per command."""
    in_main_thread = threading.current_thread() is threading.main_thread()
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, *TERMINATING)} if in_main_thread else {}
    hook = sys.unraisablehook
    install()
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        sys.unraisablehook = hook


def raise_if_interrupted() -> None:
    """Raise KeyboardInterrupt if a SIGINT, SIGTERM or SIGHUP came (and was lost where it landed)."""
    if _interrupted.is_set():
        raise _interrupt()

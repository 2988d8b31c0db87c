"""What the long commands say while they work (`run`, `validate`, `report`, `plan`), on stderr.

On a terminal: one rich line (a bar when the total is known), drawn only once the work has taken
`BAR_AFTER_S`, and erased when it ends. Elsewhere (a pipe, a log file, CI): plain lines with no
control characters, the first once the work has taken `PLAIN_FIRST_S`, then at most one every
`PLAIN_EVERY_S`, plus a phase's last line when it ends (a study of the report, with its run count):

    kvsim report: study 2/6 kv_quantization: 4/4 runs (14 s)

Short work prints nothing. Each `updater` takes `(text, completed, total, phase)`; the helpers
below turn a command's own callback (requests done, points finished, runs done) into that text.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from kvsim.cli.interrupts import raise_if_interrupted
from kvsim.model.units import counted

BAR_AFTER_S = 1.0
PLAIN_FIRST_S = 3.0
PLAIN_EVERY_S = 10.0

Update = Callable[[str, float | None, float | None, str | None], None]  # (text, completed, total, phase)


@contextmanager
def updater(command: str, enabled: bool = True) -> Iterator[Update]:
    """An `Update` for `kvsim COMMAND`: a rich line on a terminal, plain lines elsewhere, nothing when
    disabled. Every call first raises a Ctrl-C that was lost where it landed (`raise_if_interrupted`)."""
    if not enabled:
        def quiet(text: str, completed: float | None = None, total: float | None = None,
                  phase: str | None = None) -> None:
            raise_if_interrupted()

        yield quiet
        return
    started = time.monotonic()
    if not sys.stderr.isatty():
        printed_s: float | None = None
        last_phase: str | None = None
        last_text = ""

        def say(text: str, now: float) -> None:
            nonlocal printed_s
            print(f"kvsim {command}: {text} ({now - started:.0f} s)", file=sys.stderr, flush=True)
            printed_s = now

        def plain(text: str, completed: float | None = None, total: float | None = None,
                  phase: str | None = None) -> None:
            nonlocal last_phase, last_text
            raise_if_interrupted()
            now = time.monotonic()
            if last_phase is not None and phase != last_phase:
                say(last_text, now)  # a phase ended: its final counts
            elif now - started >= PLAIN_FIRST_S and (printed_s is None or now - printed_s >= PLAIN_EVERY_S):
                say(text, now)
            last_phase, last_text = phase, text

        yield plain
        if last_phase is not None:  # the last phase ends with the work
            say(last_text, time.monotonic())
        return
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), transient=True,
                   console=Console(stderr=True))
    task = None

    def rich_line(text: str, completed: float | None = None, total: float | None = None,
                  phase: str | None = None) -> None:
        nonlocal task
        raise_if_interrupted()
        if task is None:
            if time.monotonic() - started < BAR_AFTER_S:
                return
            bar.start()
            task = bar.add_task(text, total=total)
        bar.update(task, description=text, completed=completed or 0, total=total)

    try:
        yield rich_line
    finally:
        if task is not None:
            bar.stop()


def requests_text(sim_s: float, done: int, total: int) -> str:
    """A run's line: simulated time and requests finished."""
    return f"simulated {sim_s:,.1f} s, {done:,}/{total:,} requests"


@contextmanager
def run_progress(command: str, enabled: bool = True) -> Iterator[Callable[[float, int, int], None]]:
    """A simulation's `progress(sim_s, done, total)` callback (`kvsim.engine.loop.ProgressFn`); disabled,
    it says nothing but still raises a lost Ctrl-C."""
    with updater(command, enabled) as update:
        def on_progress(sim_s: float, done: int, total: int) -> None:
            update(requests_text(sim_s, done, total), done, total, None)

        yield on_progress


def points_text(finished: int, simulated: int, open_searches: int, num_searches: int) -> str:
    """A plan's line: points finished, how many came from points.jsonl, candidates still searching."""
    return (f"{counted(finished, 'point')} done ({simulated} simulated now, {finished - simulated} reused from "
            f"points.jsonl); {open_searches}/{num_searches} candidates still searching")


def study_text(index: int, num_studies: int, name: str, runs_done: int, runs_submitted: int) -> str:
    """A report's line: which study, and its runs (submitted so far: a bisection adds runs as it goes)."""
    return f"study {index}/{num_studies} {name}: {runs_done}/{runs_submitted} runs"

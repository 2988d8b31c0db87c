"""An interrupt that lands once kvsim's output is in place says the output was written (review21).

`output_directory` holds SIGINT, SIGTERM and SIGHUP over its three renames where the atomic exchange is missing, so a
signal sent during them is delivered just after the new output is in place; a signal can equally land just after
`renameat2` or `os.replace` returns. The one line then said "OUT was not written; what was there before is intact"
while OUT held the new output and the old one was being removed. And a second interrupt during the first one's
cleanup hid the output the first one named. And the three renames were held by the signal mask alone, which
another thread's delivery gets around."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from kvsim.__main__ import interrupted_message
from kvsim.results import output_dir
from kvsim.results.output_checks import FILE_TAG
from kvsim.results.output_dir import output_directory, output_file


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt


def _write_run(folder, text: str) -> None:
    with output_directory(folder, "run") as tmp:
        (tmp / "summary.txt").write_text(text)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP])  # each the CLI takes
@pytest.mark.parametrize("other_thread", [False, True])
def test_a_signal_held_over_the_renames_reports_the_new_output_written(tmp_path, monkeypatch, other_thread, signum):
    """With another thread alive (a Dask client's, a process pool's; pytest-xdist's own), the signal the main
    thread blocks goes to that thread, and Python ran its handler in the main thread between the renames: the old
    output moved aside, the new one removed, `out` gone. Held by the mask alone, this failed under `-n 1`."""
    out = tmp_path / "out"
    _write_run(out, "old")
    monkeypatch.setattr(output_dir, "_renameat2", lambda src, dst, flags: False)  # the three renames
    rename, sent = os.rename, []

    def rename_and_signal(src, dst):
        if not sent:  # a signal while the renames run: held until they are done
            sent.append(True)
            os.kill(os.getpid(), signum)
        rename(src, dst)

    monkeypatch.setattr(os, "rename", rename_and_signal)
    previous = signal.signal(signum, _raise_keyboard_interrupt)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    if other_thread:  # it does not block the signal: the kernel hands it to it
        other.start()
    try:
        with pytest.raises(KeyboardInterrupt) as caught:
            _write_run(out, "new")
        assert signal.getsignal(signum) is _raise_keyboard_interrupt  # the handler is back
    finally:
        signal.signal(signum, previous)
        stop.set()
    assert sent and (out / "summary.txt").read_text() == "new"  # the swap ran whole before the interrupt
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # the old output was removed, no temporary left
    interrupt = caught.value
    assert (interrupt.kvsim_output, interrupt.kvsim_output_written) == (str(out), True)
    assert interrupted_message(["run"], interrupt.kvsim_output, interrupt.kvsim_output_written) == (
        f"kvsim: interrupted (kvsim run) once it had written {out}, which is complete")


def test_an_interrupt_before_the_swap_still_says_not_written(tmp_path):
    out = tmp_path / "out"
    _write_run(out, "old")
    with pytest.raises(KeyboardInterrupt) as caught, output_directory(out, "run") as tmp:
        (tmp / "summary.txt").write_text("new")
        raise KeyboardInterrupt
    assert (out / "summary.txt").read_text() == "old"
    assert (caught.value.kvsim_output, caught.value.kvsim_output_written) == (str(out), False)
    assert interrupted_message(["run"], str(out), False) == (
        f"kvsim: interrupted (kvsim run): {out} was not written; what was there before is intact")


def test_an_interrupt_just_after_a_files_replace_reports_it_written(tmp_path, monkeypatch):
    out = tmp_path / "profile.csv"
    replace = os.replace

    def replace_then_interrupt(src, dst):  # as a signal that lands when the rename returns
        replace(src, dst)
        if dst == out:
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", replace_then_interrupt)
    with pytest.raises(KeyboardInterrupt) as caught, output_file(out) as tmp:
        tmp.write_text(FILE_TAG + "\nnew\n")
    assert out.read_text() == FILE_TAG + "\nnew\n"
    assert caught.value.kvsim_output_written is True


def test_an_inner_output_written_inside_an_outer_one_names_the_outer_one_not_written(tmp_path, monkeypatch):
    """validate writes its sim/ run inside its own temporary folder: an interrupt once sim/ is in place, but
    before the outer folder is, is the outer output's, not written (sim/ is removed with its temporary)."""
    out, swap = tmp_path / "validation", output_dir._swap_into_place

    def swap_then_interrupt(new, dest):  # as a signal that lands when the inner swap returns
        swap(new, dest)
        if dest.name == "sim":
            raise KeyboardInterrupt

    monkeypatch.setattr(output_dir, "_swap_into_place", swap_then_interrupt)
    with pytest.raises(KeyboardInterrupt) as caught, output_directory(out, "validate") as tmp:
        _write_run(tmp / "sim", "new")
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == []
    assert (caught.value.kvsim_output, caught.value.kvsim_output_written) == (str(out), False)


def test_a_second_interrupt_during_the_cleanup_keeps_the_first_ones_output(tmp_path):
    """A second SIGTERM (or Ctrl-C) that lands while the first one's temporary is removed raises in that `finally`,
    on top of the first: the line said "before it wrote any output; no file was changed" of a run stopped while
    writing OUT (seen with two SIGTERMs 1 ms apart to `kvsim run`)."""
    from kvsim.__main__ import _interrupt_behind

    out = tmp_path / "out"
    try:
        try:
            with output_directory(out, "run"):
                raise KeyboardInterrupt  # the first: it names OUT on its way out
        finally:
            raise KeyboardInterrupt  # the second, in the cleanup around
    except KeyboardInterrupt as second:
        interrupt = _interrupt_behind(second)
    assert interrupt is not None and interrupt.kvsim_output == str(out)
    assert _interrupt_behind(KeyboardInterrupt()) is not None  # a lone one, naming nothing, is still found
    assert _interrupt_behind(ValueError()) is None


def _blocked() -> set[int]:
    """The signals this thread blocks now."""
    return set(signal.pthread_sigmask(signal.SIG_BLOCK, ()))


@pytest.mark.parametrize("when", ["blocking", "restoring"])
def test_a_signal_another_thread_takes_at_the_holds_edges_leaves_the_mask_as_it_was(tmp_path, monkeypatch, when):
    """The hold's own edges: a SIGINT that another thread takes just as the mask is set (its handler runs in the
    main thread as `pthread_sigmask` returns, before the block's `try`), or just after the hold's finally puts
    the handler back (before it unmasks), raised there and left SIGINT and SIGTERM blocked in the main thread for
    good: with no other thread alive, a later Ctrl-C was never delivered. Whatever raises, the thread's mask is
    the one it had before (the expectation needs no kvsim: the mask read before the write)."""
    out = tmp_path / "out"
    _write_run(out, "old")
    monkeypatch.setattr(output_dir, "_renameat2", lambda src, dst, flags: False)  # the three renames, held
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)
    other.start()
    sent: list[bool] = []

    def from_the_other_thread() -> None:  # its handler runs in the main thread; the wait lets it raise here
        if not sent:
            sent.append(True)
            signal.pthread_kill(other.ident, signal.SIGINT)
            for _ in range(500):  # up to 5 s, in steps: the handler raises at the first step after it ran
                time.sleep(0.01)

    real_mask, real_signal = signal.pthread_sigmask, signal.signal

    def mask_then_signal(how, mask):
        previous = real_mask(how, mask)
        if when == "blocking" and how == signal.SIG_BLOCK and signal.SIGINT in set(mask):
            from_the_other_thread()
        return previous

    def put_back_then_signal(signum, handler):
        previous = real_signal(signum, handler)
        if when == "restoring" and handler is _raise_keyboard_interrupt and previous is not _raise_keyboard_interrupt:
            from_the_other_thread()
        return previous

    before = _blocked()
    previous_handler = real_signal(signal.SIGINT, _raise_keyboard_interrupt)
    monkeypatch.setattr(signal, "pthread_sigmask", mask_then_signal)
    monkeypatch.setattr(signal, "signal", put_back_then_signal)
    try:
        with pytest.raises(KeyboardInterrupt):
            _write_run(out, "new")
        blocked_after = _blocked()
    finally:
        real_mask(signal.SIG_SETMASK, before)
        real_signal(signal.SIGINT, previous_handler)
        stop.set()
    assert sent and blocked_after == before
    # blocking: nothing renamed yet, the old output intact; restoring: the renames ran whole, the new one in place
    assert (out / "summary.txt").read_text() == ("old" if when == "blocking" else "new")

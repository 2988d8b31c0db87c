"""Small defects noticed and left (tidy30): each with what the flag or column is documented to mean.

`--gpu ''` said "not a preset ... nor a file" where `--model ''` says "is empty"; a FIFO or a device given as
`--model` or `--gpu` was "nor a file", naming nothing of what it is (a scenario's and a trace's already did).
`--memory-limit 0` and `--offload-size 0` were "expected a size such as 64GiB", though 0 is a size: what is wrong
is that it is not positive. `kvsim plan --slo ttft_s.p90=-1` was refused as `-1.0`, a value nobody wrote (the
flag read the number as a float before `PlanSpec` checked it; `--gpu-hourly-cost` alike). A SIGHUP or SIGTERM
that landed in code a string `exec` ran ended the process by SIGINT (a shell's 130), whatever kvsim exited with.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[1]
INTERRUPTS = ROOT / "kvsim" / "cli" / "interrupts.py"
GPU_WANTED = "name a preset or a GPU file (YAML or JSON)"
MODEL_WANTED = "name a preset, a config.json or a model's folder"


@pytest.mark.parametrize("blank", ["", "  "])
def test_a_blank_gpu_is_refused_as_a_blank_model_is(blank):
    """Both name a preset or a file; blank names neither, and both say so alike."""
    assert one_line_exit_2(["capacity", "--gpu", blank]) == f"gpu={blank!r}: is empty: {GPU_WANTED}"
    assert one_line_exit_2(["capacity", "--model", blank]) == f"model={blank!r}: is empty: {MODEL_WANTED}"


@pytest.fixture
def fifo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "pipe")
    return "pipe"


@pytest.mark.parametrize(("flag", "wanted"), [("--gpu", GPU_WANTED), ("--model", MODEL_WANTED)])
def test_a_fifo_given_as_a_model_or_gpu_is_named_as_one(fifo, flag, wanted):
    """Reading a FIFO blocks until a writer comes: it is refused unread (this test would hang otherwise), and the
    line says what it is, as a scenario's does (`not_a_file`)."""
    field = flag.removeprefix("--")
    assert one_line_exit_2(["capacity", flag, fifo]) == f"{field}={fifo!r}: not a regular file (a FIFO): {wanted}"


def test_a_model_folder_whose_config_is_a_fifo_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m").mkdir()
    os.mkfifo(tmp_path / "m" / "config.json")
    assert " nor a file (a folder whose config.json is not a regular file (a FIFO))" in one_line_exit_2(
        ["capacity", "--model", "m"])


def test_a_character_device_given_as_a_gpu_is_named_as_one():
    assert one_line_exit_2(["capacity", "--gpu", "/dev/null"]) == (
        f"gpu='/dev/null': not a regular file (a character device): {GPU_WANTED}")


def test_a_missing_gpu_file_is_still_no_preset_nor_a_file():
    assert one_line_exit_2(["capacity", "--gpu", "h10"]).startswith("gpu='h10': not a preset (")


@pytest.mark.parametrize("size", ["0", "0GiB", "0.0"])
@pytest.mark.parametrize("argv", [["run", "--memory-limit"],
                                  ["plan", "--slo", "ttft_s.p90=1", "--gpu", "h100-80gb", "--memory-limit"],
                                  ["plan", "--slo", "ttft_s.p90=1", "--gpu", "h100-80gb", "--offload-size"]],
                         ids=["run-memory-limit", "plan-memory-limit", "plan-offload-size"])
def test_a_size_of_zero_must_be_positive(tmp_path, argv, size):
    """No run fits under a memory limit of 0 B and no offload tier of 0 B holds a block: 0 is a size, and what is
    wrong with it is that it is not positive."""
    out = tmp_path / "out"
    flag = argv[-1]
    assert one_line_exit_2([*argv, size, "-o", str(out)]) == (
        f"{flag}={size!r}: must be positive: give a size such as 64GiB, 500MB or 4096")
    assert not out.exists()


@pytest.mark.parametrize(("argv", "echo"), [
    (["--slo", "ttft_s.p90=-1"], "--slo ttft_s.p90='-1': must be a positive, finite number of seconds"),
    (["--slo", "ttft_s.p90=-1.50"], "--slo ttft_s.p90='-1.50': must be a positive, finite number of seconds"),
    (["--slo", "tpot_s.p50=0"], "--slo tpot_s.p50='0': must be a positive, finite number of seconds"),
    (["--slo", "ttft_s.p90=2", "--gpu", "h100-80gb", "--gpu-hourly-cost", "h100-80gb=-2"],
     "--gpu-hourly-cost h100-80gb='-2': an hourly cost must be a positive, finite price in USD per GPU-hour"),
], ids=["slo-int", "slo-decimal", "slo-zero", "cost"])
def test_a_plan_number_flag_is_echoed_as_written(tmp_path, argv, echo):
    out = tmp_path / "out"
    assert one_line_exit_2(["plan", *argv, "-o", str(out)]) == echo
    assert not out.exists()


# A child module, run as `python -m` runs kvsim, that runs kvsim's `main` with SIGINT ignored (`nohup`, a background
# job) and whose command, once the CLI's handlers are in, is sent SIGINT and then SIGNUM from code a string `exec`
# runs (as a dataclass made by a lazy import runs it): the SIGINT is ignored, SIGNUM is taken as an interrupt.
# CPython (`Py_RunMain`, which `python -m` exits through) killed the process with SIGINT at exit when a
# KeyboardInterrupt of that exact type had ended such code.
CHILD = textwrap.dedent("""
    import importlib.util, signal, sys
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(SIGNUM, signal.SIG_DFL)  # as in a terminal: a test run under `nohup` passes SIGHUP on ignored
    sys.argv = ["kvsim", "run"]
    # the CLI's handlers without the CLI's imports (typer, pydantic: 0.2 s): interrupts.py imports nothing of kvsim
    spec = importlib.util.spec_from_file_location("interrupts", INTERRUPTS)
    interrupts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(interrupts)
    def command():
        interrupts.install()  # as `kvsim.cli.main` does first
        exec("import os, signal\\nos.kill(os.getpid(), signal.SIGINT)\\nos.kill(os.getpid(), SIGNUM)\\n"
             "for _ in range(1000): pass")
    import kvsim.__main__ as entry
    entry.import_cli = lambda: command
    entry.main()
""")


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGHUP, 129), (signal.SIGTERM, 143)])
def test_a_terminating_signal_after_an_ignored_ctrl_c_exits_with_its_own_status(tmp_path, signum, status):
    """128 + the signal's number (bash, POSIX), the status `kvsim.__main__` exits with: 129 for a SIGHUP, 143 for a
    SIGTERM, never a SIGINT's 130 (or death by SIGINT, which a shell reports as 130)."""
    child_code = CHILD.replace("SIGNUM", f"signal.{signum.name}")
    (tmp_path / "interrupted_child.py").write_text(child_code.replace("INTERRUPTS", repr(str(INTERRUPTS))))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OPENBLAS_NUM_THREADS": "1"}
    child = subprocess.run([sys.executable, "-m", "interrupted_child"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, timeout=60, check=False,
                           preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signum, signal.SIGINT}))
    assert child.returncode == status, (child.returncode, child.stderr)
    assert child.stderr.splitlines() == [
        "kvsim: interrupted (kvsim run) before it wrote any output; no file was changed"]


def test_a_new_command_in_the_same_process_starts_uninterrupted(monkeypatch):
    """`install` (each `kvsim.cli.main`) forgets a signal an earlier command took: that command's interrupt stopped
    the next one at its first progress report, with the earlier signal's status."""
    import threading

    from kvsim.cli import interrupts

    monkeypatch.setattr(interrupts, "_signals", [signal.SIGINT])
    monkeypatch.setattr(interrupts, "_interrupted", threading.Event())
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    interrupts._interrupted.set()
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        interrupts.install()
        try:
            interrupts.raise_if_interrupted()  # nothing came in this command
        except KeyboardInterrupt:  # not left to pytest, which stops the whole session on one
            pytest.fail("the earlier command's interrupt stopped this one")
        interrupts._signals.append(signal.SIGHUP)
        assert interrupts._interrupt().kvsim_exit_status == 129
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def test_a_command_leaves_the_process_signal_handlers_and_hook_as_it_found_them(capsys):
    """`kvsim.cli.main` in a process that goes on after it (a notebook's kernel): SIGINT, SIGTERM and SIGHUP are
    Python's and the system's again when the command ends, and the unraisable-exception hook is the one it found, so
    a later SIGTERM ends the kernel as before rather than raising into whatever cell runs, and the hooks do not pile
    up one per command."""
    from kvsim import cli

    numbers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {number: signal.getsignal(number) for number in numbers}
    hook = sys.unraisablehook
    defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL, signal.SIGHUP: signal.SIG_DFL}
    try:
        for number, handler in defaults.items():  # as a fresh process has them: the CLI takes all three
            signal.signal(number, handler)
        argv, sys.argv = sys.argv, ["kvsim", "--help"]
        try:
            with pytest.raises(SystemExit):
                cli.main()
        finally:
            sys.argv = argv
        assert {number: signal.getsignal(number) for number in numbers} == defaults
        assert sys.unraisablehook is hook
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        sys.unraisablehook = hook
    assert "Usage" in capsys.readouterr().out

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

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

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

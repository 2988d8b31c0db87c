"""Bad input found by the sixth sweep: each exits 2 with one line naming the field and the value, and
writes nothing, never a traceback, a setting silently dropped or a folder left behind."""

import pytest
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
PLAN = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2", "--set", "workload.num_requests=20"]


def _one_line_exit_2(argv: list[str]) -> str:
    result = runner.invoke(app, argv)
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvsim: error: "), result.stderr
    return lines[0].removeprefix("kvsim: error: ")


def test_a_plan_spec_knob_with_no_values_is_refused(tmp_path):
    """`engine: {max_num_seqs: []}` made the candidate grid (a product over the knobs) empty: the memory
    check then raised a bare `ValueError: min() arg is an empty sequence`."""
    (tmp_path / "spec.yaml").write_text("engine: {max_num_seqs: []}\n")
    assert _one_line_exit_2([*PLAN, "--spec", str(tmp_path / "spec.yaml"), "-o", str(tmp_path / "out")]) == (
        "plan.engine: max_num_seqs=[]: give at least one value for a knob (or leave it out)")
    assert [p.name for p in tmp_path.iterdir()] == ["spec.yaml"]


@pytest.mark.parametrize(("flags", "message"), [
    (["--set", "engine.kv_offload.cpu_bytes=1000"],
     "engine.kv_offload.cpu_bytes=1,000: smaller than one KV block (2,097,152 bytes, all tensor-parallel ranks "
     "together), so the tier would hold none; give at least one block, or 0 for no tier"),
    (["--set", "model=gemma-3-27b", "--engine", "prefix_cache=radix"],
     "engine.prefix_cache=radix: model=gemma-3-27b has sliding-window/chunked KV groups, which kvsim caches with "
     "the hash chain only"),
    (["--set", "latency.model=calibrated", "--set", "latency.profile={d}/nope.csv"],
     "path='{d}/nope.csv': file not found: {d}/nope.csv"),
], ids=["offload-tier-under-a-block", "radix-on-sliding-window", "calibrated-profile-missing"])
def test_plan_refuses_an_engine_it_cannot_build_before_it_makes_its_folder(tmp_path, flags, message):
    """What only building the engine refuses was found once the plan ran its first point: the plan folder
    had been claimed by then and was left behind with its marker alone."""
    flags = [flag.replace("{d}", str(tmp_path)) for flag in flags]
    assert _one_line_exit_2([*PLAN, *flags, "-o", str(tmp_path / "out")]) == message.replace("{d}", str(tmp_path))
    assert list(tmp_path.iterdir()) == []


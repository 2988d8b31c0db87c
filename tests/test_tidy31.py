"""Small defects of 7 December: an error names the setting the user wrote, money prints bounded, a rate search's
first probe past its cap and a source commit that is no commit are refused up front."""

import json

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path
from test_plan import SLO, toy

from kvsim.model.units import dollars
from kvsim.planning.cost import GpuPrice, cost_per_million_output_tokens
from kvsim.planning.plan import spec_from_options
from kvsim.planning.plan_checks import check_probe_cap
from kvsim.results.render import rows_to_markdown

PLAN = {"slo": SLO, "gpus": ["h100-80gb"], "max_replicas": 8}


def plan_argv(tmp_path, spec: dict, *flags: str) -> list[str]:
    scenario, spec_file = tmp_path / "toy.yaml", tmp_path / "spec.yaml"
    scenario.write_text(json.dumps(toy().model_dump(mode="json")))
    spec_file.write_text(json.dumps(spec))
    return ["plan", str(scenario), "--spec", str(spec_file), "--workers", "1", "-o", str(tmp_path / "plan"), *flags]


def test_a_spec_files_memory_limit_is_named_as_written(tmp_path):
    """1,000 bytes hold not even the toy's one replica (116,804 B of blocks alone, tests/test_plan_memory.py):
    the refusal names the spec file's field and the bytes written there, not the flag the user never gave;
    the same limit from `--memory-limit` names the flag."""
    argv = plan_argv(tmp_path, {**PLAN, "memory_limit_bytes": 1000})
    line = one_line_exit_2(argv)
    assert line.startswith("plan.memory_limit_bytes=1000 (") and "--memory-limit" not in line, line
    assert "nothing in this plan fits" in line and not (tmp_path / "plan").exists()
    flagged = plan_argv(tmp_path, PLAN, "--memory-limit", "1000")
    assert one_line_exit_2(flagged).startswith("--memory-limit 1,000 B: even the smallest point")


def test_a_rate_searchs_first_probe_past_its_cap_is_refused(tmp_path):
    """A rate search's first probe runs the traffic's first `probe_requests` (the toy has 100) and doubles up to
    `max_probe_requests`: a first probe of 80 past a cap of 50 is a contradiction, refused before anything runs
    (it ran the whole search and then advised raising the cap)."""
    rate = {**PLAN, "search": "rate", "max_probe_requests": 50}
    assert one_line_exit_2(plan_argv(tmp_path, {**rate, "probe_requests": 80})) == (
        "plan.probe_requests=80: a rate search's first probe of 80 requests is longer than "
        "plan.max_probe_requests=50, the longest probe it runs")
    assert not (tmp_path / "plan").exists()
    # the default 2,000 is capped at the traffic's 100 requests: the first probe is 100 requests
    assert one_line_exit_2(plan_argv(tmp_path, rate)).startswith("plan.probe_requests=2000: a rate search's first "
                                                                   "probe of 100 requests is longer")
    for fine in ({**rate, "probe_requests": 50}, {**rate, "max_probe_requests": 100}, {**PLAN, "max_probe_requests": 50}):
        check_probe_cap(toy(), spec_from_options(fine, [], [], [], [], [], None, None))  # no error


def test_money_prints_bounded():
    """Inside [1e-4, 1e15) dollars print as before (3 significant digits at least, README's `$4.00/hour`);
    outside, 3 significant digits with an exponent, never hundreds of zeros or digits."""
    assert dollars(4.0, 2) == "$4.00" and dollars(0.001, 2) == "$0.00100" and dollars(1234.567, 2) == "$1,234.57"
    assert dollars(0.0, 3) == "$0.000" and dollars(1e-4, 2) == "$0.000100"
    assert dollars(1e-320, 2) == "$1e-320" and dollars(2.733e303, 2) == "$2.73e+303"
    assert dollars(9.999e-5, 3) == "$0.0001" and dollars(1e15, 2) == "$1e+15"
    # `kvsim report`'s sentences keep their decimals (widen=False), bounded alike
    assert dollars(0.004608, 4, widen=False) == "$0.0046" and dollars(12.345, 2, widen=False) == "$12.35"
    assert dollars(1e305, 2, widen=False) == "$1e+305" and dollars(1e-320, 4, widen=False) == "$1e-320"
    # a table's float: whole from 10,000, with an exponent from 1e15 (`{:,.0f}` of 1e305 is 306 digits)
    table = rows_to_markdown([{"usd": 2.733e303}, {"usd": 123456.7}, {"usd": 999_999_999_999_999.0}, {"usd": 1e15}])
    assert table.splitlines()[2:] == ["| 2.733e+303 |", "| 123,457 |", "| 999,999,999,999,999 |", "| 1e+15 |"]


def test_a_tiny_price_per_million_tokens_is_not_zero():
    """$1e-320 a GPU-hour at 10,000 tokens/s: 1e-320 × 1e6 / 3.6e7 ≈ 2.78e-322 USD per million tokens, a
    (subnormal) float, not 0; at a normal price the figure is the plain formula's ($2 at 1,000 tokens/s:
    2 × 1e6 / 3.6e6 = 0.5556)."""
    tiny = cost_per_million_output_tokens(GpuPrice(1e-320, "given"), 1, 10_000.0)
    assert tiny is not None and 2.7e-322 < tiny < 2.9e-322
    assert cost_per_million_output_tokens(GpuPrice(2.0, "given"), 1, 1000.0) == pytest.approx(2 * 1e6 / 3.6e6)


@pytest.mark.parametrize("commit", ["xyz", "5daddb", "5daddb2g", "5" * 41, "5daddb2 "])
def test_import_profile_refuses_a_source_commit_that_is_no_commit(tmp_path, commit):
    """A git commit is a SHA-1 in hex, abbreviated to 7 digits at least (git's default) and 40 at most."""
    from test_profiles import write_bundle

    out = tmp_path / "p.csv"
    argv = ["import-profile", str(write_bundle(tmp_path / "bf16")), "-o", str(out), "--model", "llama-3.1-8b",
            "--gpu", "rtx-pro-6000", "--source-commit", commit]
    assert one_line_exit_2(argv) == f"--source-commit {commit!r}: not a git commit (7 to 40 hex digits)"
    assert not out.exists()


@pytest.mark.parametrize("commit", ["5daddb2", "A" * 40])
def test_import_profile_records_a_hex_commit(tmp_path, commit):
    from test_profiles import write_bundle
    from typer.testing import CliRunner

    from kvsim.cli import app

    out = tmp_path / "p.csv"
    argv = ["import-profile", str(write_bundle(tmp_path / "bf16")), "-o", str(out), "--model", "llama-3.1-8b",
            "--gpu", "rtx-pro-6000", "--source-commit", commit]
    assert CliRunner().invoke(app, argv).exit_code == 0
    assert f"# source_commit: {commit}\n" in out.read_text()

"""Small defects of 7 December: an error names the setting the user wrote, money prints bounded, a rate search's
first probe past its cap and a source commit that is no commit are refused up front."""

import json

from conftest import one_line_exit_2  # tests/ is on sys.path
from test_plan import SLO, toy

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

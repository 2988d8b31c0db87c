"""Small defects of 7 December: an error names the setting the user wrote, money prints bounded, a rate search's
first probe past its cap and a source commit that is no commit are refused up front."""

import json

from conftest import one_line_exit_2  # tests/ is on sys.path
from test_plan import SLO, toy

from kvsim.planning.plan import check_probe_cap, spec_from_options

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

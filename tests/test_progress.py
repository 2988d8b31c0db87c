"""What the long commands print while they work when stderr is not a terminal: plain lines
(`kvsim COMMAND: ...`, no control characters), none for work shorter than `PLAIN_FIRST_S`.

The thresholds are set to 0 here so that tiny worlds print (tests never depend on wall-clock time).
"""

import json
import re

import pytest
from test_plan import SLO, toy
from test_validate import CONSTANT, run_dir_of, write_run
from typer.testing import CliRunner

from kvsim.cli import app, progress
from kvsim.planning.plan import POINT_FORMAT
from kvsim.report.studies import Study, StudyConfig

CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")  # anything but a newline: no ANSI escapes, no \r


@pytest.fixture
def eager(monkeypatch):
    monkeypatch.setattr(progress, "PLAIN_FIRST_S", 0.0)
    monkeypatch.setattr(progress, "PLAIN_EVERY_S", 0.0)


def plain_lines(stderr: str, command: str) -> list[str]:
    assert not CONTROL.search(stderr), repr(stderr)
    return [line for line in stderr.splitlines() if line.startswith(f"kvsim {command}: ")]


def test_short_work_prints_nothing_and_lines_come_at_most_every_interval(monkeypatch, capsys):
    clock = iter([0.0, 1.0, 4.0, 5.0, 15.0, 16.0])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with progress.updater("run") as update:  # started at 0 s
        for text in ("a", "b", "c", "d", "e"):  # at 1, 4, 5, 15 and 16 s
            update(text, None, None, None)
    assert capsys.readouterr().err.splitlines() == ["kvsim run: b (4 s)", "kvsim run: d (15 s)"]


def test_a_phase_that_ends_prints_its_last_line(monkeypatch, capsys):
    clock = iter([0.0, 0.1, 0.2, 0.3, 0.4, 0.5])
    monkeypatch.setattr(progress.time, "monotonic", lambda: next(clock))
    with progress.updater("report") as update:
        update("study 1/2 a: 0/0 runs", None, None, "a")
        update("study 1/2 a: 3/3 runs", 3, 3, "a")  # too soon for a line of its own
        update("study 2/2 b: 0/0 runs", None, None, "b")  # a ended
        update("study 2/2 b: 2/2 runs", 2, 2, "b")
    # b, the last phase, ends with the work: its last line too (the report's last study was never printed)
    assert capsys.readouterr().err.splitlines() == ["kvsim report: study 1/2 a: 3/3 runs (0 s)",
                                                    "kvsim report: study 2/2 b: 2/2 runs (0 s)"]


def test_run_prints_simulated_time_and_requests(eager, tmp_path):
    result = CliRunner().invoke(app, ["run", "--set", "workload.num_requests=20", "-o", str(tmp_path / "r")])
    assert result.exit_code == 0, result.output
    lines = plain_lines(result.stderr, "run")
    assert lines and re.fullmatch(r"kvsim run: simulated [\d,.]+ s, 20/20 requests \(\d+ s\)", lines[-1])


def test_plan_counts_points_reused_from_points_jsonl(eager, tmp_path):
    scenario = tmp_path / "toy.yaml"
    scenario.write_text(json.dumps(toy().model_dump(mode="json")))
    args = ["plan", str(scenario), *sum((["--slo", f"{k}={v}"] for k, v in SLO.items()), []),
            "--gpu", "h100-80gb", "--gpu", "h200", "--max-replicas", "8", "--workers", "1",
            "-o", str(tmp_path / "p"), "--format", "json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    lines = plain_lines(first.stderr, "plan")
    pattern = r"kvsim plan: (\d+) points? done \((\d+) simulated now, (\d+) reused from points.jsonl\); (\d)/2 " \
              r"candidates still searching \(\d+ s\)"
    counts = [tuple(int(g) for g in re.fullmatch(pattern, line).groups()) for line in lines]
    total = counts[-1][0]
    assert [c[0] for c in counts] == list(range(1, total + 1)) and all(c[2] == 0 for c in counts)
    assert counts[0][3] == 2 and counts[-1][3] == 1  # the last point is the last open search's
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    assert re.fullmatch(pattern, plain_lines(again.stderr, "plan")[-1]).groups()[:3] == (str(total), "0", str(total))


def test_validate_prints_the_replay(eager, tmp_path):
    write_run(tmp_path)
    result = CliRunner().invoke(app, ["validate", str(run_dir_of(tmp_path)), "--gpu", "h100-80gb", "-o",
                                      str(tmp_path / "out"), "--no-figures", *sum((["--set", s] for s in CONSTANT), [])])
    assert result.exit_code == 0, result.output
    assert plain_lines(result.stderr, "validate")[-1].startswith("kvsim validate: simulated 0.1 s, 2/2 requests")


def test_a_study_counts_its_runs_as_they_are_submitted_and_finish():
    base = toy()
    st = Study(base, StudyConfig(num_requests=4, workers=1))
    seen = []
    st.on_runs = lambda: seen.append((st.runs_done, st.runs_submitted))
    st.run([base, base])
    assert seen == [(0, 2), (1, 2), (2, 2)]


def test_a_study_runs_a_scenario_once_and_hands_every_section_the_plain_runs_result(monkeypatch):
    """The report's sections ask for the same saturated run (the base engine's) up to three times: a scenario the
    study ran is not simulated again, still counted as a run, and its result is a plain `run_many`'s."""
    from kvsim.planning.sweep import run_many
    from kvsim.report import studies
    from kvsim.workload.scenario import make_scenario

    base, other = toy(), make_scenario({**toy().model_dump(mode="json"), "seed": 6})
    simulated = []

    def counting(scenarios, **kwargs):
        simulated.extend(scenarios)
        return run_many(scenarios, **kwargs)

    monkeypatch.setattr(studies, "run_many", counting)
    st = Study(base, StudyConfig(num_requests=4, workers=1))
    seen = []
    st.on_runs = lambda: seen.append((st.runs_done, st.runs_submitted))
    first = st.run([base, other])
    again = st.run([other, base, other])
    assert simulated == [base, other]  # the second call simulated nothing
    assert seen == [(0, 2), (1, 2), (2, 2), (2, 5), (5, 5)]
    assert [r.summary for r in again] == [first[1].summary, first[0].summary, first[1].summary]
    assert [r.summary for r in run_many([base, other], workers=1)] == [r.summary for r in first]
    assert [r.steps is None for r in first] == [True, True]  # kept steps are asked for apart:
    (with_steps,) = st.run([base], keep_steps=True)  # a run without them cannot stand in
    assert simulated == [base, other, base] and with_steps.steps is not None


def test_a_runs_progress_moves_during_the_run_and_changes_no_result():
    from kvsim.engine.simulate import simulate
    from kvsim.workload.scenario import load_scenario

    scenario = load_scenario(None, ["workload.num_requests=200"])
    calls = []
    with_progress = simulate(scenario, progress=lambda sim_s, done, total: calls.append((sim_s, done, total)))
    assert with_progress.summary == simulate(scenario).summary
    during = [c for c in calls if c[1] < c[2]]
    assert len(during) >= 5 and during == sorted(during)  # many calls before the end, never going back
    assert calls[-1][1:] == (200, 200)


def test_one_point_and_one_replica_are_singular():
    """The user-facing counts agree with their number: '1 point done', '1 replica', '2 replicas'."""
    from kvsim.model.units import counted

    assert progress.points_text(1, 1, 1, 1).startswith("1 point done (1 simulated now, 0 reused")
    assert progress.points_text(2, 0, 0, 1).startswith("2 points done")
    assert (counted(1, "replica"), counted(0, "replica"), counted(3, "GPU")) == ("1 replica", "0 replicas", "3 GPUs")


def test_a_plan_resumed_from_unstamped_points_simulates_them_again(tmp_path):
    """points.jsonl from before the format stamp (the same lines without "format", one with a made-up
    recomputed-token count): the rerun says so in one warning line, reuses none of them, and its answer is the
    first run's (the made-up count is never read)."""
    scenario = tmp_path / "toy.yaml"
    scenario.write_text(json.dumps(toy().model_dump(mode="json")))
    args = ["plan", str(scenario), *sum((["--slo", f"{k}={v}"] for k, v in SLO.items()), []),
            "--gpu", "h100-80gb", "--max-replicas", "8", "--workers", "1", "-o", str(tmp_path / "p"), "--format", "json"]
    first = CliRunner().invoke(app, args)
    assert first.exit_code == 0, first.output
    points = tmp_path / "p" / "points.jsonl"
    rows = [json.loads(line) for line in points.read_text().splitlines()]
    for row in rows:
        del row["format"]
        row["metrics"]["work"]["recomputed_tokens"] = 10**9
    points.write_text("".join(json.dumps(row) + "\n" for row in rows))
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0, again.output
    warnings = [line for line in again.stderr.splitlines() if line.startswith("kvsim: warning: ")]
    assert warnings == [f"kvsim: warning: {points}: {len(rows)} points of point format 0, written by another kvsim "
                        f"(this one writes format {POINT_FORMAT}), will be simulated again, not reused"]
    assert json.loads(again.stdout) == json.loads(first.stdout)

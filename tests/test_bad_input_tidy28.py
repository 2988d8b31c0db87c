"""Small defects other helpers noticed in earlier reviews (tidy28): each with the behaviour a user (or vLLM) expects.

Found: an OSError that is not stdout's, escaping a command, left a stray newline on stdout (the probe of whether
stdout still writes wrote one). `kvsim run --router least_kv` was told to give `--set router=VALUE`, which is then
refused pointing to `router.policy`. `kvsim run >&-` (stdout closed) exited 0 without its summary (click's echo skips
a None `sys.stdout`), and `--format json` was an AttributeError traceback.
"""

from __future__ import annotations

import errno
import os
import sys

import pytest
import typer
from conftest import one_line_exit_2  # tests/ is on sys.path

from kvsim.cli.stdout import unwritable_stdout
from kvsim.workload.scenario import load_scenario


def test_an_os_error_not_stdouts_writes_nothing_to_stdout(capsys):
    """The OSError passes through as it was; stdout (capsys's, in memory) stays empty: it was "\\n"."""
    error = OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError) as raised, unwritable_stdout():
        raise error
    assert raised.value is error
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("say", [lambda: typer.echo("a table"), lambda: sys.stdout.write("{}")])
def test_a_closed_stdout_is_one_line_exit_2(monkeypatch, capsys, say):
    """Python sets `sys.stdout` to None when it starts with descriptor 1 closed (`kvsim run >&-`): click's echo
    wrote nothing and the command exited 0; `sys.stdout.write` (`--format json`) raised AttributeError. Now it is
    said as a write to a closed descriptor fails (EBADF, "Bad file descriptor": os.strerror, what `os.write(1, b"")`
    raises in a process started with `>&-`), exit 2, as `> /dev/full` is."""
    monkeypatch.setattr(sys, "stdout", None)
    with pytest.raises(typer.Exit) as stop, unwritable_stdout():
        say()
    assert stop.value.exit_code == 2
    assert capsys.readouterr().err == f"kvsim: error: standard output: {os.strerror(errno.EBADF)}\n"
    assert sys.stdout.name == os.devnull
    sys.stdout.close()


@pytest.mark.parametrize(("argv", "setting"), [
    (["run", "--router", "least_kv"], "router.policy=least_kv"),  # docs/fleets-and-plan.md's router policies
    (["run", "--router=least_kv"], "router.policy=least_kv"),
    (["run", "--latency", "roofline"], "latency.model=roofline"),
    (["run", "--arrival", "poisson"], "workload.arrival.process=poisson"),
    (["report", "--engine", "v0"], "engine.scheduler=v0"),
])
def test_a_section_given_as_an_option_is_told_by_the_field_that_takes_the_value(tmp_path, monkeypatch, argv,
                                                                                 setting):
    """`--set router=least_kv`, the hint's old advice, is refused ("a section, not one value"); the hint names the
    field whose choices hold the value, and that setting loads."""
    monkeypatch.chdir(tmp_path)
    flag = argv[1].split("=")[0]
    key = setting.split("=")[0].rsplit(".", 1)[0]
    assert one_line_exit_2(argv) == (f"No such option: {flag}: {key} is a section of the scenario, not one value: "
                                     f"set its field, --set {setting} (see 'kvsim {argv[0]} --help')")
    load_scenario(None, ["replicas=2", setting])  # the advice is taken (a router routes a fleet)
    assert list(tmp_path.iterdir()) == []


def test_a_section_without_a_value_lists_its_fields_and_a_count_stays_one_value():
    """No value to match (`--multi-turn 3`: a count, no field's choice): its fields, each one settable;
    `replicas` also takes a count, so `--set replicas=VALUE` stands."""
    line = one_line_exit_2(["run", "--multi-turn", "3"])
    assert line == ("No such option: --multi-turn: workload.multi_turn is a section of the scenario, not one value: "
                    "set its fields (turns, think_time_s, timing), e.g. --set workload.multi_turn.turns=... "
                    "(see 'kvsim run --help')")
    assert one_line_exit_2(["run", "--replicas", "2"]) == ("No such option: --replicas: replicas is a scenario "
                                                           "field; give it as --set replicas=VALUE "
                                                           "(see 'kvsim run --help')")


def test_the_report_says_a_prompt_of_exactly_max_model_len_is_refused(tmp_path):
    """Max_model_len 2,048 and a prompt of exactly 2,048 tokens: vLLM refuses it (`_validate_input`:
    `token_num >= max_model_len`, no room for one output token), so one request in 3 is refused; the report said
    "longer than max_model_len", which a prompt of 2,048 is not."""
    from kvsim.report.studies import Study, StudyConfig
    from kvsim.report.text import introduction
    from kvsim.workload.scenario import make_scenario

    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.000000,2048,100\n"
                                    "2023-11-16 18:00:01.000000,1000,100\n2023-11-16 18:00:02.000000,500,50\n")
    base = make_scenario({"engine": {"max_model_len": 2048}, "workload": {
        "num_requests": 3, "arrival": {"process": "trace"}, "trace": {"format": "azure", "path": "t.csv"}}}, tmp_path)
    text = introduction(Study(base, StudyConfig(num_requests=3, workers=1)))
    assert text.endswith(" 33.3% of the requests have prompts of max_model_len tokens or more and are refused "
                         "(counted apart from every SLO).")
    assert "longer than" not in text


SATURATED = {"saturated": {"duration_s": 10.0, "mean_running": 3.14159, "preemptions_per_s": None, "waste": {},
                           "reason": None}}


@pytest.mark.parametrize(("call", "said"), [
    (lambda s: s.sustained({}), "summary={}: expected a run's summary (RunResult.summary)"),  # a KeyError
    (lambda s: s.sustained(None), "summary=None: expected a run's summary"),  # a TypeError
    (lambda s: s.sustained({"saturated": {}}), "summary={'saturated': {}}: expected a run's summary"),
    (lambda s: s.sustained(SATURATED, key="waste"), "key='waste': expected duration_s, mean_running or "
                                                    "preemptions_per_s"),  # round() of a dict
    (lambda s: s.sustained(SATURATED, key=5), "key=5: expected"),
    (lambda s: s.sustained(SATURATED, digits="2"), "digits='2': expected an int or None"),
    (lambda s: s.sustained(SATURATED, digits=True), "digits=True: expected an int or None"),
    (lambda s: s.saturated(load_scenario(None), "5"), "num_requests='5': expected a positive int"),  # ran 555
    (lambda s: s.saturated(load_scenario(None), 0), "num_requests=0: expected a positive int"),
    (lambda s: s.poisson("x"), "rate='x': expected a positive finite number"),
    (lambda s: s.poisson(float("inf")), "rate=inf: expected a positive finite number"),
    (lambda s: s.Study(load_scenario(None), "quick"), "cfg='quick': expected a StudyConfig"),  # AttributeError
    (lambda s: s.Study("s.yaml", s.StudyConfig.quick()), "base='s.yaml': expected a Scenario"),
])
def test_the_studies_notebook_helpers_refuse_a_bad_argument_naming_it(call, said):
    from kvsim.model.errors import KvsimError
    from kvsim.report import studies

    with pytest.raises(KvsimError) as refused:
        call(studies)
    assert str(refused.value).startswith(said)


def test_the_studies_helpers_still_answer_good_arguments():
    from kvsim.report.studies import poisson, sustained

    assert (sustained(SATURATED), sustained(SATURATED, digits=None), sustained(SATURATED, "preemptions_per_s"),
            sustained(SATURATED, "duration_s", 0)) == (3.14, 3.14159, None, 10.0)
    assert poisson(8) == "workload.arrival={process: poisson, rate: 8}"


@pytest.mark.parametrize("kind", ["empty", "notes", "run"])
def test_plan_from_python_writes_into_no_folder_kvsim_did_not_make(tmp_path, kind):
    """`plan(base, spec, out_dir)` wrote points.jsonl into any existing folder (a `tempfile.mkdtemp()`, a user's
    folder of notes, a run's output), where `RunResult.write` and `kvsim plan -o` refuse a folder without kvsim's
    marker or of another kind: the same rule (`check_output_dir`), refused before any point, nothing written."""
    from test_plan import toy  # tests/ is on sys.path

    from kvsim.model.errors import KvsimError
    from kvsim.planning.plan import plan
    from kvsim.planning.spec import make_plan_spec
    from kvsim.results.output_dir import claim_directory

    folder = tmp_path / "out"
    if kind == "run":
        claim_directory(folder, "run", [])  # a kvsim folder of another kind
    else:
        folder.mkdir()
    if kind == "notes":
        (folder / "notes.txt").write_text("mine\n")
    before = sorted(p.name for p in folder.iterdir())
    spec = make_plan_spec({"slo": {"ttft_s.p90": 0.3}, "gpus": ["h100-80gb"], "max_replicas": 1})
    with pytest.raises(KvsimError) as refused:
        plan(toy(), spec, folder)
    why = {"empty": "exists and has no .kvsim-output marker", "notes": "exists and has no .kvsim-output marker",
           "run": "holds kvsim 'run' output, not 'plan'"}[kind]
    assert str(refused.value).startswith(f"out_dir={str(folder)!r}: {why}")
    assert sorted(p.name for p in folder.iterdir()) == before


MIXED_FLEET = ("steps: none\nengine: {max_model_len: 2048}\nrouter: {policy: round_robin}\n"
               "replicas: [{count: 1}, {count: 1, engine: {max_model_len: 8192}}]\n")
TWO_TURNS = ("workload: {num_requests: 4, arrival: {process: trace}, trace: {format: azure, path: t.csv}, "
             "multi_turn: {turns: 2, think_time_s: 1.0}}\n")


@pytest.mark.parametrize(("engines", "second_turn"), [
    (MIXED_FLEET, [3100, 10, "finished", 1]),  # was 3,600: the 500-token reply turn 0 never got
    ("steps: none\nengine: {max_model_len: 2048}\n", [3100, 10, "rejected", ""]),  # one engine: refused either way
])
def test_a_refused_turn_has_no_reply_in_the_next_turns_prompt(tmp_path, monkeypatch, engines, second_turn):
    """Two conversations of two turns (open timing, round robin: turns alternate replicas 0, 1, 0, 1). Turn 0 of
    conversation 0 (3,000 tokens) reaches replica 0's max_model_len 2,048 and is refused, so it has no reply:
    turn 1's prompt is its earlier message and its new one, 3,000 + 100 = 3,100 tokens, not 3,000 + 500 (the reply
    asked) + 100, and replica 1 (8,192) serves it. Conversation 1 is served throughout: 1,000 + 100 + 100."""
    import kvsim

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.000000,3000,500\n"
                                    "2023-11-16 18:00:01.000000,100,10\n2023-11-16 18:00:02.000000,1000,100\n"
                                    "2023-11-16 18:00:03.000000,100,10\n")
    (tmp_path / "s.yaml").write_text(engines + TWO_TURNS)
    rows = kvsim.simulate(kvsim.load_scenario("s.yaml")).requests
    columns = ["prompt_tokens", "output_tokens", "status", *(["replica"] if "replica" in rows else [])]
    got = rows[columns].values.tolist()
    assert got[0][:3] == [3000, 500, "rejected"]
    assert got[1] == second_turn[:len(columns)]
    assert [row[:3] for row in got[2:]] == [[1000, 100, "finished"], [1200, 10, "finished"]]


def test_the_sustained_concurrency_exceeds_the_closed_form_because_sequences_hold_less_than_c():
    """`kvsim capacity --sustained` priced more output tokens a second than the closed form; not a bug but two
    assumptions, now said under the table (`SUSTAINED_NOTE`). A tiny case by hand: 17 blocks of 16 tokens, 16
    usable beside vLLM's null block; c = 64 (prompt 32 + output 32), 4 blocks a sequence at its end, so the closed
    form fits 16 / 4 = 4. In a saturated run a sequence's 32 steps hold 32 tokens (its prefill) and then 32 + j at
    decode step j = 1..31: (32 + Σ (32 + j)) / 32 = 32 + 15.5 = 47.5 tokens on average, about 3c/4, not c, so
    more than 4 run at once (constant 10 ms steps; preemptions keep it under 256 / 47.5 = 5.4)."""
    import kvsim
    from kvsim.model.capacity_plan import plan_capacity
    from kvsim.model.config import load_gpu, load_model
    from kvsim.model.engine_config import make_engine
    from kvsim.workload.scenario import make_scenario

    engine = {"num_gpu_blocks_override": 17, "max_model_len": 256, "max_num_seqs": 64, "async_scheduling": False}
    (row,) = plan_capacity(load_model("llama-3.1-8b"), load_gpu("h100-80gb"), make_engine(**engine), [64]).rows
    assert row.paged_max_seqs == 4
    scenario = make_scenario({"model": "llama-3.1-8b", "gpu": "h100-80gb", "steps": "none", "engine": engine,
                              "latency": {"model": "constant", "step_s": 0.01},
                              "workload": {"num_requests": 60, "arrival": {"process": "poisson", "rate": 1e5},
                                           "prompt_len": {"dist": "fixed", "value": 32},
                                           "output_len": {"dist": "fixed", "value": 32}}}, ".")
    saturated = kvsim.simulate(scenario).summary["saturated"]
    running = saturated["mean_running"]
    assert 4 < running < 256 / 47.5
    assert saturated["waste"]["token_state"] * 256 / running == pytest.approx(47.5, rel=0.01)


def test_the_capacity_table_says_what_the_closed_form_and_the_sustained_columns_assume(monkeypatch):
    """The note is printed under the cost table when the sustained columns are there (the simulation is stubbed:
    what is tested is the table, not the search), and not without --sustained."""
    from typer.testing import CliRunner

    import kvsim.planning.cost as cost
    from kvsim.cli import SUSTAINED_NOTE, app

    def sustained(plan, *args, **kwargs):
        return {**plan, "rows": [{**r, "sustained_rate_per_s": 1.0, "output_tokens_per_s_sustained": 2.0,
                                  "usd_per_million_output_tokens_sustained": 3.0} for r in plan["rows"]]}

    monkeypatch.setattr(cost, "add_sustained_costs", sustained)
    argv = ["capacity", "--context-lengths", "1024", "--gpu-hourly-cost", "2"]
    with_note = CliRunner().invoke(app, [*argv, "--sustained"], env={"COLUMNS": "200"})
    assert with_note.exit_code == 0, with_note.output
    assert " ".join(with_note.output.split()).endswith(SUSTAINED_NOTE)
    without = CliRunner().invoke(app, argv, env={"COLUMNS": "200"})
    assert "Sustained:" not in without.output


def test_the_sustained_rate_is_printed_beside_its_probes_length_and_convergence(monkeypatch):
    """`sustained_requests_per_probe` and `sustained_converged` qualify `sustained_rate_per_s` (how long the runs
    behind it were, whether the search settled); they were printed in the concurrency table, the rate and its price
    in the cost table below it. Both now sit in the cost table (the simulation stubbed: 3,200 requests, not
    converged)."""
    from typer.testing import CliRunner

    import kvsim.planning.cost as cost
    from kvsim.cli import app

    def sustained(plan, *args, **kwargs):
        return {**plan, "rows": [{**r, "sustained_rate_per_s": 1.0, "sustained_requests_per_probe": 3200,
                                  "sustained_converged": False, "output_tokens_per_s_sustained": 2.0,
                                  "usd_per_million_output_tokens_sustained": 3.0} for r in plan["rows"]]}

    monkeypatch.setattr(cost, "add_sustained_costs", sustained)
    out = CliRunner().invoke(app, ["capacity", "--context-lengths", "1024", "--gpu-hourly-cost", "2", "--sustained"],
                             env={"COLUMNS": "400"})
    assert out.exit_code == 0, out.output
    concurrency, costs = out.output.split("Cost at that concurrency")
    assert "sustained_requests_per_probe" not in concurrency and "sustained_converged" not in concurrency
    assert "sustained_requests_per_probe" in costs and "3,200" in costs and "sustained_converged" in costs
    assert "not re-run longer" in costs


@pytest.mark.parametrize(("free_blocks", "said"), [(0, True), (100, False)])
def test_a_full_disk_under_stdout_is_told_without_writing(tmp_path, monkeypatch, capsys, free_blocks, said):
    """Stdout a regular file on a full disk, the failed write (larger than the buffer) dropped: the file takes an
    empty write, so its filesystem's free blocks (os.fstatvfs, stubbed) tell ENOSPC apart, writing nothing."""
    import types

    out = open(tmp_path / "out.txt", "w", encoding="utf-8")  # noqa: SIM115  (closed below)
    monkeypatch.setattr(sys, "stdout", out)
    monkeypatch.setattr(os, "fstatvfs", lambda fd: types.SimpleNamespace(f_bavail=free_blocks))
    error = OSError(errno.ENOSPC, "No space left on device")
    try:
        with pytest.raises(typer.Exit if said else OSError), unwritable_stdout():
            raise error
    finally:
        out.close()
        if said:
            sys.stdout.close()
    assert (tmp_path / "out.txt").read_text() == ""
    assert capsys.readouterr().err == ("kvsim: error: standard output: No space left on device\n" if said else "")

"""A report section whose setting the scenario's engine refuses is not run: the report completes and the
section says why, in the engine's own words (the refusal `kvsim run` would print for that setting), that
nothing was simulated for it, and has no figure, table or latency-model line. The user's engine is never
switched to one that takes the setting. A v1 paged scenario still gets both sections with numbers
(`test_report.py`, the built-in report scenario)."""

import re
from pathlib import Path

import pytest

from kvsim.report import offload_study, speculation_study, studies
from kvsim.report.build import build_report
from kvsim.report.text import section_text
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario
from tests.test_report_smoke import TINY

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
# vLLM's CPU offload connector and its drafts live in the v1 engine only (kvsim.model.config's validators)
OFFLOAD_NEEDS_V1 = "kv_offload needs scheduler=v1 (got v0)"
SPECULATION_NEEDS_V1 = "speculative_config needs scheduler v1 (got v0)"
NOTHING_RUN = "Nothing was simulated for this section"


def _section(md: str, title_start: str) -> str:
    """The text of the report's section whose heading starts with `title_start`, up to the next heading."""
    (body,) = [part for part in md.split("\n## ") if part.startswith(title_start)]
    return body


@pytest.mark.slow
@pytest.mark.parametrize("name", ["paper-paged", "paper-slab-pow2"])
def test_a_v0_report_completes_and_its_offload_and_speculation_sections_say_why_they_did_not_run(tmp_path, name):
    """paper-paged (v0, paged) and paper-slab-pow2 (v0, slab): README's `kvsim report` example died with
    the offload tier's refusal after the load study, writing nothing."""
    base = load_scenario(SCENARIOS / f"{name}.yaml")
    out = build_report(base, tmp_path / "r", TINY)
    names = {p.name for p in out.iterdir()}
    assert {"report.md", "report.html", "alerts.yaml", "fig_load.png", "sustained_rate.csv", "fleet_routing.csv"} \
        <= names
    assert not {n for n in names if n.startswith(("fig_offload", "fig_speculation", "offload_", "speculation"))}
    md = (out / "report.md").read_text()
    for title, reason in (("How much KV offload", OFFLOAD_NEEDS_V1), ("Speculative decoding", SPECULATION_NEEDS_V1)):
        text = _section(md, title)
        assert reason in text and NOTHING_RUN in text
        assert "![" not in text and "Table `" not in text and "_Latency model" not in text
    html = (out / "report.html").read_text()
    for ref in re.findall(r"(?:src|href)='([^']+)'", html):
        assert (out / ref).is_file(), ref
    assert "> **At a glance**" in md and "offload" not in md.split("> **At a glance**")[1].split("\n\n")[0]
    assert "scheduler v0" in md  # the introduction describes the user's engine, as given


def _study(*overrides: str) -> studies.Study:
    return studies.Study(load_scenario(None, list(overrides), default=REPORT_SCENARIO), TINY)


def test_the_sections_check_the_variant_they_would_run_not_a_rule_of_their_own():
    """The refusal is whatever the scenario validation or the engine builder says for the section's first
    variant: sampling n > 1 (scenario level), a sliding-window model (the builder), a tier beside drafts."""
    n2 = speculation_study.speculation(_study("workload.n=2"))
    assert n2.skipped is not None and "speculates for single sequences" in n2.skipped and not n2.tables
    hybrid = speculation_study.speculation(_study("model=gemma-3-27b", "gpu=h100-80gb", "engine.max_model_len=4096"))
    assert hybrid.skipped is not None and "needs the paged allocator over full attention" in hybrid.skipped
    drafts = "engine.speculative_config={method: eagle3, num_speculative_tokens: 3, acceptance_length: 2.0}"
    with_drafts = offload_study.offload_sizing(_study(drafts))
    assert with_drafts.skipped is not None and "kv_offload with speculative_config" in with_drafts.skipped


def test_the_words_of_a_skipped_section_quote_the_refusal():
    st = _study("engine.scheduler=v0")
    sec = offload_study.offload_sizing(st)
    assert sec.skipped is not None and OFFLOAD_NEEDS_V1 in sec.skipped
    text = section_text(sec, st, TINY)
    assert OFFLOAD_NEEDS_V1 in text and NOTHING_RUN in text and "CPU KV offload tier" in text
    assert st.base.engine.scheduler == "v0"  # not switched to run it anyway


@pytest.mark.parametrize(("name", "given"), [("azure-autoscale", "replicas=1"), ("disagg-1p1d", "replicas=[2 groups]")])
def test_a_fleet_scenario_is_refused_up_front_in_one_line(tmp_path, name, given):
    """The report varies one engine (its fleet section sizes its own replicas): a fleet scenario was a KeyError
    traceback (autoscaled) or a slab variant's refusal (disaggregated) mid-report; now one line, nothing written."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    out = tmp_path / "r"
    result = CliRunner().invoke(app, ["report", str(SCENARIOS / f"{name}.yaml"), "--quick", "-o", str(out)])
    assert result.exit_code == 2 and not out.exists()
    assert result.stderr.count("\n") == 1 and given in result.stderr and "--set replicas=null" in result.stderr

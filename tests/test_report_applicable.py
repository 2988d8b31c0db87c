"""A report section whose setting the scenario's engine refuses is not run: the report completes and the
section says why, in the engine's own words (the refusal `kvsim run` would print for that setting), that
nothing was simulated for it, and has no figure, table or latency-model line. The user's engine is never
switched to one that takes the setting. A v1 paged scenario still gets both sections with numbers
(`test_report.py`, the built-in report scenario).

A comparison with a variant the engine refuses (slab allocators, prefix caching off) leaves that variant's
rows out and quotes the refusal in one sentence; the rest of its section runs on the user's engine."""

import re
from functools import partial
from pathlib import Path

import pandas as pd
import pytest

from kvsim.model.errors import KvsimError
from kvsim.report import capacity_study, offload_study, paging_study, speculation_study, studies
from kvsim.report.applicable import left_out_text, refused_settings
from kvsim.report.build import build_report
from kvsim.report.section import Section
from kvsim.report.text import section_text
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario
from kvsim.workload.traces import read_mooncake
from tests.test_report_smoke import TINY

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
# vLLM's CPU offload connector and its drafts live in the v1 engine only (kvsim.model.engine_config's validators)
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
    the offload tier's refusal after the load study, writing nothing. The offload section sizes the user's
    allocator, so the slab engine's refusal is the tier validator's first rule it breaks, the allocator's."""
    base = load_scenario(SCENARIOS / f"{name}.yaml")
    out = build_report(base, tmp_path / "r", TINY)
    names = {p.name for p in out.iterdir()}
    assert {"report.md", "report.html", "alerts.yaml", "fig_load.png", "sustained_rate.csv", "fleet_routing.csv"} \
        <= names
    assert not {n for n in names if n.startswith(("fig_offload", "fig_speculation", "offload_", "speculation"))}
    md = (out / "report.md").read_text()
    offload = OFFLOAD_NEEDS_V1 if name == "paper-paged" else "kv_offload needs allocator=paged (got slab-pow2)"
    for title, reason in (("How much KV offload", offload), ("Speculative decoding", SPECULATION_NEEDS_V1)):
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
    variant: beam search (scenario level), a sliding-window model (the builder), a tier beside drafts."""
    beams = speculation_study.speculation(_study("workload.beam_width=2"))
    assert beams.skipped is not None and "speculates for single sequences" in beams.skipped and not beams.tables
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


# Engines `kvsim run` takes whose settings pin the paged allocator: the paging study's slab rows and the context
# study's slab-max columns cannot be varied into them. Each refusal is the engine's own.
TIER = "engine.kv_offload={cpu_bytes: 4GiB}"
DRAFTS = "engine.speculative_config={method: ngram, num_speculative_tokens: 3, acceptance_length: 2.0}"
RADIX = "engine.prefix_cache=radix"
SLAB_REFUSED = {TIER: "kv_offload needs allocator=paged (got {})",
                DRAFTS: "engine.speculative_config: needs the paged allocator over full attention (got allocator={},",
                RADIX: "prefix_cache=radix needs allocator paged (got {})"}
LEFT_OUT = "Left out: the runs with"


@pytest.mark.slow
@pytest.mark.parametrize("setting", [TIER, DRAFTS, RADIX], ids=["kv_offload", "speculative_config", "radix"])
def test_a_paged_only_engine_reports_without_the_comparisons_it_refuses(tmp_path, setting):
    """`kvsim report --set <setting>` died with the slab-max variant's refusal in the context study, writing
    nothing. Now every section runs on the user's engine as given; where a comparison needs a variant the engine
    refuses, its rows are left out and one sentence quotes the refusal."""
    base = load_scenario(None, [setting], default=REPORT_SCENARIO)
    out = build_report(base, tmp_path / "r", TINY)
    md = (out / "report.md").read_text()
    slab = SLAB_REFUSED[setting]

    context = pd.read_csv(out / "context_concurrency.csv")
    assert not [c for c in context.columns if "slab" in c] and context.simulated_paged_sustained.notna().all()
    text = _section(md, "Context")
    assert LEFT_OUT in text and slab.format("slab-max") in text and "slab concurrency falls" not in text

    assert list(pd.read_csv(out / "waste_breakdown.csv").allocator) == ["paged"]
    rates = pd.read_csv(out / "sustained_rate.csv")
    assert list(rates.allocator) == ["paged"] and rates.max_rate_meeting_slo.notna().all()
    text = _section(md, "Paging multiplier")
    assert "Paging multiplier: cannot be shown for this engine" in text and "nan" not in text
    assert all(slab.format(a) in text for a in ("slab-max", "slab-pow2", "slab-oracle"))

    # caching off is no refusal, with a CPU tier too (vLLM runs an offloading connector with
    # --no-enable-prefix-caching): both rows of the prefix study and the capacity formula run
    caching = pd.read_csv(out / "prefix_sharing.csv").prefix_caching
    assert set(caching) == {False, True} and LEFT_OUT not in _section(md, "Prefix sharing")
    assert (out / "capacity_formula.csv").is_file() and LEFT_OUT not in _section(md, "The capacity formula")

    assert md.count(LEFT_OUT) == 2  # context, paging
    assert {"fig_context.png", "fig_paging.png", "fig_prefix.png", "fig_load.png", "fig_alerts.png", "alerts.yaml",
            "load_curves.csv", "alert_firings.csv"} <= {p.name for p in out.iterdir()}
    html = (out / "report.html").read_text()
    for ref in re.findall(r"(?:src|href)='([^']+)'", html):
        assert (out / ref).is_file(), ref
    glance = md.split("> **At a glance**")[1].split("\n\n")[0]
    assert "users fit on" in glance and "requests/s**" in glance


def test_the_left_out_sentence_quotes_each_refusal():
    one = left_out_text({"engine.allocator=slab-max": "engine: no (got slab-max)"})
    assert one == ("Left out: the runs with `engine.allocator=slab-max`, a setting this scenario's engine cannot take "
                   "(kvsim refuses it with \"engine: no (got slab-max)\"); the report does not change the engine to "
                   "make them run.")
    two = left_out_text({"a=1": "no 1", "a=2": "no 2", "a=3": "no 3"})
    assert "`a=1`, `a=2` and `a=3`, settings" in two and "refuses them with \"no 1\", \"no 2\" and \"no 3\"" in two


def test_a_variant_the_engine_takes_is_not_left_out():
    """The default report engine takes every slab allocator and caching off: nothing refused (its report is
    test_report.py's, unchanged)."""
    st = _study()
    assert refused_settings({f"engine.allocator={a}": partial(st.saturated, f"engine.allocator={a}")
                             for a in paging_study.ALLOCATORS}) == {}
    radix = _study(RADIX)
    assert refused_settings({"engine.allocator=slab-pow2": partial(radix.saturated, "engine.allocator=slab-pow2"),
                             "engine.allocator=paged": partial(radix.saturated, "engine.allocator=paged")}) \
        == {"engine.allocator=slab-pow2": "engine: prefix_cache=radix needs allocator paged (got slab-pow2)"}


def test_an_offload_slice_this_engine_refuses_whole_is_not_sized_and_says_why():
    """At max_model_len 2,048 the 12 Mooncake requests of TINY's offload slice all have prompts of 2,048 tokens or
    more (the shortest is 2,290: read from the shipped trace), so vLLM refuses each and no run would serve one: the
    section was a TypeError traceback (TTFT p90 None at every size) and the report died. Now it is not run and
    says why; nothing is simulated for it, the engine is not changed."""
    from kvsim.report.fleet_study import TRACE

    st = _study(TIER, "engine.max_model_len=2048")
    records = read_mooncake(st.base.resolve_path(TRACE, "workload.trace.path"))[: TINY.offload_requests]
    assert len(records) == 12 and min(r.prompt_len for r in records) >= 2048
    sec = offload_study.offload_sizing(st)
    assert sec.skipped is not None and not sec.tables and st.runs_submitted == 0
    text = section_text(sec, st, TINY)
    assert text.startswith("Not run: every one of the first 12 Mooncake requests has a prompt of max_model_len "
                           "(2,048 tokens) or more") and text.endswith(f"{NOTHING_RUN}.")


@pytest.mark.slow  # the section's 4 short runs (one served request each): about 1.2 s on two busy cores
def test_the_offload_section_sizes_the_users_engine_with_prefix_caching_off_by_ttft_alone():
    """The section turned prefix caching on (the fleet section's traffic does) and sized a tier, with a hit-rate
    target, for an engine the user does not run; with the user's caching off, size_offload refuses a hit-rate
    target. Now it sizes the engine as given: no prefix-cache query is counted (as vLLM counts none), so every hit
    rate is empty, no hit-rate target is set, and the text says the tier is sized by TTFT alone. A v1 slab engine,
    which the section ran on the paged allocator, is refused the tier in the engine's words (kv_offload needs
    allocator=paged)."""
    st = _study("engine.enable_prefix_caching=false")
    sec = offload_study.offload_sizing(st)
    points = sec.tables["offload_points"]
    assert points.gpu_hit_rate.isna().all() and points.hit_rate_all_tiers.isna().all()
    assert sec.facts["target_hit_rate"] is None and sec.facts["size_for_hit_rate_bytes"] is None
    # one of TINY's 12 prompts is under 4,096 tokens (2,290: read from the trace); each tier stores its blocks
    assert list(points.num_finished) == [1] * 4 and (points.bytes_stored[points.cpu_bytes > 0] > 0).all()
    text = section_text(sec, st, TINY)
    assert "prefix caching off" in text and "sized by TTFT alone" in text and "GPU's prefix cache" not in text
    slab = offload_study.offload_sizing(_study("engine.allocator=slab-max"))
    assert slab.skipped == "engine: kv_offload needs allocator=paged (got slab-max)"


def test_the_context_grid_leaves_out_a_max_model_len_the_pool_cannot_hold():
    """257 blocks of 16 tokens x 128 KiB (Llama-3.1-8B): 0.50 GiB, one kept back as v1's null block, so 256 x 16 =
    4,096 tokens a sequence can hold: the user's max_model_len 4,096 fits, 8,192 (1.00 GiB) and 16,384 do not. The
    report died with the 8,192-token variant's refusal before its first run; now those rows are left out (the
    section's `left_out`, quoted in one sentence) and the rest runs."""
    lens, refused = capacity_study.context_lengths(_study("engine.num_gpu_blocks_override=257"))
    assert lens == [1024, 2048, 4096]
    assert list(refused) == ["engine.max_model_len=8192", "engine.max_model_len=16384"]
    assert refused["engine.max_model_len=8192"].startswith(
        "max_model_len=8192: one request needs 1.00 GiB of KV cache, the pool holds 0.50 GiB (257 blocks)")
    assert capacity_study.context_lengths(_study())[1] == {}  # the default pool (2,000-odd blocks) holds 16,384


def test_a_section_whose_every_run_would_be_refused_says_so_and_runs_nothing():
    """Context: 33 blocks of 16 tokens, one kept back as v1's null block: 32 x 16 = 512 tokens a sequence can
    hold, so max_model_len 512 fits and every length of the grid (1,024 up) is refused; `lens[0]` was an IndexError.
    Prefix sharing: 100-token prompts fit max_model_len 128, but the section puts a min(2000, 128 // 2) = 64-token
    system prompt before each, 164 >= 128: every request refused, and its text read a None TTFT (a TypeError)."""
    st = _study("engine.max_model_len=512", "engine.num_gpu_blocks_override=33")
    context = capacity_study.context_concurrency(st)
    assert context.skipped is not None and not context.tables and st.runs_submitted == 0
    assert section_text(context, st, TINY).startswith(
        "Not run: this engine's pool cannot hold one request of any max_model_len of the section's grid (1024, 2048, "
        "4096, 8192, 16384 tokens; kvsim refuses the shortest with \"max_model_len=1024: one request needs")
    st = _study("engine.max_model_len=128", "workload.prompt_len={dist: fixed, value: 100}")
    prefix = capacity_study.prefix_sharing(st)
    assert prefix.skipped is not None and not prefix.tables and st.runs_submitted == 0
    assert section_text(prefix, st, TINY) == (
        "Not run: with the section's 64-token system prompt before each prompt, every one of its 4 requests has a "
        "prompt of max_model_len (128 tokens) or more, which this engine refuses (as vLLM does): no request would be "
        f"served, with prefix caching or without. {NOTHING_RUN}.")


def test_an_engine_kvsim_run_refuses_is_refused_before_any_section():
    """A CPU tier of 1 byte holds no block: `kvsim run` refuses it. The report refused it only where a section
    built a variant (the context grid's: an IndexError once every length was 'refused')."""
    with pytest.raises(KvsimError) as refused:
        _study("engine.kv_offload={cpu_bytes: 1}")
    assert "\n" not in str(refused.value) and "cpu_bytes" in str(refused.value)


def test_the_formula_text_fits_no_constant_on_the_fixed_rows_when_none_was_kv_bound():
    """scenarios/mooncake-conv-replay.yaml (TINY): every prompt c/2 + output c/2 row was request-bound, only the
    scenario's mix filled the pool, so k over the fixed rows is NaN, and the report printed "k = nan". Here one
    KV-bound row of sustained 16 against a closed form of 48 (k = 16 x 48 / 48^2 = 1/3), the fixed row capped by
    the requests sent."""
    from kvsim.report.text import formula_text

    st = _study()
    table = pd.DataFrame({"lengths": ["prompt 128 + output 128", "scenario length mix"], "context_len": [256, 500],
                          "closed_form_seqs": [3000.0, 48.0], "sustained_running": [90.0, 16.0],
                          "preemptions_per_s": [0.0, 0.5], "max_seqs_without_preemption": [144, 24],
                          "peak_running_transient": [144, 32], "limited_by": ["requests", "kv"]})
    facts = {"fitted_constant": 16 / 48, "fitted_constant_fixed": float("nan"), "pool_blocks": 1999,
             "num_kv_bound": 1, "other_limits": ["requests"], "vllm_max_concurrency": 7.8}
    text = formula_text(Section("formula", "f", {"capacity_formula": table}, facts), st)
    assert "nan" not in text and "gives k = 0.33 over the 1 KV-bound rows (none of the prompt c/2 + output c/2 rows " \
        "was KV-bound, so they fit no k of their own)" in text
    assert "the peak averages 0.67× the closed form" in text  # 32 / 48

"""The report's closed-form concurrency counts every KV group, as `kvsim capacity` does.

Gemma-3-27B on an H100, 3,101 blocks of 16 tokens (3,100 usable: v1's null block), chunks of 2,048 tokens:
6 groups of sliding layers (window 1,024) and 1 full-attention group (vLLM's get_kv_cache_groups), every
request 2,032 prompt + 16 output tokens, 2,047 tokens of KV at the end (the last token's is never written).

Decoding at any length n in 2,032..2,047 (or 2,033..2,048), the full group holds cdiv(n, 16) = 128 blocks and
a sliding group the 1,023 tokens n − 1,023..n − 1 (SlidingWindowManager skips n − 1,024 + 1), which span 65
blocks at every n but the aligned one: 128 + 6 · 65 = 518. Prefilling, every group holds the whole prompt
until the step ends: 7 · 128 = 896. The last sequence admitted prefills beside the others decoding:
1 + (3,100 − 896) / 518 = 5.25, so 5 sequences. Counted as full attention, usable // cdiv(2,047, 16) =
3,100 // 128 = 24, which the report said.
"""

import pytest

import kvsim
from kvsim.model.capacity_plan import plan_capacity
from kvsim.report import capacity_study, studies
from kvsim.report.studies import StudyConfig, saturated
from kvsim.report.text import closed_form, formula_text
from kvsim.workload.scenario import REPORT_SCENARIO, load_scenario, make_scenario

SEQS = 5  # 1 + (3,100 − 896) // 518
REQUESTS = 6  # the report's saturated runs send 3 × this at once

GEMMA = {"name": "swa", "model": "gemma-3-27b", "gpu": "h100-80gb",
         "engine": {"num_gpu_blocks_override": 3101, "max_num_batched_tokens": 2048, "max_model_len": 4096,
                    "max_num_seqs": 256},
         "workload": {"num_requests": REQUESTS, "arrival": {"process": "poisson", "rate": 1e6},
                      "prompt_len": {"dist": "fixed", "value": 2032}, "output_len": {"dist": "fixed", "value": 16}}}


@pytest.fixture(scope="module")
def gemma() -> studies.Study:
    return studies.Study(make_scenario(GEMMA, None),
                         StudyConfig(num_requests=REQUESTS, workers=1, saturate_max_requests=3 * REQUESTS))


def test_the_fp8_sections_closed_form_is_capacitys_and_the_simulated_decoders(gemma):
    """fp8 halves the page, not the blocks (`num_gpu_blocks_override` pins 3,101 for both): 5 sequences each.
    The saturated run behind the row decodes 5 sequences at most (its running count shows a 6th for a step: a
    prompt's chunk admitted beside them, preempted when the decoders grow)."""
    assert gemma.mean_kv_len == 2047
    table = capacity_study.kv_quantization(gemma).tables["kv_quantization"].set_index("kv_cache_dtype")
    (row,) = plan_capacity(gemma.model, gemma.gpu, gemma.base.engine, [2047]).rows
    assert (row.blocks_per_seq, row.prefill_blocks_per_seq) == (518, 896)
    assert list(table.closed_form_paged_at_mean_len) == [row.paged_max_seqs, row.paged_max_seqs_fp8] == [SEQS] * 2
    run = kvsim.simulate(saturated(gemma.base, REQUESTS, "steps=all"))
    assert int(run.steps["num_decode_seqs"].max()) == SEQS
    assert table.loc["auto", "peak_running_transient"] == run.summary["max_running"] == SEQS + 1


def test_the_formulas_closed_form_counts_every_group_and_its_prompt_chunk(gemma):
    """The formula's rows, before rounding down: 2,048 tokens (prompt 1,024 + output 1,024) and the scenario's
    2,047, 1 + 2,204 / 518 = 5.25 (full attention would say 3,100 / 128 = 24.2), and the largest max_num_seqs
    that never preempts at 2,048 tokens is that, rounded down. 4,096 tokens: decoding, 256 + 6 · 65 = 646;
    prefilling, the full group's 256 and each sliding group's window − 1 + the chunk, cdiv(1,023 + 2,048, 16)
    + 1 = 193 (SlidingWindowSpec's worst case): 256 + 6 · 193 = 1,414, so 1 + 1,686 / 646 = 3.61."""
    sec = capacity_study.capacity_formula(gemma)
    table = sec.tables["capacity_formula"].set_index("context_len")
    assert list(table.loc[[2048, 2047, 4096], "blocks_per_seq"]) == [518, 518, 646]
    assert list(table.loc[[2048, 2047, 4096], "closed_form_seqs"]) == [round(1 + 2204 / 518, 2)] * 2 + [
        round(1 + 1686 / 646, 2)]
    assert table.loc[2048, "max_seqs_without_preemption"] == SEQS
    assert "k · (1 + (pool_blocks − prefill_blocks) ÷ blocks_per_seq)" in formula_text(sec, gemma)


def test_a_full_attention_engines_closed_form_is_unchanged():
    """One full-attention group: usable blocks // cdiv(mean KV length, block size), as before."""
    base = load_scenario(None, default=REPORT_SCENARIO)
    st = studies.Study(base, StudyConfig(num_requests=2, workers=1))
    assert len(st.kv_layout.groups) == 1 and st.kv_layout.groups[0].kind == "full"
    table = capacity_study.kv_quantization(st).tables["kv_quantization"]
    blocks_per_seq = -(-round(st.mean_kv_len) // base.engine.block_size)
    assert list(table.closed_form_paged_at_mean_len) == [(n - st.paged_null_blocks) // blocks_per_seq
                                                        for n in table.num_gpu_blocks]
    assert st.paged_fit(st.num_blocks, round(st.mean_kv_len)) == (st.num_blocks - 1) // blocks_per_seq
    assert closed_form(st) == "pool_blocks ÷ blocks_per_seq"

"""The report's speculative-decoding section: the crossover rule on hand-built tables, and the study's runs
against speedups worked out by hand (a constant step time) or from the roofline's shape."""

import pandas as pd
import pytest

from kvsim.report.speculation_study import DEFAULT_SPECULATION, crossover, speculation, speculation_config
from kvsim.report.studies import Study, StudyConfig
from kvsim.workload.scenario import make_scenario


@pytest.mark.parametrize(("speedups", "expected"), [
    ([1.6, 1.2, 0.9, 1.1], (16, 4)),  # stops at 16; the 1.1 past it does not make it pay again
    ([1.6, 1.2, 1.05, 1.01], (None, 64)),  # pays on the whole grid
    ([0.8, 0.9, 1.2, 0.7], (1, None)),  # never pays below the first stop
    ([1.3, 1.0, 0.9, 0.8], (4, 1)),  # equal TPOT is no gain
])
def test_crossover_is_the_first_batch_size_without_a_gain(speedups, expected):
    table = pd.DataFrame({"max_num_seqs": [64, 1, 16, 4], "tpot_speedup": [speedups[3], speedups[0], speedups[2],
                                                                            speedups[1]]})
    assert crossover(table) == expected


def constant_world(**engine):
    """Prompts of 16 tokens, replies of 7, every step 10 ms whatever it computes."""
    return make_scenario({
        "name": "spec-constant", "engine": {"max_model_len": 2048, "num_gpu_blocks_override": 400, **engine},
        "workload": {"num_requests": 10, "arrival": {"process": "poisson", "rate": 1.0},
                     "prompt_len": {"dist": "fixed", "value": 16}, "output_len": {"dist": "fixed", "value": 7}},
        "latency": {"model": "constant", "step_s": 0.01}, "seed": 1})


def test_with_a_constant_step_the_speedup_is_the_acceptance_length_at_every_batch_size():
    """A fixed acceptance of 2 drafts (synthetic length 3, K = 3): after the prefill step gives token 1, two
    verify steps give tokens 2-4 and 5-7, against six decode steps: TPOT 2 · 10 ms / 6 against 10 ms, a 3×
    speedup whatever the batch, since a step costs the same however many tokens it computes."""
    spec = {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 3}
    st = Study(constant_world(speculative_config=spec), StudyConfig(workers=1, speculation_batch_sizes=(4, 1)))
    assert speculation_config(st) == spec  # the scenario's own configuration is the one studied
    sec = speculation(st)
    table, speedup = sec.tables["speculation"], sec.tables["speculation_speedup"]
    assert list(speedup.max_num_seqs) == [1, 4]
    assert list(table.tpot_mean_s) == pytest.approx([0.01, 0.02 / 6] * 2)
    assert list(speedup.tpot_speedup) == pytest.approx([3.0, 3.0])
    assert list(table.mean_acceptance_length.dropna()) == pytest.approx([3.0, 3.0])
    assert sec.facts["crossover_batch_size"] is None and sec.facts["last_paying_batch_size"] == 4


def test_on_the_roofline_speculation_pays_for_one_sequence_and_stops_for_a_large_batch():
    """H100, Llama-3.1-8B, EAGLE-3 K = 7 at acceptance length 2.77: one sequence's step is memory-bound (16 GB
    of weights read per step whatever the 8 tokens), so TPOT falls by nearly the acceptance length; 256
    sequences × 8 tokens = 2,048 tokens a step, far past the H100's ridge (~300 FLOP per weight byte), so
    the verify step costs more than the 2.77 tokens it emits."""
    base = make_scenario({"name": "spec-roofline", "model": "llama-3.1-8b", "gpu": "h100-80gb",
                          "workload": {"num_requests": 10, "prompt_len": {"dist": "fixed", "value": 256},
                                       "output_len": {"dist": "fixed", "value": 128}}, "seed": 0})
    st = Study(base, StudyConfig(workers=1, speculation_batch_sizes=(1, 256)))
    assert speculation_config(st) == DEFAULT_SPECULATION
    sec = speculation(st)
    low, high = sec.tables["speculation_speedup"].tpot_speedup
    assert 1.3 < low < 2.77 and high < 1.0
    assert sec.facts["crossover_batch_size"] == 256 and sec.facts["last_paying_batch_size"] == 1

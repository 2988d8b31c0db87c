"""Bad input found by the twenty-seventh sweep (the newer scenario sections field by field, and their combinations).
Each is refused (the CLI: exit 2, one line naming the field and the value, nothing written; the Python API: a
`KvsimError`), or said as it is.

Found: speculative decoding under a token budget that no CUDA-graph capture size of 1 + K tokens fits (vLLM refuses
to start) was refused by the roofline and calibrated latency models only: under `latency.model: constant` it ran.
"""

from __future__ import annotations

import pytest

import kvsim
from kvsim.model.errors import KvsimError
from tests.conftest import one_line_exit_2

TINY = {"workload": {"num_requests": 4, "prompt_len": {"dist": "fixed", "value": 64},
                     "output_len": {"dist": "fixed", "value": 8}}, "steps": "none"}
EAGLE_K2 = {"method": "eagle", "num_speculative_tokens": 2, "acceptance_rates": 0.5}


@pytest.mark.parametrize("latency", ["roofline", "constant"])
def test_a_budget_no_capture_size_of_a_speculative_step_fits_is_refused_whatever_the_latency_model(latency):
    """vLLM rounds each capture size up to a multiple of 1 + K (`adjust_cudagraph_sizes_for_spec_decode`) and
    drops those past its largest, min(2 · max_num_seqs · (1 + K), 512, max_num_batched_tokens) = min(6, 512, 2) = 2
    here: sizes {1, 2} round up to 3, past 2, so none is left and vLLM refuses to start. The constant latency
    model prices no padding, so it never asked."""
    with pytest.raises(KvsimError, match=r"^engine\.max_num_batched_tokens=2: vLLM refuses to start with "
                                         r"num_speculative_tokens=2: no CUDA graph size up to 2 is a multiple of 3"):
        kvsim.simulate(TINY, latency__model=latency, engine__speculative_config=EAGLE_K2, engine__max_num_seqs=1,
                       engine__max_num_batched_tokens=2)


def test_the_cli_refuses_it_under_the_constant_model_in_one_line(tmp_path):
    out = tmp_path / "out"
    line = one_line_exit_2(["run", "--set", "latency.model=constant", "--set", "workload.num_requests=4",
                            "--set", "engine.max_num_seqs=1", "--set", "engine.max_num_batched_tokens=2",
                            "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, '
                            '"acceptance_rates": 0.5}', "-o", str(out)])
    assert line.startswith("engine.max_num_batched_tokens=2: vLLM refuses to start") and not out.exists()


@pytest.mark.parametrize("engine", [{"enforce_eager": True, "max_num_batched_tokens": 2},
                                    {"max_num_batched_tokens": 6}])
def test_eager_steps_or_a_budget_that_fits_one_size_still_run_under_the_constant_model(engine):
    """Eager: no graphs to capture. A budget of 6: sizes 1, 2 and 4 (up to min(6, 512, 6) = 6) round up to 3, 3
    and 6, and 3 is within the largest, 4."""
    result = kvsim.simulate(TINY, latency__model="constant", engine__speculative_config=EAGLE_K2,
                            engine__max_num_seqs=1, **{f"engine__{k}": v for k, v in engine.items()})
    assert result.summary["num_finished"] == 4

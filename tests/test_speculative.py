"""Speculative decoding's acceptance models and `--speculative-config` validation; expected values by hand."""

import numpy as np
import pytest

from kvsim.model.engine_config import make_engine
from kvsim.model.errors import KvsimError
from kvsim.model.speculative_config import SpeculativeConfig
from kvsim.sched.speculative import (
    AcceptanceModel,
    Speculation,
    acceptance_model,
    conditional_from_unconditional,
    constant_rate_for_length,
    min_variance_schedule,
)
from kvsim.workload.request import RequestStatus
from tests.conftest import make_request, plan_steps, tiny_world


def spec(**fields):
    return SpeculativeConfig(**{"method": "ngram", "num_speculative_tokens": 3, **fields})


def test_an_integer_synthetic_length_is_a_fixed_acceptance_that_draws_nothing():
    # vLLM: length 3, K = 3 -> unconditional [1, 1, 0] -> exactly 2 drafts accepted, 3 tokens a step
    model = acceptance_model(spec(synthetic_acceptance_length=3.0))
    assert model.conditional_rates == (1.0, 1.0, 0.0) and model.is_fixed
    rng = np.random.default_rng(7)
    state = rng.bit_generator.state
    assert model.sample(rng, 4).tolist() == [2, 2, 2, 2]
    assert rng.bit_generator.state == state  # no random number consumed
    assert model.mean_acceptance_length == 3.0


def test_vllm_minimum_variance_schedule_and_conditional_rates():
    assert min_variance_schedule(3.4, 5) == pytest.approx((1.0, 1.0, 0.4, 0.0, 0.0))
    assert min_variance_schedule(4.0, 3) == (1.0, 1.0, 1.0)
    assert min_variance_schedule(1.0, 2) == (0.0, 0.0)
    # unconditional [0.7, 0.4, 0.1] -> conditional [0.7, 0.4/0.7, 0.1/0.4]; once 0, stays 0
    assert conditional_from_unconditional((0.7, 0.4, 0.1)) == pytest.approx((0.7, 4 / 7, 0.25))
    assert conditional_from_unconditional((0.5, 0.0, 0.0)) == (0.5, 0.0, 0.0)
    model = acceptance_model(spec(synthetic_acceptance_rates=[0.7, 0.4, 0.1]))
    assert model.unconditional_rates == pytest.approx((0.7, 0.4, 0.1))
    assert model.mean_acceptance_length == pytest.approx(1 + 0.7 + 0.4 + 0.1)


def test_constant_conditional_rate_gives_leviathans_expected_length():
    # Leviathan et al.: E[tokens per step] = (1 - a^(K+1)) / (1 - a); a = 0.8, K = 3 -> 2.952
    model = acceptance_model(spec(acceptance_rates=0.8))
    assert model.conditional_rates == (0.8, 0.8, 0.8)
    assert model.mean_acceptance_length == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    # and back: length (1 - 0.5^4) / 0.5 = 1.875 -> a = 0.5
    assert constant_rate_for_length(1.875, 3) == pytest.approx(0.5, abs=1e-12)
    assert acceptance_model(spec(acceptance_length=1.875)).conditional_rates == pytest.approx((0.5,) * 3)
    assert acceptance_model(spec(acceptance_length=4.0)).conditional_rates == pytest.approx((1.0,) * 3)


def test_sampled_acceptance_matches_the_rates_and_is_seeded():
    model = AcceptanceModel((0.9, 0.5, 0.2))
    counts = model.sample(np.random.default_rng(0), 200_000)
    # P(a = 0) = 0.1, P(1) = 0.9·0.5, P(2) = 0.9·0.5·0.8, P(3) = 0.9·0.5·0.2
    expected = [0.1, 0.45, 0.36, 0.09]
    assert np.bincount(counts, minlength=4) / len(counts) == pytest.approx(expected, abs=0.005)
    again = model.sample(np.random.default_rng(0), 200_000)
    assert np.array_equal(counts, again)


@pytest.mark.parametrize(("fields", "message"), [
    ({"num_speculative_tokens": 0}, "speculative_config.num_speculative_tokens=0: must be greater than zero"),
    ({"num_speculative_tokens": -2}, "num_speculative_tokens=-2"),
    ({"method": "medusa2"}, "speculative_config.method='medusa2'"),
    ({"acceptance_rates": [0.5, 1.5, 0.2]}, "acceptance_rates=[0.5, 1.5, 0.2]: rates must be in [0, 1], got 1.5"),
    ({"acceptance_rates": -0.1}, "acceptance_rates=-0.1"),
    ({"acceptance_rates": [0.5, 0.5]}, "acceptance_rates has 2 entries, num_speculative_tokens=3"),
    ({"acceptance_length": 4.5}, "acceptance_length=4.5 must be in [1, num_speculative_tokens + 1 = 4]"),
    ({"synthetic_acceptance_rates": [0.4, 0.6, 0.1]}, "must be non-increasing"),
    ({"synthetic_acceptance_length": 2.0, "rejection_sample_method": "strict"}, "only valid with"),
    ({"acceptance_rates": 0.5, "acceptance_length": 2.0}, "give exactly one of"),
    ({"method": "draft_model"}, "method=draft_model needs model"),
])
def test_bad_speculative_config_is_one_line_naming_the_field(fields, message):
    config = {"method": "eagle", "num_speculative_tokens": 3, **fields}
    if not any(k.startswith(("acceptance", "synthetic")) for k in fields):
        config["acceptance_rates"] = 0.7
    with pytest.raises(KvsimError) as error:
        make_engine(speculative_config=config)
    text = str(error.value)
    assert "\n" not in text and message in text and text.startswith("speculative_config")


def test_speculation_needs_scheduler_v1_and_k_below_max_model_len():
    config = {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.7}
    with pytest.raises(KvsimError, match="speculative_config needs scheduler v1"):
        make_engine(scheduler="v0", speculative_config=config)
    from kvsim.model.config import load_gpu

    engine = make_engine(max_model_len=64, speculative_config={**config, "num_speculative_tokens": 64})
    with pytest.raises(KvsimError, match="num_speculative_tokens=64: must be smaller than max_model_len=64"):
        engine.check_vllm_startup(64, load_gpu("h100-80gb"))
    make_engine(max_model_len=64, speculative_config=config).check_vllm_startup(64, load_gpu("h100-80gb"))


def test_scheduling_policy_is_vllms_name():
    assert make_engine().scheduling_policy == "fcfs"
    assert make_engine(scheduling_policy="priority").scheduling_policy == "priority"
    with pytest.raises(KvsimError, match="scheduling_policy='lifo'"):
        make_engine(scheduling_policy="lifo")


def test_a_step_whose_drafts_the_budget_cut_to_none_takes_no_traced_acceptance_length():
    """2 drafts a step, a budget of 4 tokens. B (prompt 2, accepting none) and A (prompt 1, traced lengths 3, 1)
    prefill in step 1. Step 2: B's verify of 2 drafts takes 3 tokens, leaving A 1: vLLM schedules no draft of A's
    (`num_scheduled_spec_tokens` 0), a plain decode that counts no spec-decode step, and B finishes. Step 3: A
    alone verifies 2 drafts, its first verify: length 3, both accepted, so step 4's verify starts 3 tokens on
    (A's output 5 of 6) and A finishes with it. (Counting step 2 as a verify gave step 3 the length 1.)"""
    sched = tiny_world(max_num_batched_tokens=4, caching=False)
    sched.speculation = Speculation(AcceptanceModel((0.0, 0.0)), 0)  # past the traces: no draft accepted
    b, a = make_request(0, 0.0, 2, 2), make_request(1, 0.0, 1, 6)
    b.acceptance_lengths, a.acceptance_lengths = (1, 1), (3, 1)
    seen = plan_steps(sched, {0: [b, a]}, 4)
    assert [scheduled for scheduled, _, _, _ in seen] == [[(0, 2), (1, 1)], [(0, 3), (1, 1)], [(1, 3)], [(1, 3)]]
    assert (a.num_output_tokens, a.status) == (6, RequestStatus.FINISHED)

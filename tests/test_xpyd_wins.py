"""Where a split wins under the roofline (issue 22): long prompts and a tight TPOT SLO, derived by hand.

Llama-3.1-8B on H100s, roofline latency; every prompt 16,384 tokens, every output 201 (200 inter-token
gaps), one request every DELTA_S = 0.6 s, replicas round robin; the step budget (16,400 tokens) takes a
whole prompt beside the running decodes, so a prompt is one step. The step prices come from the latency
model for each step's shape (`step_s`, below): colocated replicas with vLLM's default async scheduling (the
CPU overhead hidden behind the step), the disaggregated instances stepping synchronously (added to it);
the timelines are argued here:

* Colocated on k replicas, a replica gets a request every k · DELTA_S. Alone, a request's last token comes
  PREFILL_S + 200 decode steps after its arrival, at least 0.5510 + 200 · 6.744 ms = 1.900 s. For k = 2, 3
  (1.2 s, 1.8 s) its replica's next request arrives before that: v1 runs the decodes first and admits
  the new prompt in the same step, so one of the request's 200 gaps is a step of at least PREFILL_S and
  TPOT >= (PREFILL_S + 199 · DECODE_1_S) / 200 = 9.47 ms. For k = 4 (2.4 s) nothing overlaps: every gap
  is a decode step alone, TPOT <= one decode at the longest context, 6.75 ms.
* 1P1D: the prefill instance takes PREFILL_S < DELTA_S a request, so no prompt waits; the decode instance
  runs only decode steps (and the one-token recompute of each arriving request's last prompt token), each
  gap one step. A request spends at most 201 steps there; if each step carries at most 4 sequences it
  takes at most 201 · DECODE_4_S = 1.85 s < 4 · DELTA_S, so at most 4 requests overlap: the bound holds
  and TPOT <= DECODE_4_S = 9.21 ms.

With a TPOT p90 SLO of 9.3 ms the split meets it on 2 GPUs, colocated needs 4: the prefill GPU removes the
half-second prefill steps from every decode, which no number of colocated replicas below 4 can dilute.
"""

import pytest

from kvsim.engine.builder import make_latency, resolve_engine
from kvsim.fleet.disagg import simulate_disagg
from kvsim.fleet.driver import simulate_fleet
from kvsim.latency.step_plan import StepPlan
from kvsim.workload.scenario import make_scenario

PROMPT, OUTPUT, DELTA_S, NUM_REQUESTS, SLO_TPOT_S = 16384, 201, 0.6, 12, 0.0093


def raw(replicas):
    return {"name": "long-prompts", "model": "llama-3.1-8b", "gpu": "h100-80gb",
            "engine": {"max_model_len": PROMPT + 256, "max_num_batched_tokens": PROMPT + 16},
            "workload": {"num_requests": NUM_REQUESTS, "arrival": {"process": "constant", "rate": 1 / DELTA_S},
                         "prompt_len": {"dist": "fixed", "value": PROMPT},
                         "output_len": {"dist": "fixed", "value": OUTPUT}},
            "router": {"policy": "round_robin"}, "replicas": replicas}


def step_s(*shapes, asynchronous=True):
    """The roofline's price of one step computing `(new tokens, tokens before them)` per sequence, on an
    engine with vLLM's default async scheduling (a colocated replica: the CPU overhead hides behind the
    step) or without it (`asynchronous=False`: a disaggregated instance, which kvsim steps synchronously)."""
    scenario = make_scenario({**raw(1), "engine": {**raw(1)["engine"], "async_scheduling": asynchronous}})
    latency, plan = make_latency(resolve_engine(scenario)), StepPlan()
    for num_new, past in shapes:
        plan.add(num_new, past, 1, True)
    return latency.step_time(plan)


LONGEST = PROMPT + OUTPUT  # the most context a decode ever reads
PREFILL_S = step_s((PROMPT, 0))  # a prompt alone, the least a step holding one costs
DECODE_1_S = step_s((1, PROMPT))  # one decode at the least context
DECODE_4_S = step_s(*[(1, LONGEST)] * 4, asynchronous=False)  # 4 decodes at the most context, a decode instance


def tpots(result):
    return result.requests.sort_values("request_id")["tpot_s"].to_numpy()


def test_the_bounds_as_priced():
    assert PREFILL_S + 200 * DECODE_1_S > 3 * DELTA_S  # a request outlasts its replica's next arrival at k <= 3
    assert 201 * DECODE_4_S < 4 * DELTA_S  # at most 4 requests overlap on the decode instance
    assert PREFILL_S < DELTA_S
    assert DECODE_4_S < SLO_TPOT_S < (PREFILL_S + 199 * DECODE_1_S) / 200


@pytest.mark.parametrize("k", [2, 3])
def test_colocated_below_four_replicas_misses_the_tpot_slo(k):
    result = simulate_fleet(make_scenario(raw(k)))
    low = (PREFILL_S + 199 * DECODE_1_S) / 200
    with_successor = tpots(result)[:NUM_REQUESTS - k]  # the last k have no later request on their replica
    assert (with_successor >= low * (1 - 1e-12)).all()
    assert result.summary["tpot_s"]["p90"] > SLO_TPOT_S


def test_colocated_on_four_replicas_meets_it_with_every_decode_alone():
    result = simulate_fleet(make_scenario(raw(4)))
    assert (tpots(result) <= step_s((1, LONGEST)) * (1 + 1e-12)).all()
    assert result.summary["tpot_s"]["p90"] <= SLO_TPOT_S


def test_one_prefill_and_one_decode_gpu_meet_it():
    pd = raw([{"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}])
    pd["kv_transfer_config"] = {"kv_link": "nvlink", "prefill_router": {"policy": "round_robin"}}
    result = simulate_disagg(make_scenario(pd))
    assert (result.requests["status"] == "finished").all()
    assert (tpots(result) <= DECODE_4_S * (1 + 1e-12)).all()
    assert result.summary["tpot_s"]["p90"] <= SLO_TPOT_S
    assert result.summary["disaggregation"]["pools"]["prefill"]["num_instances"] == 1  # 2 GPUs against 4

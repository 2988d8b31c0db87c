"""Metamorphic relations, fifth round: features that work alone, combined.

`test_metamorphic.py` to `test_metamorphic4.py` hold the earlier rounds. Here:

* a replica's own `max_model_len` is the engine's: vLLM ends a request when its tokens reach the engine's
  limit (`FINISHED_LENGTH_CAPPED`), so a fleet whose group sets the limit serves every request as one engine
  with that limit does, and each group of a fleet of two limits as its own engine.
"""

from __future__ import annotations

import numpy as np
import pytest

import kvsim
from tests.test_metamorphic2 import write_trace

STEP = {"model": "constant", "step_s": 0.01}


def traced(path, engine=None, model="llama-3.1-8b", **workload):
    """A run of the `sharegpt_tokens` trace at `path`, at its own arrivals, a constant 10 ms step."""
    return {"model": model, "gpu": "h100-80gb", "seed": 0, "engine": {"max_model_len": 1024, **(engine or {})},
            "workload": {"trace": {"format": "sharegpt_tokens", "path": str(path)}, "arrival": {"process": "trace"},
                         **workload},
            "latency": STEP}


def shared_rows(seed, n=30, first_token_id=0):
    """`n` rows 80 ms apart on average whose prompts start with up to 600 ids of one of three common texts
    (ids from `first_token_id` on), then ids of their own."""
    rng = np.random.default_rng(seed)
    texts = [rng.integers(first_token_id, first_token_id + 30_000, 600).tolist() for _ in range(3)]
    rows, arrival_ns = [], 0
    for _ in range(n):
        arrival_ns += int(rng.exponential(0.08) * 1e9)
        prompt, output = int(rng.integers(20, 700)), int(rng.integers(1, 150))
        common = int(rng.integers(0, min(prompt, 600)))
        own = rng.integers(first_token_id + 40_000, first_token_id + 90_000, prompt - common).tolist()
        rows.append({"arrival_time_ns": arrival_ns, "input_toks": prompt, "output_toks": output,
                     "input_tok_ids": texts[int(rng.integers(0, 3))][:common] + own})
    return rows


# ------------------------------------------------------------------ a replica's max_model_len


LONG_ROWS = [(i * 10**9, prompt, 300) for i, prompt in enumerate((900, 200, 1000, 700))]


@pytest.mark.parametrize(("top", "group"), [(4096, 1024), (1024, 4096)])
def test_a_groups_max_model_len_is_its_engines(tmp_path, top, group):
    """A fleet of one group that sets max_model_len serves every request as one engine with that limit:
    capped to max_model_len − prompt tokens (vLLM ends a request whose tokens reach the limit), 124 for a
    900-token prompt under 1024. The fleet capped every request at the scenario's limit before routing, and
    its replica refused what did not fit its own: a 1024 group under a 4096 scenario rejected every prompt
    of 900 tokens asking for 300, and a 4096 group under a 1024 scenario cut them to 124."""
    path = write_trace(tmp_path / "t.jsonl", LONG_ROWS)
    raw = traced(path, {"max_model_len": top, "num_gpu_blocks_override": 2000})
    fleet = kvsim.simulate({**raw, "replicas": [{"count": 1, "engine": {"max_model_len": group}}]})
    alone = kvsim.simulate(traced(path, {"max_model_len": group, "num_gpu_blocks_override": 2000}))
    by_hand = [min(output, group - prompt) for _, prompt, output in LONG_ROWS]
    assert alone.requests.output_tokens.tolist() == by_hand
    assert fleet.requests.drop(columns="replica").equals(alone.requests)


def test_each_group_of_a_fleet_of_two_limits_serves_as_its_engine(tmp_path):
    """Round robin over a 1024 and a 4096 replica: rows 0 and 2 go to the first, capped at 1024 − prompt
    (124, 24), rows 1 and 3 to the second, uncapped (300); a disaggregated decode instance caps as its engine
    does too (its prefill instance, asked for one token, has the scenario's 4096)."""
    path = write_trace(tmp_path / "t.jsonl", LONG_ROWS)
    raw = traced(path, {"max_model_len": 4096, "num_gpu_blocks_override": 2000})
    fleet = kvsim.simulate({**raw, "replicas": [{"count": 1, "engine": {"max_model_len": 1024}}, {"count": 1}]})
    assert fleet.requests.output_tokens.tolist() == [124, 300, 24, 300]
    assert fleet.requests.status.eq("finished").all()
    disagg = kvsim.simulate({**raw, "replicas": [{"count": 1, "kv_role": "kv_producer"},
                                                 {"count": 1, "kv_role": "kv_consumer", "engine": {"max_model_len": 1024}}],
                             "kv_transfer_config": {"kv_connector": "NixlConnector"}})
    assert disagg.requests.output_tokens.tolist() == [124, 300, 24, 300]
    assert disagg.requests.status.eq("finished").all()

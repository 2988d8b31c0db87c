"""A step row counts a chunk of one prompt token as prefill, not as a decode (docs/metrics.md: `num_prefill_tokens`
are prompt or recomputed tokens, `num_decode_seqs` sequences decoding). The latency models price such a chunk as a
decode (one query after the computed context: the same work), which this leaves as it was; only the row's
classification is checked. Expected rows by hand from vLLM v1's scheduler order (running first, then waiting,
each prefill chunked to the token budget left)."""

import kvsim
from tests.conftest import make_request, tiny_world

ROW = ["num_batched_tokens", "num_prefill_tokens", "num_decode_seqs"]


def test_a_prompts_last_token_alone_in_a_chunk_is_prefill():
    # Prompt 17, output 3, a 16-token budget: step 1 computes 16 prompt tokens, step 2 the 17th alone (the first
    # token is sampled at its end), steps 3 and 4 decode one token each. Σ prefill = 17, Σ decode seqs = 3 - 1.
    result = kvsim.simulate(None, workload__num_requests=1, workload__prompt_len={"dist": "fixed", "value": 17},
                            workload__output_len={"dist": "fixed", "value": 3}, engine__max_num_batched_tokens=16,
                            engine__max_num_seqs=4, engine__max_model_len=64, latency__model="constant")
    assert result.steps[ROW].values.tolist() == [[16, 16, 0], [1, 1, 0], [1, 0, 1], [1, 0, 1]]


def test_a_one_token_chunk_in_the_middle_of_a_prompt_is_prefill():
    # A 2-token budget; A (prompt 1, output 3) and B (prompt 4, output 1) arrive together. Step 1: A's prompt (1)
    # and B's first token (1). Step 2: A decodes (1), B's 2nd prompt token gets the 1 left. Step 3: A's last decode,
    # B's 3rd token. Step 4: B's 4th, its last prompt token (its one output token sampled).
    s = tiny_world(max_num_batched_tokens=2)
    for rid, prompt, output in ((0, 1, 3), (1, 4, 1)):
        assert s.add(make_request(rid, 0.0, prompt=prompt, output=output))
    rows = []
    for step in range(4):
        plan = s.schedule(step * 0.01)
        rows.append([plan.num_tokens, plan.num_row_prefill_tokens, plan.num_row_decode_seqs])
        s.complete(plan, (step + 1) * 0.01)
    assert rows == [[2, 2, 0], [2, 1, 1], [2, 1, 1], [1, 1, 0]]

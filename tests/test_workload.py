import json

import numpy as np
import pytest

from kvsim.model.errors import KvsimError
from kvsim.workload.draws import Arrival
from kvsim.workload.generate import arrival_times, build_requests, lognormal_sigma, sample_lengths
from kvsim.workload.scenario import make_scenario
from kvsim.workload.servegen import read_servegen
from kvsim.workload.traces import (
    read_azure,
    read_lengths,
    read_mooncake,
    read_sharegpt_tokens,
    read_vllm_sharegpt,
)


def scenario(**workload):
    base = {"num_requests": 2000, "arrival": {"process": "poisson", "rate": 10},
            "prompt_len": {"dist": "fixed", "value": 100}, "output_len": {"dist": "fixed", "value": 50}}
    return make_scenario({"workload": {**base, **workload}})


def test_poisson_gamma_constant_rates():
    rng = np.random.default_rng(0)
    for process, cv in (("poisson", 1.0), ("gamma", 3.0), ("constant", 1.0)):
        t = arrival_times(Arrival(process=process, rate=10, cv=cv), 20_000, rng)
        gaps = np.diff(t)
        assert gaps.mean() == pytest.approx(0.1, rel=0.05)
        expected_cv = {"poisson": 1.0, "gamma": 3.0, "constant": 0.0}[process]
        assert gaps.std() / gaps.mean() == pytest.approx(expected_cv, abs=0.1)


def test_lognormal_by_mean_and_p99():
    rng = np.random.default_rng(1)
    dist = scenario(prompt_len={"dist": "lognormal", "mean": 1000, "p99": 6000}).workload.prompt_len
    values = sample_lengths(dist, 200_000, rng, scenario(), "workload.prompt_len")
    assert values.mean() == pytest.approx(1000, rel=0.03)
    assert np.percentile(values, 99) == pytest.approx(6000, rel=0.05)
    with pytest.raises(KvsimError, match="no lognormal"):
        lognormal_sigma(100, 1e9)


def test_output_capped_by_max_model_len():
    reqs = build_requests(scenario(output_len={"dist": "fixed", "value": 5000}), 1024, np.random.default_rng(0))
    assert all(r.prompt_len + r.output_len <= 1024 for r in reqs)


def test_shared_prefix_fraction_and_multi_turn_history():
    s = scenario(shared_prefix={"tokens": 300, "fraction": 0.5}, multi_turn={"turns": 3, "think_time_s": 2.0},
                 num_requests=3000)
    reqs = build_requests(s, 100_000, np.random.default_rng(0))
    by_conv = {}
    for r in reqs:
        by_conv.setdefault(r.content.segments[-1][0][1], []).append(r)
    with_prefix = sum(1 for turns in by_conv.values() if turns[0].content.segments[0][0][0] == "system")
    assert with_prefix / len(by_conv) == pytest.approx(0.5, abs=0.05)
    turns = next(iter(by_conv.values()))
    first, second, third = sorted(turns, key=lambda r: r.arrival_s)
    assert second.arrival_s - first.arrival_s == pytest.approx(2.0)
    # turn 2's prompt is turn 1's prompt and reply plus a new message
    assert second.content.segments[: len(first.content.segments)] == first.content.segments
    assert second.prompt_len == first.prompt_len + first.output_len + 100
    assert third.prompt_len == second.prompt_len + second.output_len + 100


def test_same_seed_same_workload():
    a = build_requests(scenario(), 4096, np.random.default_rng(3))
    b = build_requests(scenario(), 4096, np.random.default_rng(3))
    assert [(r.arrival_s, r.prompt_len, r.output_len) for r in a] == [(r.arrival_s, r.prompt_len, r.output_len)
                                                                      for r in b]


def test_real_traces_parse(traces):
    azure = read_azure(traces / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv")
    assert len(azure) == 19_366 and azure[0].arrival_s == 0.0
    assert azure[-1].arrival_s == pytest.approx(3502, abs=1)
    mooncake = read_mooncake(traces / "mooncake_fast25" / "conversation_trace.jsonl")
    assert len(mooncake) == 12_031 and mooncake[0].segments[0] == (("mooncake", 0), 512)
    assert sum(n for _, n in mooncake[0].segments) == mooncake[0].prompt_len
    sharegpt = read_sharegpt_tokens(traces / "llmservingsim_sharegpt" / "sharegpt-llama-3.1-8b-300-sps10.jsonl")
    assert len(sharegpt) == 300 and len(sharegpt[0].token_ids) == sharegpt[0].prompt_len + sharegpt[0].output_len
    for name, rows in (("sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 30_731),
                       ("arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", 28_257),
                       ("bwb_stats_llama2_tokenizer_filtered_v2.csv", 33_768)):
        assert len(read_lengths(traces / "request_lengths" / name)) == rows
    servegen = read_servegen(traces / "servegen_deepseek_r1", np.random.default_rng(0), 43_200, 600, [0, 1, 5])
    assert len(servegen) > 10 and all(0 <= r.arrival_s < 600 for r in servegen)


def test_token_level_sharegpt_hits_real_shared_prefixes(traces):
    from kvsim.engine.simulate import simulate

    s = make_scenario({"model": "llama-3.1-8b", "engine": {"max_model_len": 8192},
                       "workload": {"num_requests": 300, "arrival": {"process": "trace"},
                                    "trace": {"format": "sharegpt_tokens",
                                              "path": str(traces / "llmservingsim_sharegpt" /
                                                          "sharegpt-llama-3.1-8b-300-sps10.jsonl")}}})
    summary = simulate(s).summary
    assert summary["num_finished"] == 300 and summary["prefix_cache_hit_rate"] > 0.02


def test_vllm_sharegpt_json(tmp_path):
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([
        {"id": "a", "conversations": [{"from": "human", "value": "x" * 400}, {"from": "gpt", "value": "y" * 80}]},
        {"id": "b", "conversations": [{"from": "human", "value": "lonely"}]},
    ]))
    records = read_vllm_sharegpt(path)
    assert [(r.prompt_len, r.output_len) for r in records] == [(100, 20)]


def test_vllm_sharegpt_skips_an_empty_prompt_or_reply_and_counts_them(tmp_path, caplog):
    """As vLLM's benchmark skips a prompt or reply of fewer than 4 tokens; an empty one was read as a
    1-token request without a word."""
    import logging

    pair = [{"from": "human", "value": "x" * 400}, {"from": "gpt", "value": "y" * 80}]
    path = tmp_path / "sg.json"
    path.write_text(json.dumps([{"conversations": pair}, {"conversations": [{**pair[0], "value": ""}, pair[1]]},
                                {"conversations": [pair[0], {**pair[1], "value": ""}]},
                                {"conversations": pair[:1]}]))
    with caplog.at_level(logging.WARNING):
        records = read_vllm_sharegpt(path)
    assert [(r.prompt_len, r.output_len) for r in records] == [(100, 20)]
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: skipped 3 of 4 conversations without a reply or with a prompt or reply under 4 tokens "
        "(16 characters), as vLLM's benchmark does"]


def test_vllm_sharegpt_skips_a_prompt_or_reply_under_4_tokens_as_vllm_does(tmp_path, caplog):
    """vLLM's `sample_sharegpt_requests` prunes a prompt or reply of fewer than 4 tokens ("Prune too short
    sequences"); kvsim counts ≈ characters // 4 tokens, so 15 characters are 3 tokens (skipped) and 16 are 4
    (kept). Those under 16 characters but not empty were kept as 1- to 3-token requests (max(1, len // 4)).
    Six conversations: 16/16 characters → (4, 4) kept; 15/16 → 3-token prompt, skipped; 16/15 → 3-token
    reply, skipped; 400/80 → (100, 20) kept; 1/80 → skipped (it was a 1-token request); no reply → skipped:
    two requests, four skipped."""
    import logging

    def pair(prompt: int, reply: int) -> dict:
        return {"conversations": [{"from": "human", "value": "x" * prompt}, {"from": "gpt", "value": "y" * reply}]}

    path = tmp_path / "sg.json"
    path.write_text(json.dumps([pair(16, 16), pair(15, 16), pair(16, 15), pair(400, 80), pair(1, 80),
                                {"conversations": pair(16, 16)["conversations"][:1]}]))
    with caplog.at_level(logging.WARNING):
        records = read_vllm_sharegpt(path)
    assert [(r.prompt_len, r.output_len) for r in records] == [(4, 4), (100, 20)]
    assert [r.getMessage() for r in caplog.records] == [
        f"{path}: skipped 4 of 6 conversations without a reply or with a prompt or reply under 4 tokens "
        "(16 characters), as vLLM's benchmark does"]


@pytest.mark.parametrize(("reader", "text", "needle"), [
    (read_azure, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,12,3\nnot-a-time,1,1\n", ":3:"),
    (read_azure, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.1,-4,3\n", "ContextTokens=-4"),
    (read_mooncake, '{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1]}\n', ":1:"),
    (read_mooncake, '{"timestamp": 0, "input_length": 10, "output_length": 3, "hash_ids": [1]}\n{oops\n', ":2:"),
    (read_lengths, "num_prefill_tokens,num_decode_tokens\n5,x\n", "num_decode_tokens='x'"),
])
def test_malformed_rows_name_file_and_line(tmp_path, reader, text, needle):
    path = tmp_path / "trace.txt"
    path.write_text(text)
    with pytest.raises(KvsimError, match=needle) as info:
        reader(path)
    assert str(path) in str(info.value)


def test_beam_width_and_n_are_exclusive():
    with pytest.raises(KvsimError, match="not both"):
        scenario(n=2, beam_width=4)
    reqs = build_requests(scenario(beam_width=4, num_requests=5), 4096, np.random.default_rng(0))
    assert all(r.beam and r.num_samples == 4 for r in reqs)


def test_a_gzipped_trace_reads_as_the_plain_one_and_is_found_by_its_plain_name(tmp_path):
    import gzip

    from kvsim.workload.files import data_file

    plain = tmp_path / "t.csv"
    plain.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n"
                     "2023-11-16 18:15:50.9951690,396,109\n")
    packed = tmp_path / "packed" / "t.csv.gz"
    packed.parent.mkdir()
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert data_file(packed.parent / "t.csv") == packed  # only the .gz exists: that one
    assert data_file(plain) == plain
    assert read_azure(packed) == read_azure(plain)
    assert [r.arrival_s for r in read_azure(packed)] == pytest.approx([0.0, 4.314579])

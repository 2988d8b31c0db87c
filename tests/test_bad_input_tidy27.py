"""Small defects other helpers noticed on 7 December (tidy27): each with the behaviour a user (or vLLM) expects.

Found: `kv_transfer_config.kv_connector: Bogus` ran as "recorded only", where vLLM's engine refuses a connector its
`KVConnectorFactory` does not register. A trace of one request shorter than `num_requests` warned "holds 1 requests
... the run has those 1". `bench_kernels.py` read an earlier kernels.json with `json.loads`: one nested too deeply
was a RecursionError out of a check that answers yes or no. A prompt longer than max_model_len was rejected as
"prompt_len + output_len > max_model_len", its row showing output_tokens 1, a length no one asked for. `kvsim calibrate` without `-o` on a machine without a GPU
said "no CUDA device" before "--output is required". `kvsim run --gpu h100` answered "No such option: --gpu (Possible
options: --output)", where `gpu` is a scenario field a `--set` gives. `kvsim capacity`'s cost table left out the context lengths past
max_model_len without a word ("(1 of 3)" of six lengths).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import benchmark_script, one_line_exit_2  # tests/ is on sys.path

import kvsim
from kvsim.model.errors import KvsimError

REPO = Path(__file__).resolve().parents[1]
DISAGG = str(REPO / "scenarios" / "disagg-1p1d.yaml")
# The names vLLM's KVConnectorFactory registers, copied by hand from the `register_connector` calls at the end of
# vllm/distributed/kv_transfer/kv_connector/factory.py (vllm-project/vllm a4cd9d0), not from kvsim.
VLLM_CONNECTORS = ["SharedStorageConnector", "P2pNcclConnector", "LMCacheConnectorV1", "LMCacheMPConnector",
                   "NixlConnector", "MultiConnector", "OffloadingConnector", "DecodeBenchConnector"]


@pytest.mark.parametrize(("name", "hint"), [("Bogus", ""), ("nixlconnector", " (did you mean NixlConnector?)")])
def test_a_connector_vllm_does_not_register_is_refused_naming_the_known_ones(tmp_path, name, hint):
    line = one_line_exit_2(["run", DISAGG, "--set", "workload.num_requests=2",
                            "--kv-transfer-config", json.dumps({"kv_connector": name}), "-o", str(tmp_path / "out")])
    assert line == (f"kv_transfer_config.kv_connector={name!r}: vLLM registers no such connector{hint}; "
                    f"known: {', '.join(VLLM_CONNECTORS)}")
    assert not (tmp_path / "out").exists()


def test_every_connector_vllm_registers_is_taken_and_recorded():
    small = {"steps": "none", "workload": {"num_requests": 1, "prompt_len": {"dist": "fixed", "value": 16},
                                           "output_len": {"dist": "fixed", "value": 2}},
             "replicas": [{"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}]}
    for name in VLLM_CONNECTORS:
        result = kvsim.simulate({**small, "kv_transfer_config": {"kv_connector": name}})
        assert result.summary["disaggregation"]["kv_connector"] == name
    with pytest.raises(KvsimError, match="^kv_transfer_config.kv_connector='Bogus': vLLM registers no such"):
        kvsim.simulate({**small, "kv_transfer_config": {"kv_connector": "Bogus"}})


@pytest.mark.parametrize(("rows", "said"), [
    (1, "t.csv holds 1 request from start_s=0; the run has only that one"),
    (2, "t.csv holds 2 requests from start_s=0; the run has those 2"),
])
def test_a_short_trace_is_counted_in_words_that_agree(tmp_path, monkeypatch, caplog, rows, said):
    import logging

    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(
        f"2023-11-16 18:00:0{i}.000000,100,10\n" for i in range(rows)))
    (tmp_path / "s.yaml").write_text("steps: none\nworkload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: azure, path: t.csv}}\n")
    with caplog.at_level(logging.WARNING):
        result = kvsim.simulate(kvsim.load_scenario("s.yaml"))
    assert result.summary["num_requests"] == rows
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"workload.num_requests=5: {said}"]


def test_bench_kernels_tells_a_deeply_nested_earlier_result_from_its_own_without_a_traceback(tmp_path, monkeypatch):
    """Whether kernels.md holds the tables of kernels.json beside it is a yes or no: a kernels.json of 100,000
    nested lists (past Python's recursion limit) is not this bench's result, so no (it raised RecursionError)."""
    monkeypatch.syspath_prepend(str(REPO / "benchmarks"))
    bench = benchmark_script("bench_kernels")
    (tmp_path / "kernels.json").write_text("[" * 100_000 + "]" * 100_000)
    (tmp_path / "kernels.md").write_text("my notes\n")
    assert bench._tables_of(tmp_path / "kernels.md", tmp_path / "kernels.json") is False



@pytest.mark.parametrize("replicas", [1, 2])
def test_a_prompt_alone_past_max_model_len_is_rejected_by_the_prompt_and_keeps_the_output_asked(
        tmp_path, monkeypatch, replicas):
    """vLLM's OpenAI server refuses a prompt of `max_model_len` tokens or more whatever `max_tokens` asks
    (`OpenAIServing._validate_input`: token_num >= max_model_len, "you requested N tokens in the messages"); a row
    keeps the request's own lengths (docs/metrics.md `reject_reasons`). Prompts 2,048 and 3,000 (max_model_len
    2,048) are refused for the prompt, output 100 as asked; 2,047 has room for 1 token of its 100 and is served."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.000000,2048,100\n"
                                    "2023-11-16 18:00:01.000000,3000,100\n2023-11-16 18:00:02.000000,2047,100\n")
    (tmp_path / "s.yaml").write_text(f"steps: none\nengine: {{max_model_len: 2048}}\nreplicas: {replicas}\n"
                                     "workload: {num_requests: 3, arrival: {process: trace}, "
                                     "trace: {format: azure, path: t.csv}}\n")
    result = kvsim.simulate(kvsim.load_scenario("s.yaml"))
    assert result.summary["reject_reasons"] == {"prompt_len >= max_model_len 2048": 2}
    columns = ["prompt_tokens", "output_tokens", "status", "reject_reason"]
    assert result.requests[columns].fillna("").values.tolist() == [
        [2048, 100, "rejected", "prompt_len >= max_model_len 2048"],
        [3000, 100, "rejected", "prompt_len >= max_model_len 2048"],
        [2047, 1, "finished", ""]]


def test_calibrate_checks_its_arguments_before_the_machine(monkeypatch, tmp_path):
    """A missing `-o` is the user's to fix on any machine: it is said without asking for a GPU (before, a machine
    without one said "no CUDA device", and the user who fixed that was then told `--output is required`)."""
    import kernels.device

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(kernels.device, "has_cuda", lambda: pytest.fail("asked the machine before the arguments"))
    assert one_line_exit_2(["calibrate", "--gpu", "h200"]) == "--output is required: the profile CSV to write"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "key"), [
    (["run", "--gpu", "h100-80gb"], "gpu"),  # the scenario's own keys (docs/scenarios.md)
    (["run", "--gpu=h100-80gb"], "gpu"),
    (["run", "--max-model-len", "4096"], "engine.max_model_len"),  # vLLM's flag for the engine section's field
    (["report", "--num-requests", "5"], "workload.num_requests"),
])
def test_a_scenario_field_given_as_an_option_is_told_as_a_set(tmp_path, monkeypatch, argv, key):
    monkeypatch.chdir(tmp_path)
    flag = argv[1].split("=")[0]
    assert one_line_exit_2(argv) == (f"No such option: {flag}: {key} is a scenario field; give it as "
                                     f"--set {key}=VALUE (see 'kvsim {argv[0]} --help')")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv", [["run", "--bogus", "1"], ["capacity", "--seed", "3"]])
def test_an_option_that_names_no_field_or_a_command_without_set_keeps_clicks_line(argv):
    """`--bogus` names no field; `capacity` takes no `--set`, so `--seed` there is only an unknown option."""
    assert one_line_exit_2(argv) == f"No such option: {argv[1]} (see 'kvsim {argv[0]} --help')"


def test_capacity_names_the_lengths_it_cannot_serve_beside_its_cost_table():
    """max_model_len 4,096 and lengths 4,096, 8,192, 16,384: the last two exceed it (vLLM refuses them), so the
    concurrency table says so per row and the cost table, which shows only 4,096, says which it left out."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, ["capacity", "--max-model-len", "4096", "--context-lengths", "4096,8192,16384",
                                      "--gpu-hourly-cost", "2"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert result.output.count("exceeds max_model_len") == 2 * 3  # paged, slab and fp8 counts of the two rows
    assert result.output.rstrip().splitlines()[-1] == (
        "No cost at context_len 8,192, 16,384: past max_model_len=4,096, vLLM refuses such requests (none can be "
        "served).")

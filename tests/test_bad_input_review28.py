"""Review 28: regressions of today's merges (tidy27's reject rule, sweep26's frozen Settings)."""

from __future__ import annotations

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

import kvsim

COLUMNS = ["prompt_tokens", "output_tokens", "status", "reject_reason", "replica"]


def azure_run(folder, trace_rows: str, scenario_yaml: str) -> tuple[list[list], dict]:
    """The requests' `COLUMNS` (blank for None) and the summary of the scenario `scenario_yaml` run from `folder`
    (the working folder) on an Azure trace `t.csv` of `trace_rows` (TIMESTAMP,ContextTokens,GeneratedTokens lines)."""
    (folder / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + trace_rows)
    (folder / "s.yaml").write_text(scenario_yaml)
    result = kvsim.simulate(kvsim.load_scenario("s.yaml"))
    return result.requests[COLUMNS].fillna("").values.tolist(), result.summary


@pytest.mark.parametrize("decode_engine", ["", ", engine: {max_model_len: 4096}"])
def test_a_disaggregated_prefill_refusal_keeps_the_output_the_client_asked(tmp_path, monkeypatch, decode_engine):
    """The proxy asks a prefill instance for max_tokens=1, but the client asked 100: a prompt the prefill instance
    refuses (2,048 and 3,000 tokens against its max_model_len 2,048: vLLM's `_validate_input`, token_num >=
    max_model_len, whatever max_tokens says) is the client's refusal, and its row keeps the 100 asked, as one
    engine's row does (docs/metrics.md). 2,047 tokens is served by decode: 1 token where decode's limit is 2,048
    (2,048 − 2,047), all 100 where it is 4,096."""
    monkeypatch.chdir(tmp_path)
    rows, _ = azure_run(tmp_path, "2023-11-16 18:00:00.000000,2048,100\n2023-11-16 18:00:01.000000,3000,100\n"
                                  "2023-11-16 18:00:02.000000,2047,100\n",
                        "steps: none\nengine: {max_model_len: 2048}\n"
                        "kv_transfer_config: {kv_connector: NixlConnector, kv_link: rdma}\n"
                        f"replicas: [{{count: 1, kv_role: kv_producer}}, {{count: 1, kv_role: kv_consumer"
                        f"{decode_engine}}}]\n"
                        "workload: {num_requests: 3, arrival: {process: trace}, trace: {format: azure, path: t.csv}}\n")
    served = 100 if decode_engine else 1
    assert rows == [
        [2048, 100, "rejected", "prompt_len >= max_model_len 2048", 0],
        [3000, 100, "rejected", "prompt_len >= max_model_len 2048", 0],
        [2047, served, "finished", "", 1]]


def test_a_short_option_is_never_told_as_a_scenario_field():
    """`-n` is a letter, not the name of `workload.n` (parallel samples; a user of `head -n` means a count): click's
    own line, as for any option that names no field; `--n`, the field's name, is still told as a --set."""
    assert one_line_exit_2(["run", "-n", "2"]) == "No such option: -n (see 'kvsim run --help')"
    assert one_line_exit_2(["run", "--n", "2"]) == ("No such option: --n: workload.n is a scenario field; give it as "
                                                    "--set workload.n=VALUE (see 'kvsim run --help')")


def test_the_reports_mean_length_counts_only_the_requests_it_serves(tmp_path):
    """Max_model_len 2,048: a prompt of 2,048 is refused (its 100 tokens asked kept in its row since 2f1f57d), the
    others served: KV of 1,000 + 100 − 1 = 1,099 and 500 + 50 − 1 = 549 tokens, a mean of 824 for the closed forms
    "at the mean length" over the requests served (the refused one's 2,147 made it 1,265). One in 3 refused."""
    from kvsim.report.studies import Study, StudyConfig
    from kvsim.workload.scenario import make_scenario

    (tmp_path / "t.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00.000000,2048,100\n"
                                    "2023-11-16 18:00:01.000000,1000,100\n2023-11-16 18:00:02.000000,500,50\n")
    base = make_scenario({"engine": {"max_model_len": 2048}, "workload": {
        "num_requests": 3, "arrival": {"process": "trace"}, "trace": {"format": "azure", "path": "t.csv"}}}, tmp_path)
    st = Study(base, StudyConfig(num_requests=3, workers=1))
    assert (st.mean_kv_len, st.unservable_fraction) == (824.0, 1 / 3)


def test_a_prompt_a_smaller_replica_refuses_keeps_the_output_asked_and_no_length_cap(tmp_path, monkeypatch):
    """A fleet caps outputs at its largest limit (4,096) before routing: 4,000 + 500 asked was cut to 96 tokens
    (404 "dropped"); round-robin sends it to the 2,048 replica, which refuses the prompt alone. Its row keeps the
    500 asked (docs/metrics.md: a refused row keeps the request's own lengths), and a refused request is no
    length cap (vLLM's finish_reason "length" ends a served one), so no request counts in `length_capped`."""
    monkeypatch.chdir(tmp_path)
    rows, summary = azure_run(tmp_path, "2023-11-16 18:00:00.000000,4000,500\n2023-11-16 18:00:01.000000,100,10\n",
                              "steps: none\nengine: {max_model_len: 2048}\nrouter: {policy: round_robin}\n"
                              "replicas: [{count: 1}, {count: 1, engine: {max_model_len: 4096}}]\n"
                              "workload: {num_requests: 2, arrival: {process: trace}, trace: {format: azure, "
                              "path: t.csv}}\n")
    assert rows == [[4000, 500, "rejected", "prompt_len >= max_model_len 2048", 0], [100, 10, "finished", "", 1]]
    assert summary.get("length_capped", {"num_requests": 0})["num_requests"] == 0

"""Bad input found by the seventh sweep: each exits 2 with one line naming the field and the value, and
writes nothing, never a setting dropped without a word, an error naming another field or a value the user
never wrote."""

import json

import pytest
from conftest import one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
RUN = ["run", "--set", "workload.num_requests=4", "--set", "steps=none"]
DISAGG = ["--kv-transfer-config", "{}", "--set",
          "replicas=[{count: 1, kv_role: kv_producer}, {count: 1, kv_role: kv_consumer}]"]


def _runs(tmp_path, *flags: str) -> None:
    result = runner.invoke(app, [*RUN, *flags, "-o", str(tmp_path / "ok"), "--format", "json"])
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(("latency", "message"), [
    ("{model: roofline, profile: nope.csv}", "profile='nope.csv': model=roofline does not read it (only calibrated)"),
    ("{model: roofline, step_s: 5}", "step_s=5.0: model=roofline does not read it (only constant)"),
    ("{model: constant, overhead_s: 3}", "overhead_s=3.0: model=constant does not read it (only roofline, calibrated)"),
    ("{model: constant, overlap_swap: true}",
     "overlap_swap=True: model=constant does not read it (only roofline, calibrated)"),
])
def test_a_latency_field_its_model_does_not_read_is_refused(tmp_path, latency, message):
    """`latency: {profile: nope.csv}` beside the default roofline ran the roofline, the file never opened (and
    never found missing); `step_s` is the constant model's, `overhead_s` and `overlap_swap` the roofline's: each
    given to another model was dropped without a word. The defaults, which a written scenario carries, run."""
    assert one_line_exit_2([*RUN, "--set", f"latency={latency}", "-o", str(tmp_path / "out")]) == (
        f"latency: {message}")
    assert not (tmp_path / "out").exists()
    _runs(tmp_path, "--set", "latency={model: constant, step_s: 0.01, overhead_s: null, overlap_swap: false}")


def test_a_coefficient_of_variation_beside_poisson_arrivals_is_refused(tmp_path):
    """`cv` shapes gamma gaps only: `{process: poisson, rate: 4, cv: 3}` drew Poisson arrivals (cv 1)."""
    assert one_line_exit_2([*RUN, "--set", "workload.arrival={process: poisson, rate: 4, cv: 3}", "-o",
                            str(tmp_path / "out")]) == (
        "workload.arrival: cv=3: process=poisson does not read it (only gamma, whose gaps it shapes)")
    assert not (tmp_path / "out").exists()
    _runs(tmp_path, "--set", "workload.arrival={process: gamma, rate: 4, cv: 3}")


@pytest.mark.parametrize(("flags", "message"), [
    (["--set", "replicas=2", "--set", "router={policy: round_robin, load_bound: 3}"],
     "router: load_bound=3: policy=round_robin does not read it (only affinity)"),
    (["--set", "replicas=2", "--set", "router={policy: least_kv, load_slack: 2}"],
     "router: load_slack=2: policy=least_kv does not read it (only affinity)"),
    ([*DISAGG[:1], '{"decode_router": {"policy": "least_outstanding", "match_threshold": 0.5}}', *DISAGG[2:]],
     "kv_transfer_config.decode_router: match_threshold=0.5: policy=least_outstanding does not read it "
     "(only affinity)"),
], ids=["round-robin", "least-kv", "disagg-pool"])
def test_an_affinity_knob_beside_another_policy_is_refused(tmp_path, flags, message):
    """`load_bound`, `load_slack` and `match_threshold` steer the affinity router only: beside round robin
    (or least outstanding, least KV) each was dropped without a word."""
    assert one_line_exit_2([*RUN, *flags, "-o", str(tmp_path / "out")]) == message
    assert not (tmp_path / "out").exists()
    _runs(tmp_path, "--set", "replicas=2", "--set", "router={policy: affinity, load_bound: 3, load_slack: 2}")


def test_a_disaggregated_fleet_refuses_a_fleet_router(tmp_path):
    """A disaggregated fleet routes each pool with `kv_transfer_config.prefill_router` and `decode_router`:
    `router: {policy: affinity}` beside it was never read (both pools still routed by least outstanding)."""
    assert one_line_exit_2([*RUN, *DISAGG, "--set", "router={policy: affinity}", "-o", str(tmp_path / "out")]) == (
        "router.policy='affinity': a disaggregated fleet routes each pool with kv_transfer_config.prefill_router "
        "and decode_router; set those and drop the router (router=null)")
    assert not (tmp_path / "out").exists()
    _runs(tmp_path, *DISAGG[:1], '{"prefill_router": {"policy": "affinity"}}', *DISAGG[2:])


def test_plan_still_ranks_a_split_behind_its_router(tmp_path):
    """A plan's xPyD candidate gives its router to both pools; the fleet's own router is left as it was."""
    from kvsim.planning.spec import Candidate
    from kvsim.workload.scenario import load_scenario

    base = load_scenario(None, ["workload.num_requests=4"])
    split = Candidate("h100-80gb", 1, split=(1, 1)).scenario(base, 2, "least_kv")
    assert split.router == base.router
    assert split.kv_transfer_config is not None
    assert split.kv_transfer_config.prefill_router.policy == split.kv_transfer_config.decode_router.policy == "least_kv"


def test_a_draft_model_kvsim_cannot_load_is_named_by_its_field(tmp_path):
    """`method: draft_model, model: nope` said `model='nope': not a preset ...`, the scenario's own field,
    once the run priced its first draft; `kvsim capacity` took it without a word. An EAGLE head's `model` is
    still not read (its cost follows the target's shape)."""
    spec = {"method": "draft_model", "num_speculative_tokens": 3, "acceptance_rates": 0.8, "model": "nope"}
    run = one_line_exit_2([*RUN, "--speculative-config", json.dumps(spec), "-o", str(tmp_path / "out")])
    assert run.startswith("engine.speculative_config: model='nope': not a preset (deepseek-v2-lite, ")
    assert run.endswith(") nor a file")
    capacity = one_line_exit_2(["capacity", "--speculative-config", json.dumps(spec)])
    assert capacity == run  # the field named as run names it (tidy29)
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    draft = one_line_exit_2([*RUN, "--speculative-config", json.dumps({**spec, "model": str(tmp_path / "config.json")}),
                             "-o", str(tmp_path / "out")])
    assert draft == (f"engine.speculative_config: model='{tmp_path / 'config.json'}': model config {tmp_path.name}: "
                     "field 'hidden_size' is missing (needed for llama)")
    assert not (tmp_path / "out").exists()
    _runs(tmp_path, "--speculative-config", json.dumps({**spec, "model": "llama-3.1-8b"}))  # the target's vocabulary
    _runs(tmp_path, "--speculative-config", json.dumps({**spec, "method": "eagle"}))


@pytest.mark.parametrize(("command", "message"), [
    (["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2", "--set", "workload.num_requests=20",
      "--set", "replicas=[{count: 2}]"],
     "replicas=[{'count': 2}]: plan searches the replica count; remove it from the scenario"),
    (["run", "--set", "replicas=[{count: 1, engine: {max_num_seqs: 2}}]", "--set", "autoscaler={max_replicas: 4}"],
     "autoscaler: needs replicas as a count (the start), not replicas=[{'count': 1, 'engine': {'max_num_seqs': 2}}]"),
], ids=["plan", "autoscaler"])
def test_replica_groups_are_shown_as_written(tmp_path, command, message):
    """Both said `replicas=[ReplicaGroup(count=2, name=None, model=None, gpu=None, engine={}, kv_role=None)]`:
    kvsim's object, every unset field with it, not what the scenario gave."""
    assert one_line_exit_2([*command, "-o", str(tmp_path / "out")]) == message
    assert not (tmp_path / "out").exists()



@pytest.mark.parametrize(("sets", "drop"), [
    ([], "autoscaler, replicas, router from the scenario (--set autoscaler=null --set replicas=null --set router=null)"),
    (["--set", "router=null"], "autoscaler, replicas from the scenario (--set autoscaler=null --set replicas=null)"),
], ids=["with-router", "without-router"])
def test_plan_names_every_field_an_autoscaled_scenario_must_drop(tmp_path, sets, drop):
    """`kvsim plan scenarios/azure-autoscale.yaml` said `replicas=1: ... remove it from the scenario`; removing it
    was refused next, `autoscaler: needs replicas as a count`, and then the router without replicas: three tries
    for what docs/autoscaling.md does at once (--set autoscaler=null --set replicas=null --set router=null).
    The refusal names them all, the router only where the scenario sets one."""
    assert one_line_exit_2(["plan", "scenarios/azure-autoscale.yaml", "--gpu", "l4", "--workers", "1", "--slo",
                            "ttft_s.p90=2", *sets, "-o", str(tmp_path / "out")]) == (
        f"autoscaler: plan sizes a static fleet, searching its replica count; remove {drop}")
    assert not (tmp_path / "out").exists()

def test_report_counts_one_group_as_one(tmp_path):
    assert one_line_exit_2(["report", "--set", "replicas=[{count: 2}]", "--quick", "-o", str(tmp_path / "r")]) == (
        "replicas=[1 group]: kvsim report studies one engine; report on one replica with --set replicas=null "
        "(dropping any router, autoscaler or kv_transfer_config), or size a fleet with kvsim plan")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize(("offload", "message"), [
    ("{}", "give the CPU tier's size, cpu_bytes (vLLM's --kv-offloading-size) or num_cpu_blocks (0: no tier)"),
    ("{bandwidth_bytes_per_s: 1e10}",
     "give the CPU tier's size, cpu_bytes (vLLM's --kv-offloading-size) or num_cpu_blocks (0: no tier)"),
    ("{cpu_bytes: 1GiB, disk_bandwidth_bytes_per_s: 1e9}",
     "disk_bandwidth_bytes_per_s=1e+09: no disk tier reads it (give disk_bytes or num_disk_blocks)"),
], ids=["empty", "bandwidth-alone", "disk-bandwidth-without-disk"])
def test_an_offload_tier_without_a_size_is_refused(tmp_path, offload, message):
    """`engine.kv_offload: {}` ran with no tier at all, as if it were not there (the size has no default: 0,
    said so, is no tier), and a drive's bandwidth without a disk tier was dropped without a word."""
    assert one_line_exit_2([*RUN, "--set", f"engine.kv_offload={offload}", "-o", str(tmp_path / "out")]) == (
        f"engine.kv_offload: {message}")
    assert not (tmp_path / "out").exists()
    _runs(tmp_path, "--set", "engine.kv_offload={cpu_bytes: 0}")


def _measured(tmp_path) -> str:
    """A measured-run folder (validation layout) of two requests."""
    meta = {"model": "meta-llama/Llama-3.1-8B", "dataset_path": "w.jsonl",
            "engine_kwargs": {"model": "meta-llama/Llama-3.1-8B", "max_num_seqs": 4}}
    (tmp_path / "m" / "vllm").mkdir(parents=True)
    (tmp_path / "m" / "vllm" / "meta.json").write_text(json.dumps(meta))
    rows = [{"request_id": f"bench-{i}", "input_toks": 16, "output_toks": 5, "queued_ts": t,
             "first_token_ts": t + 0.01, "last_token_ts": t + 0.05} for i, t in enumerate((100.0, 100.5))]
    (tmp_path / "m" / "vllm" / "requests.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "m" / "w.jsonl").write_text("".join(json.dumps({"input_toks": 16, "output_toks": 5,
                                                                "arrival_time_ns": i}) + "\n" for i in range(2)))
    return str(tmp_path / "m")


@pytest.mark.parametrize("item", ["latency.profile=p.csv", "latency.model=calibrated",
                                  "latency={model: calibrated, profile: p.csv}"])
def test_validate_takes_a_calibrated_latency_from_its_flags_not_a_set(tmp_path, monkeypatch, item):
    """`--set latency.profile=p.csv` looked the file up beside the replay's temporary workload
    (`file not found: /tmp/kvsim-validate-.../p.csv`), never where it was given; `--latency` and `--profile`
    resolve it. A constant latency (no flag gives it) is still a --set (the next test)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.csv").write_text("")
    run = _measured(tmp_path)
    argv = ["validate", run, "--gpu", "h100-80gb", "-o", str(tmp_path / "out")]
    assert one_line_exit_2([*argv, "--set", item]) == (
        f"--set {item!r}: a replay's calibrated latency is --latency calibrated --profile PATH, not a --set")
    assert not (tmp_path / "out").exists()


def test_validate_takes_a_constant_latency_as_a_set(tmp_path, monkeypatch):
    """Beside the refusals above (once for all of them: a replay, without its figures): a constant
    latency, which no flag gives, is a --set."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.csv").write_text("")
    run = _measured(tmp_path)
    argv = ["validate", run, "--gpu", "h100-80gb", "-o", str(tmp_path / "out"), "--no-figures"]
    result = runner.invoke(app, [*argv, "--set", "latency.model=constant", "--set", "latency.step_s=0.01",
                                 "--format", "json"])
    assert result.exit_code == 0, result.output


def test_a_yaml_date_is_read_as_the_text_it_was(tmp_path):
    """YAML 1.1 reads `2024-01-01` as a date: `name: 2024-01-01` was refused as `name=datetime.date(2024, 1,
    1)`, a value no file holds, and `seed: 2024-01-01` named it so too. No kvsim field is a date: it stays text."""
    workload = "workload: {num_requests: 2, prompt_len: {dist: fixed, value: 8}, output_len: {dist: fixed, value: 2}}"
    (tmp_path / "s.yaml").write_text(f"{workload}\nsteps: none\nseed: 2024-01-01\n")
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]) == (
        "seed='2024-01-01': Input should be a valid integer, unable to parse string as an integer")
    assert not (tmp_path / "out").exists()
    (tmp_path / "s.yaml").write_text(f"{workload}\nsteps: none\nname: 2024-01-01\n")
    result = runner.invoke(app, ["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out"), "--format", "json"])
    assert result.exit_code == 0, result.output
    assert "name: '2024-01-01'" in (tmp_path / "out" / "scenario.yaml").read_text()


@pytest.mark.parametrize(("spec", "flags", "message"), [
    ("capacity_headroom: 0.5\n", [], "capacity_headroom=0.5: search=replicas does not read it (only search=rate)"),
    ("search: rate\nrel_tol: 0.2\n", ["--search", "replicas"],
     "rel_tol=0.2: search=replicas does not read it (only search=rate)"),
], ids=["headroom", "tolerance-search-overridden"])
def test_a_rate_search_knob_beside_a_replica_search_is_refused(tmp_path, spec, flags, message):
    """`capacity_headroom` and `rel_tol` size a rate search only: a spec giving one to the replica search (the
    default, or `--search replicas` over the spec's `search: rate`) planned without it, without a word."""
    (tmp_path / "spec.yaml").write_text(spec)
    argv = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2", "--set",
            "workload.num_requests=20", "--spec", str(tmp_path / "spec.yaml"), *flags, "-o", str(tmp_path / "out")]
    assert one_line_exit_2(argv) == f"plan: {message}"
    assert [p.name for p in tmp_path.iterdir()] == ["spec.yaml"]

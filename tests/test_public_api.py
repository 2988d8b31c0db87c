"""The library API a notebook uses: `kvsim.simulate` on a path, a dict or a Scenario with overrides;
`load_scenario` with dict or CLI-style overrides; a RunResult that prints in one line and writes Parquet."""

from pathlib import Path

import pandas as pd
import pytest
import yaml

import kvsim
from kvsim import RunResult, Scenario
from kvsim.model.errors import KvsimError

SMALL = {"workload.num_requests": 30}


def test_the_api_is_exported_and_typed():
    assert set(kvsim.__all__) == {"RunResult", "Scenario", "__version__", "load_scenario", "simulate"}
    assert kvsim.simulate.__annotations__["return"]  # annotated (checked by mypy with the package)
    assert dir(kvsim) == sorted(kvsim.__all__)  # tab completion offers the API, lazy names included
    assert all(getattr(kvsim, name) is not None for name in kvsim.__all__)


def test_load_scenario_takes_dict_or_cli_overrides_alike():
    a = kvsim.load_scenario(None, {"engine.block_size": 32, "seed": 7, "workload.num_requests": 30,
                                   "workload.prompt_len": {"dist": "fixed", "value": 100}})
    b = kvsim.load_scenario(None, ["engine.block_size=32", "seed=7", "workload.num_requests=30",
                                   "workload.prompt_len={dist: fixed, value: 100}"])
    assert isinstance(a, Scenario) and a == b
    assert (a.engine.block_size, a.seed, a.workload.num_requests) == (32, 7, 30)
    assert a.engine.max_model_len == 8192  # fields not named keep the file's values


def test_a_number_in_an_override_names_a_list_entry():
    """`replicas.1.count=2` sets the second pool's count (disagg-1p1d: prefill, decode), as a hand edit of
    the YAML would; an index past the list's end or a word is refused naming the list and its length."""
    disagg = "scenarios/disagg-1p1d.yaml"
    edited = kvsim.load_scenario(disagg, ["replicas.1.count=2", "replicas.0.engine={max_num_seqs: 64}"])
    by_hand = yaml.safe_load(Path(disagg).read_text())
    by_hand["replicas"][1]["count"] = 2
    by_hand["replicas"][0]["engine"] = {"max_num_seqs": 64}
    expected = kvsim.load_scenario(None, by_hand)  # None: the default scenario, every field replaced
    assert edited.model_dump(exclude={"base_dir"}) == expected.model_dump(exclude={"base_dir"})
    for bad in ("replicas.2.count=2", "replicas.first.count=2"):
        with pytest.raises(KvsimError, match=r"replicas is a list of 2: index an entry by its number, 0 to 1"):
            kvsim.load_scenario(disagg, [bad])


def test_simulate_a_path_a_dict_and_a_scenario_with_overrides(tmp_path):
    base = kvsim.load_scenario(None, SMALL)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(base.model_dump(mode="json"), sort_keys=False))
    from_path = kvsim.simulate(path)
    from_dict = kvsim.simulate(base.model_dump(mode="json"))
    from_scenario = kvsim.simulate(base)
    assert from_path.summary["ttft_s"] == from_dict.summary["ttft_s"] == from_scenario.summary["ttft_s"]
    reseeded = kvsim.simulate(base, seed=1, engine__block_size=32)
    assert (reseeded.scenario.seed, reseeded.scenario.engine.block_size) == (1, 32)
    assert reseeded.summary["ttft_s"] != from_scenario.summary["ttft_s"]
    with pytest.raises(KvsimError, match="expected a Scenario"):
        kvsim.simulate(42)  # type: ignore[arg-type]


def test_a_path_object_is_as_good_as_its_text_in_any_field(tmp_path):
    """A notebook passes `pathlib.Path`s: `model=Path(...)` (it was "Input should be a valid string") and a
    trace path inside a dict scenario read the same files as their strings do."""
    model = Path(kvsim.__file__).parent / "model" / "presets" / "models" / "llama-2-7b.json"
    trace = tmp_path / "trace.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,100,10\n"
                     "2023-11-16 18:15:46.5,300,20\n2023-11-16 18:15:47.25,50,5\n")
    raw = kvsim.load_scenario(None, SMALL).model_dump(mode="json")
    raw["workload"] = {"arrival": {"process": "trace"}, "trace": {"format": "azure", "path": trace}}
    with_paths = kvsim.simulate(raw, model=model, engine__max_model_len=4096)
    raw["workload"]["trace"]["path"] = str(trace)
    with_texts = kvsim.simulate(raw, model=str(model), engine__max_model_len=4096)
    assert with_paths.summary == with_texts.summary and with_paths.summary["num_requests"] == 3
    assert with_paths.scenario.model == str(model)


def test_run_result_repr_is_one_short_line_and_parquet_round_trips(tmp_path):
    result = kvsim.simulate(None, **{"workload__num_requests": 30})
    assert isinstance(result, RunResult)
    text = repr(result)
    assert "\n" not in text and len(text) < 200 and "requests=30" in text
    out = result.to_parquet(tmp_path / "run")
    requests = pd.read_parquet(out / "requests.parquet")
    pd.testing.assert_frame_equal(requests, result.requests)
    assert len(pd.read_parquet(out / "steps.parquet")) == len(result.steps)


def test_simulate_runs_a_fleet_scenario_through_the_fleet_path():
    from kvsim.fleet.driver import simulate_fleet

    fleet = kvsim.load_scenario(None, {**SMALL, "replicas": 2, "router.policy": "round_robin"})
    result = kvsim.simulate(fleet)
    assert isinstance(result, RunResult) and all(isinstance(r, RunResult) for r in result.replicas)
    assert len(result.replicas) == 2 and result.summary["num_finished"] == 30
    # round robin deals 30 requests 15 and 15
    assert result.summary["requests_per_replica"] == {"min": 15, "max": 15, "mean": 15.0}
    assert result.summary == simulate_fleet(fleet).summary  # the same path, the same seed


def test_writing_a_result_to_something_that_is_not_a_path_is_named():
    result = kvsim.simulate(None, workload__num_requests=3, steps="none")
    with pytest.raises(KvsimError, match=r"^out_dir=5: is not a path: name a folder"):
        result.write(5)  # type: ignore[arg-type]  # Path(5) was a bare TypeError

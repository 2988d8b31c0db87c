"""Bad input found by the twenty-first sweep. Each is refused (the CLI: exit 2, one line naming the field and the
value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: `--set router=least_kv` (one value for a section) was refused in pydantic's words, "Input should be a valid
dictionary or instance of Router", a class name, not the form to write (`router.policy=least_kv`), and
`workload.prompt_len=512` as "a valid dictionary or object to extract fields from" (it takes `{dist: ...}`). An xPyD plan
row's evidence line called the split's two instances "2 replicas" (`tests/test_plan_verify.py`). A section's
`model_copy(update=...)` (`scenario.engine.model_copy(update={"max_num_seqs": -1})`) raised pydantic's multi-line
ValidationError. `run_many` and the fleet APIs (`simulate_fleet`, `simulate_disagg`) given dicts of fields stopped
with an AttributeError deep in the run, `workers=2.5` with a TypeError, and `workers=0` ran without a word. `kvsim
capacity --sustained` at context lengths no probe can run at (1 token, past max_model_len) left the sustained
columns out of the CSV and the table without a word. A Vidur mlp.csv's negative time was skipped as a timer that did
not fire (0.0); one without `num_tokens` was a KeyError traceback; a row with a blank `num_tensor_parallel_workers`
was left out without a word and `1.0` was "not tensor_parallel_size=1"; rows of two models' shapes were imported as
the first row's model. A run at 1e-9 req/s printed `0 output tok/s`. `kvsim.Scenario(model=Path(...))` (and its
copy, `model_validate`) refused the Path that `kvsim.simulate` reads. A profile row without the size its kind is
looked up by (a gemm's num_tokens) stopped a calibrated run with a ValueError traceback.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

import kvsim
from kvsim.model.errors import KvsimError

ROOT = Path(__file__).resolve().parent.parent


def test_one_value_for_a_section_says_the_field_it_names(tmp_path):
    """`least_kv` is one of the router's policies (`Router.policy`'s choices), so the form is `router.policy=...`;
    a value no field takes is told the section's fields."""
    argv = ["run", str(ROOT / "scenarios" / "azure-autoscale.yaml"), "-o", str(tmp_path / "out")]
    assert one_line_exit_2([*argv[:2], "--set", "router=least_kv", *argv[2:]]) == (
        "router='least_kv': a section, not one value: set its field, router.policy=least_kv")
    assert one_line_exit_2([*argv[:2], "--set", "router=3", *argv[2:]]) == (
        "router=3: a section, not one value: set its fields (policy, load_bound, load_slack, match_threshold), "
        "e.g. router.policy=...")
    assert one_line_exit_2([*argv[:2], "--set", "workload.prompt_len=512", *argv[2:]]) == (
        "workload.prompt_len=512: a section, not one value: give workload.prompt_len={dist: fixed, ...} (dist: fixed, "
        "uniform, lognormal, empirical)")  # it was pydantic's "a valid dictionary or object to extract fields from"
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(KvsimError, match=r"^workload\.arrival='poisson': a section, not one value: set its field, "
                                         r"workload\.arrival\.process=poisson$"):
        kvsim.simulate(None, workload__arrival="poisson")


def test_a_sections_copy_refuses_a_bad_field_as_one_line():
    """`model_copy(update=...)` validates (sweep 13) a `Scenario`'s copy; a section's copy
    (`scenario.engine.model_copy(...)`) raised pydantic's multi-line ValidationError, no `KvsimError`. vLLM's
    `max_num_seqs` is a count of sequences, at least 1."""
    base = kvsim.load_scenario(None)
    with pytest.raises(KvsimError, match=r"^max_num_seqs=-1: Input should be greater than 0$"):
        base.engine.model_copy(update={"max_num_seqs": -1})
    with pytest.raises(KvsimError, match=r"^num_requests=0: Input should be greater than 0$"):
        base.workload.model_copy(update={"num_requests": 0})
    assert base.engine.model_copy(update={"max_num_seqs": 7}).max_num_seqs == 7


@pytest.mark.parametrize(("scenarios", "workers", "options", "message"), [
    ([{"seed": 1}], 1, {}, "scenarios[0]={'seed': 1}: expected a Scenario (kvsim.load_scenario(path, overrides) or "
                           "kvsim.Scenario(**fields) makes one)"),
    (5, 1, {}, "scenarios=5: expected a list of Scenarios"),
    ("a.yaml", 1, {}, "scenarios='a.yaml': expected a list of Scenarios"),
    ([], 2.5, {}, "workers=2.5: expected a count of processes, 1 or more (None: one per CPU)"),
    ([], 0, {}, "workers=0: expected a count of processes, 1 or more (None: one per CPU)"),
    ([], "2", {}, "workers='2': expected a count of processes, 1 or more (None: one per CPU)"),
    ([], 1, {"on_done": 5}, "on_done=5: expected a function of no arguments, or None"),
    ([], 1, {"keep_steps": "no"}, "keep_steps='no': expected True or False"),
    ([], 1, {"evidence": 1}, "evidence=1: expected True or False"),
])
def test_run_many_refuses_what_is_no_list_of_scenarios_before_any_run(scenarios, workers, options, message):
    """A notebook's sweep (`kvsim.planning.sweep.run_many`) given a dict of fields stopped with an AttributeError
    ('dict' object has no attribute 'kv_transfer_config') deep in the run, 5 with a TypeError, `workers=2.5`
    with a TypeError from the process pool, `on_done=5` with a TypeError after the first run (its work lost),
    `keep_steps="no"` kept every step, and `workers=0` ran in this process without a word."""
    from kvsim.planning.sweep import run_many

    with pytest.raises(KvsimError) as caught:
        run_many(scenarios, workers=workers, **options)
    assert str(caught.value) == message


def test_run_many_takes_any_iterable_of_scenarios_and_a_numpy_worker_count():
    import numpy as np

    from kvsim.planning.sweep import run_many

    scenario = kvsim.load_scenario(None, {"workload.num_requests": 3})
    assert len(run_many(iter([scenario]), workers=np.int64(1))) == 1


@pytest.mark.parametrize(("lengths", "said"), [("1", "context length 1"), ("1,200000", "context lengths 1, 200000")])
def test_capacity_sustained_says_the_context_lengths_it_cannot_probe(lengths, said):
    """A context of 1 token has no prompt and output to split (c/2 = 0), and 200,000 tokens exceed Llama-3.1-8B's
    max_model_len (its max_position_embeddings, 131,072): `--sustained` simulated neither, and with no other length
    the CSV (and the table) left its columns out without a word, as if it had never been asked for."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, ["capacity", "--context-lengths", lengths, "--sustained", "--format", "csv"])
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"kvsim: warning: --sustained: no probe at {said}: a probe needs 2 tokens or more (a prompt and an output), "
        "at most max_model_len=131072, and a KV cache that holds one"]
    assert [line.split(",")[0] for line in result.stdout.splitlines()[1:]] == lengths.split(",")


VIDUR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "mlp_act", "input_layernorm",
             "post_attention_layernorm", "attn_rope", "add", "emb")
VIDUR_SHAPES = "32,32,4096,11008,32768,True"  # Llama-2-7B's heads, KV heads, hidden and MLP sizes, vocab, gated


def _vidur(tmp_path: Path, rows: list[str], header: str | None = None) -> Path:
    """A Vidur mlp.csv of Llama-2-7B on Vidur's `a100` (an A100 80GB) with `rows` after the shapes: num_tokens,
    num_tensor_parallel_workers and one time (ms) per op of `VIDUR_OPS`."""
    folder = tmp_path / "data" / "profiling" / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf"
    folder.mkdir(parents=True)
    header = header or ("n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,"
                        "num_tensor_parallel_workers," + ",".join(f"time_stats.{op}.median" for op in VIDUR_OPS))
    (folder / "mlp.csv").write_text("\n".join([header, *rows]) + "\n")
    return folder / "mlp.csv"


def _import(path: Path, tmp_path: Path, *flags: str) -> str:
    line = one_line_exit_2(["import-profile", str(path), "-o", str(tmp_path / "out.csv"), "--model", "llama-2-7b",
                            "--gpu", "a100-80gb", *flags])
    assert not (tmp_path / "out.csv").exists()
    return line.replace(str(path), "F")


TIMES = ",".join(["0.1"] * len(VIDUR_OPS))


def test_a_vidur_time_below_zero_is_refused_not_dropped_as_a_timer_that_did_not_fire(tmp_path):
    """Vidur writes 0.0 for an op whose CUDA timer did not fire (kvsim skips it, its op falls back to the
    roofline); no timer measures a negative time, and one was skipped as that 0.0 was, without a word."""
    path = _vidur(tmp_path, [f"{VIDUR_SHAPES},1,1,-0.5," + ",".join(["0.1"] * 9),
                             f"{VIDUR_SHAPES},512,1,{TIMES}"])
    assert _import(path, tmp_path) == ("profile F: time_stats.attn_pre_proj.median='-0.5' is negative (a time is 0, "
                                       "a timer that did not fire, or positive)")


def test_a_vidur_csv_without_num_tokens_is_refused_not_a_key_error(tmp_path):
    header = ("n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tensor_parallel_workers,"
              + ",".join(f"time_stats.{op}.median" for op in VIDUR_OPS))
    path = _vidur(tmp_path, [f"{VIDUR_SHAPES},1,{TIMES}"], header)
    assert _import(path, tmp_path) == ("profile F: column 'num_tokens' is missing (Vidur's mlp.csv gives it on "
                                       "each row)")


def test_a_vidur_row_without_its_tp_degree_is_refused_not_left_out(tmp_path):
    """The second row's blank num_tensor_parallel_workers left it out of a TP-1 import without a word."""
    path = _vidur(tmp_path, [f"{VIDUR_SHAPES},1,1,{TIMES}", f"{VIDUR_SHAPES},512,,{TIMES}"])
    assert _import(path, tmp_path) == "profile F: line 3: num_tensor_parallel_workers='' is not a whole number >= 1"


def test_a_vidur_tp_degree_written_as_a_float_is_that_degree(tmp_path):
    """pandas writes an integer column holding a blank as floats (`1.0`): it was 'measured at
    num_tensor_parallel_workers 1.0, not tensor_parallel_size=1'."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    path = _vidur(tmp_path, [f"{VIDUR_SHAPES},1,1.0,{TIMES}", f"{VIDUR_SHAPES},512,1.0,{TIMES}"])
    result = CliRunner().invoke(app, ["import-profile", str(path), "-o", str(tmp_path / "out.csv"), "--model",
                                      "llama-2-7b", "--gpu", "a100-80gb"])
    assert result.exit_code == 0, result.output
    assert "(20 rows," in result.stdout  # 10 ops at each of the 2 token counts


def test_vidur_rows_of_two_models_are_refused(tmp_path):
    """Only the first row's shapes were read (and checked against the model): a row of a 5120-wide model (a
    13B's hidden size) was imported into Llama-2-7B's profile."""
    path = _vidur(tmp_path, [f"{VIDUR_SHAPES},1,1,{TIMES}", f"32,32,5120,11008,32768,True,512,1,{TIMES}"])
    assert _import(path, tmp_path) == ("profile F: the rows disagree on n_embd (4096, 5120): one model's profile per "
                                       "file")


def test_a_run_at_a_rate_of_one_request_a_billion_seconds_ends_and_says_its_throughput(tmp_path):
    """Three requests at 1e-9 req/s arrive over about 3e9 simulated seconds: the run ends (the clock jumps from
    event to event), every request is served, and its throughput table said `0 output tok/s` for the
    (positive) tokens it served over that time."""
    import json

    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, ["run", "--set", "workload.num_requests=3", "--set",
                                      "workload.arrival.rate=1e-9", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["num_finished"] == 3 and summary["duration_s"] > 1e8
    assert f"{summary['output_tokens_per_s']:.3g} output tok/s" in result.stdout
    assert 0 < summary["output_tokens_per_s"] < 1e-4  # at most some thousand tokens over more than 1e8 s


def test_a_scenario_built_in_python_takes_a_path_as_kvsim_simulate_does():
    """`kvsim.simulate({"gpu": Path(...)})` reads the Path as its text; `kvsim.Scenario(gpu=Path(...))`, its copy and
    `Scenario.model_validate` refused it: "Input should be a valid string"."""
    gpu = ROOT / "kvsim" / "model" / "presets" / "models" / "llama-2-7b.json"  # any file: only the text is read
    fields = {"model": gpu, "workload": {"num_requests": 1, "prompt_len": {"dist": "fixed", "value": 8},
                                         "output_len": {"dist": "fixed", "value": 8}}}
    assert kvsim.Scenario(**fields).model == str(gpu)
    assert kvsim.Scenario.model_validate(fields).model == str(gpu)
    assert kvsim.load_scenario(None).model_copy(update={"model": gpu}).model == str(gpu)


@pytest.mark.parametrize("where", ["kvsim.fleet.driver:simulate_fleet", "kvsim.fleet.disagg:simulate_disagg",
                                   "kvsim.fleet.run:simulate_scenario"])
def test_the_fleet_apis_refuse_a_dict_of_fields_in_one_line(where):
    """The notebooks' fleet APIs take a `Scenario` (`kvsim.simulate` takes a dict too): a dict stopped with
    "AttributeError: 'dict' object has no attribute 'replicas'" inside the run."""
    import importlib

    module, name = where.split(":")
    with pytest.raises(KvsimError) as caught:
        getattr(importlib.import_module(module), name)({"replicas": 2})
    assert str(caught.value) == ("scenario={'replicas': 2}: expected a Scenario (kvsim.load_scenario(path, overrides) "
                                 "or kvsim.Scenario(**fields) makes one)")


def test_a_pool_of_one_block_is_not_called_1_blocks():
    """Llama-3.1-8B's 131,072 positions take 131,072 / 16 = 8,192 blocks of 2 MiB (32 layers x 8 KV heads x 128 x 2
    x 2 B x 16 tokens): 16 GiB, against an override of one block. The line said "(1 blocks)"."""
    assert one_line_exit_2(["capacity", "--num-gpu-blocks-override", "1"]) == (
        "max_model_len=131072: one request needs 16.00 GiB of KV cache, the pool holds 0.00 GiB (1 block); decrease "
        "max_model_len or give the KV cache more memory")


@pytest.mark.parametrize(("row", "message"), [
    ("gemm,qkv,,,,,,,,,,,,3e-05", "row 1 (gemm qkv): num_tokens is empty (a gemm row is looked up by its num_tokens)"),
    ("decode,,16,,,,,,,,,,,3e-05", "row 1 (decode): context_len is empty (a decode row is looked up by its "
                                   "context_len)"),
    ("sequence_op,sampler,,,,,,,,,,,,3e-05", "row 1 (sequence_op sampler): batch is empty (a sequence_op row is "
                                             "looked up by its batch)"),
])
def test_a_profile_row_without_the_size_it_is_looked_up_by_is_refused(tmp_path, row, message):
    """`latency: {model: calibrated, profile: P}` interpolates a gemm's time over num_tokens, a decode's over batch
    and context_len, a sequence op's over batch: a row with that cell empty passed the checks (an empty size is
    another kind's axis) and stopped the run with "ValueError: could not convert string to float: ''"."""
    from kvsim.latency.base import PROFILE_COLUMNS

    profile = tmp_path / "p.csv"
    profile.write_text("# gpu: h100-80gb\n# model: meta-llama/Llama-3.1-8B\n" + ",".join(PROFILE_COLUMNS) + "\n"
                       + row + "," * (len(PROFILE_COLUMNS) - 1 - row.count(",")) + "\n")
    assert one_line_exit_2(["run", "--set", f"latency={{model: calibrated, profile: {profile}}}", "-o",
                            str(tmp_path / "out")]) == f"profile {profile}: {message}"
    assert not (tmp_path / "out").exists()

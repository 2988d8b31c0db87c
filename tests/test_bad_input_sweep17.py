"""Bad input found by the seventeenth sweep, on the Python API and the data files. Each is a `KvsimError` naming
the field and the value (the CLI: exit 2, one line, nothing written).

Found: a profile CSV's `calls` cell that is not a number stopped the run with a bare ValueError, one below 1
(a negative count of an op's runs) was read as a negative time, and one written as `2.0` passed the checks and
then stopped the run with a ValueError. A measured run's `meta.json` with a `model` or `dataset_path` that is
not text was read as its `str()` (`model: 5` as a model called '5', a null `dataset_path` as a file called
'None'), and a bench JSON's `model_id` the same way. A gzip file under a plain name (`t.jsonl`) was
"not UTF-8 text (byte 1)", which named no way out. A Vidur mlp.csv time of `nan` was dropped as a timer that
did not fire (the op fell back to the roofline), while one of `inf` was refused. A profile bundle's meta.yaml that
is not UTF-8 was a bare UnicodeDecodeError (a traceback from `kvsim import-profile`); so was a profile's
`source.yaml` that is not UTF-8 beside a Vidur mlp.csv, one holding a list an AttributeError, and beside a bundle
both were refused as "tp_degrees must list integers". A measured run's requests.jsonl, timeseries.csv, workload
or LLMServingSim prediction that is not UTF-8 stopped `kvsim validate` with a UnicodeDecodeError traceback; a
bundle CSV that is not UTF-8, and a truncated `.gz` of a bundle CSV, a Vidur mlp.csv or a kvsim profile CSV, were a
bare UnicodeDecodeError or EOFError. `kvsim.simulate(seed=1e30)` (or a NumPy uint64 past int64) was "Unable to parse
input string as an integer", of a value that is no string. A config.json whose `model_type` is a list or a mapping
was a bare TypeError (unhashable type); a Gemma, Llama 4 or DeepSeek config.json of 10**12 layers built per-layer lists
until memory ran out, and a DeepSeek `moe_intermediate_size` that is not a number was a bare TypeError."""

import gzip
import json
import re

import numpy as np
import pytest
from conftest import one_line_exit_2
from test_profiles import LLAMA, RTX, TP1, calibrated, write_bundle, write_vidur  # tests/ is on sys.path
from test_validate import _patch_json, bench_json, write_run

import kvsim
from kvsim.latency.profiles.loader import load_profile
from kvsim.latency.profiles.native import write_native
from kvsim.latency.step_plan import StepPlan
from kvsim.model.config import PRESETS_DIR, load_gpu, load_model
from kvsim.model.engine_config import EngineConfig
from kvsim.model.errors import KvsimError
from kvsim.validation.measured import load_measured


def _native_with_calls(tmp_path, calls):
    """The bundle of `write_bundle` as a kvsim CSV whose first token op's `calls` cell reads `calls`."""
    profile = load_profile(write_bundle(tmp_path / "bf16"), LLAMA, RTX, TP1)
    row = next(r for r in profile.rows if r["kind"] == "token_op")
    row["calls"] = calls
    return write_native(profile, tmp_path / "native.csv"), row["op"]


@pytest.mark.parametrize("calls", ["abc", "-2", "0", "1.5", "nan"])
def test_a_profile_calls_cell_that_is_not_a_count_of_runs_is_named(tmp_path, calls):
    path, op = _native_with_calls(tmp_path, calls)
    with pytest.raises(KvsimError, match=rf"token_op {op}\): calls='{calls}' is not a (whole |finite )?number"):
        load_profile(path, LLAMA, RTX, TP1)


def test_a_profile_calls_cell_written_as_a_float_counts_as_the_whole_number(tmp_path):
    plan = StepPlan()
    plan.add(1, 1023, 16, logits_row=True)
    times = []
    for calls in ("2", "2.0"):
        path, _ = _native_with_calls(tmp_path / calls, calls)
        times.append(calibrated(load_profile(path, LLAMA, RTX, TP1)).step_time(plan))
    assert times[0] == times[1]


@pytest.mark.parametrize(("changes", "expected"), [
    ({"model": 5}, "model=5 is not text"),
    ({"model": None, "engine_kwargs": {"model": ["a"]}}, "engine_kwargs: model=['a'] is not text"),
    ({"dataset_path": 5}, "dataset_path=5 is not text"),
    ({"dataset_path": None}, "dataset_path is missing; pass --workload PATH"),
])
def test_a_measured_runs_meta_json_text_field_that_is_not_text_is_named(tmp_path, changes, expected):
    run = write_run(tmp_path)
    _patch_json(run / "vllm" / "meta.json", **changes)
    message = one_line_exit_2(["validate", str(run), "--gpu", "h100-80gb", "-o", str(tmp_path / "o")])
    assert message == f"{run / 'vllm' / 'meta.json'}: {expected}"
    assert not (tmp_path / "o").exists()


def test_a_bench_json_model_id_that_is_not_text_is_named(tmp_path):
    path = bench_json(tmp_path / "b.json", model_id=5)
    with pytest.raises(KvsimError, match=r"b\.json: model_id=5 is not text$"):
        load_measured(path)
    assert load_measured(bench_json(tmp_path / "c.json", model_id="", tokenizer_id="org/M")).model_id == "org/M"


def test_a_gzip_trace_under_a_plain_name_says_it_is_gzip(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(gzip.compress(b'{"timestamp": 0, "input_length": 600, "output_length": 10, "hash_ids": [1, 2]}\n'))
    with pytest.raises(KvsimError, match=r"t\.jsonl: gzip-compressed, but its name does not end in \.gz \(name it "
                                         r"t\.jsonl\.gz, or decompress it\)$"):
        kvsim.simulate(None, workload__arrival={"process": "trace"}, workload__prompt_len=None,
                       workload__output_len=None, workload__trace={"format": "mooncake", "path": str(path)})
    path.rename(tmp_path / "t.jsonl.gz")  # the name it asks for reads
    result = kvsim.simulate(None, workload__num_requests=1, workload__arrival={"process": "trace"},
                            workload__prompt_len=None, workload__output_len=None, steps="none",
                            workload__trace={"format": "mooncake", "path": str(tmp_path / "t.jsonl.gz")})
    assert len(result.requests) == 1


@pytest.mark.parametrize("cell", ["nan", "NaN"])
def test_a_vidur_time_that_is_nan_is_named_as_an_inf_is(tmp_path, cell):
    path = write_vidur(tmp_path)
    lines = path.read_text().splitlines()
    fields = lines[1].split(",")
    fields[8] = cell  # time_stats.attn_pre_proj.median of the first row
    path.write_text("\n".join([lines[0], ",".join(fields), *lines[2:]]) + "\n")
    with pytest.raises(KvsimError, match=rf"mlp\.csv: time_stats\.attn_pre_proj\.median='{cell}' is not a number$"):
        load_profile(path, load_model("llama-2-7b"), load_gpu("a100-80gb"), EngineConfig(max_model_len=4096))


def test_a_bundle_meta_yaml_that_is_not_utf8_is_one_line(tmp_path):
    root = write_bundle(tmp_path / "bf16")
    (root / "meta.yaml").write_bytes(b"gpu: \xff\xfe\n")
    message = one_line_exit_2(["import-profile", str(root), "--model", "llama-3.1-8b", "--gpu", "rtx-pro-6000",
                               "-o", str(tmp_path / "out.csv")])
    assert message == f"profile {root / 'meta.yaml'}: not UTF-8 text (byte 5)"
    assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize(("content", "expected"), [
    (b"- a\n", "expected a mapping (repository, commit, licence)"),
    (b"repository: \xff\n", "not UTF-8 text (byte 12)"),
])
def test_a_profile_source_yaml_kvsim_cannot_read_is_named(tmp_path, content, expected):
    root = write_bundle(tmp_path / "bf16")
    (root / "source.yaml").write_bytes(content)
    with pytest.raises(KvsimError, match=rf"^profile source {root / 'source.yaml'}: {re.escape(expected)}$"):
        load_profile(root, LLAMA, RTX, TP1)
    vidur = write_vidur(tmp_path / "v")
    (vidur.parent / "source.yaml").write_bytes(content)
    with pytest.raises(KvsimError, match=rf"^profile source {vidur.parent / 'source.yaml'}: {re.escape(expected)}$"):
        load_profile(vidur, load_model("llama-2-7b"), load_gpu("a100-80gb"), EngineConfig(max_model_len=4096))


@pytest.mark.parametrize(("relative", "what"), [
    ("vllm/requests.jsonl", "requests file"),
    ("vllm/timeseries.csv", "time series file"),
    ("../../../workloads/w.jsonl", "workload file"),
    ("outputs/sim.csv", "LLMServingSim prediction"),
])
def test_a_measured_runs_file_that_is_not_utf8_is_one_line(tmp_path, relative, what):
    run = write_run(tmp_path)
    path = run / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\xff\xfe not text\n")
    message = one_line_exit_2(["validate", str(run), "--gpu", "h100-80gb", "-o", str(tmp_path / "o")])
    assert message == f"{what} {path.resolve()}: not UTF-8 text (byte 0)"
    assert not (tmp_path / "o").exists()


def _truncated_gz(path):
    """`path` replaced by the first half of its gzip copy, `path.gz` (a download cut short)."""
    data = gzip.compress(path.read_bytes())
    path.unlink()
    gz = path.with_name(path.name + ".gz")
    gz.write_bytes(data[:len(data) // 2])
    return gz


TRUNCATED = "cannot read, the compressed file is truncated or corrupt"


def test_a_bundle_csv_that_is_not_utf8_or_a_truncated_gz_is_named(tmp_path):
    root = write_bundle(tmp_path / "a")
    (root / "tp1" / "attention.csv").write_bytes(b"\xff\xfe")
    with pytest.raises(KvsimError, match=rf"^profile {root / 'tp1' / 'attention.csv'}: not UTF-8 text \(byte 0\)$"):
        load_profile(root, LLAMA, RTX, TP1)
    root = write_bundle(tmp_path / "b")
    gz = _truncated_gz(root / "tp1" / "dense.csv")
    with pytest.raises(KvsimError, match=rf"^profile {gz}: {TRUNCATED}"):
        load_profile(root, LLAMA, RTX, TP1)


def test_a_truncated_gz_of_a_vidur_or_kvsim_profile_is_named(tmp_path):
    gz = _truncated_gz(write_vidur(tmp_path / "v"))
    with pytest.raises(KvsimError, match=rf"^profile {gz}: {TRUNCATED}"):
        load_profile(gz, load_model("llama-2-7b"), load_gpu("a100-80gb"), EngineConfig(max_model_len=4096))
    profile = load_profile(write_bundle(tmp_path / "bf16"), LLAMA, RTX, TP1)
    gz = _truncated_gz(write_native(profile, tmp_path / "native.csv"))
    with pytest.raises(KvsimError, match=rf"^profile {gz}: {TRUNCATED}"):
        load_profile(gz, LLAMA, RTX, TP1)


@pytest.mark.parametrize(("value", "shown_as"), [(1e30, "1e+30"), (np.uint64(2**63), "np.uint64(9223372036854775808)")])
def test_a_float_or_numpy_integer_past_int64_is_not_called_an_input_string(value, shown_as):
    with pytest.raises(KvsimError, match=rf"^seed={re.escape(shown_as)}: a float or a NumPy number is read as an "
                                         r"integer only up to int64 \(2\*\*63 - 1\); give an int$"):
        kvsim.simulate(None, seed=value)
    assert kvsim.load_scenario(None, {"seed": 2**70}).seed == 2**70  # an int of that size is a seed


@pytest.mark.parametrize("model_type", [["llama"], {"llama": 1}])
def test_a_model_type_that_is_not_text_is_named(tmp_path, model_type):
    folder = tmp_path / "M"
    folder.mkdir()
    config = json.loads((PRESETS_DIR / "models" / "llama-3.1-8b.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    message = one_line_exit_2(["capacity", "--model", str(folder)])
    assert message.startswith(f"model config M: model_type={model_type!r} is not supported (supported: ")
    with pytest.raises(KvsimError, match=r"^model config M: model_type="):
        kvsim.simulate(None, model=str(folder))


def _config_folder(tmp_path, preset, **changes):
    """A folder `M` holding `preset`'s config.json with `changes` made to its text part."""
    config = json.loads((PRESETS_DIR / "models" / f"{preset}.json").read_text())
    text = config["text_config"] if isinstance(config.get("text_config"), dict) else config
    text.update(changes)
    (tmp_path / "M").mkdir()
    (tmp_path / "M" / "config.json").write_text(json.dumps(config))
    return tmp_path / "M"


@pytest.mark.parametrize("preset", ["gemma-3-27b", "llama-4-scout", "deepseek-v2-lite"])
def test_a_model_of_more_layers_than_kvsim_holds_is_refused_in_every_family(tmp_path, preset):
    """Sweep 11 refused 10**12 layers for Llama; these families built their per-layer lists first."""
    folder = _config_folder(tmp_path, preset, num_hidden_layers=10**12)
    assert one_line_exit_2(["capacity", "--model", str(folder)]) == (
        "model M.num_layers=1000000000000: Input should be less than or equal to 65536")


def test_a_deepseek_expert_size_that_is_not_a_count_is_named(tmp_path):
    folder = _config_folder(tmp_path, "deepseek-v2-lite", moe_intermediate_size={"a": 1})
    assert one_line_exit_2(["capacity", "--model", str(folder)]) == (
        "model config M: moe_intermediate_size={'a': 1}: must be a positive integer")

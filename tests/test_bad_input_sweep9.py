"""Bad input found by the ninth sweep, in the commands other than `run` (their flags' lists, empty values and
paths) and in settings that each pass alone: each exits 2 with one line naming the flag or field and the value,
and writes nothing, never a value left out in silence, a setting dropped without a word, an error naming a
value the user never wrote, or a traceback."""

import json

import pytest
from conftest import VALIDATION_SET, one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
PLAN = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2", "--set", "workload.num_requests=20"]
RUN = ["run", "--set", "workload.num_requests=4", "--set", "steps=none"]
MEASURED = str(VALIDATION_SET / "measured" / "RTXPRO6000" / "Llama-3.1-8B")


@pytest.mark.parametrize(("argv", "flag", "value", "item"), [
    (["capacity"], "--context-lengths", "1024,,2048", 2),
    (["capacity"], "--context-lengths", "1024,", 2),
    (["calibrate", "--gpu", "h200", "--dry-run"], "--block-sizes", "16,,32", 2),
], ids=["capacity-gap", "capacity-trailing-comma", "calibrate-gap"])
def test_an_empty_item_of_a_list_flag_is_refused(tmp_path, argv, flag, value, item):
    """`--context-lengths 1024,,2048` printed the rows of 1024 and 2048 and `--block-sizes 16,,32` timed block sizes
    16 and 32: the empty item, a value left out, was skipped without a word."""
    assert one_line_exit_2([*argv, flag, value]) == f"{flag}={value!r}: item {item} is empty"
    result = runner.invoke(app, ["capacity", "--context-lengths", "1024, 2048", "--format", "json"])
    assert result.exit_code == 0, result.output  # spaces around an item are still fine
    assert [row["context_len"] for row in json.loads(result.stdout)["rows"]] == [1024, 2048]


@pytest.mark.parametrize(("value", "item"), [("1,,2", 2), ("128,", 2)])
def test_an_empty_value_of_a_plan_knob_is_refused(tmp_path, value, item):
    """`--engine max_num_seqs=1,,2` read the gap as YAML's null: a third candidate at the scenario's max_num_seqs,
    searched and ranked beside the two asked for."""
    out = tmp_path / "out"
    assert one_line_exit_2([*PLAN, "--engine", f"max_num_seqs={value}", "-o", str(out)]) == (
        f"--engine max_num_seqs={value!r}: item {item} is empty")
    assert not out.exists()


@pytest.mark.parametrize(("flag", "value", "message"), [
    ("--kv-cache-memory-bytes", "", "engine.kv_cache_memory_bytes='': not a size"),
    ("--kv-cache-dtype", "", "engine.kv_cache_dtype='': Input should be 'auto', "),
    ("--gpu", "", "gpu='': is empty: name a preset or a GPU file"),  # as --model '' (tidy30)
    ("--gpu", "[h100", "gpu='[h100': not a preset"),
    ("--model", "#x", "model='#x': not a preset"),
], ids=["kv-bytes-empty", "kv-dtype-empty", "gpu-empty", "gpu-bracket", "model-hash"])
def test_report_reads_its_flags_as_given(tmp_path, flag, value, message):
    """`kvsim report` passed its flags through YAML: `--kv-cache-memory-bytes ''` was null, the flag dropped and the
    whole report run on the estimated pool; `--gpu ''` and `--model '#x'` were refused as `gpu=None`, `model=None`,
    and `--gpu '[h100'` as a `--set 'gpu=[h100'` nobody wrote."""
    out = tmp_path / "out"
    assert one_line_exit_2(["report", "--quick", "--workers", "1", flag, value, "-o", str(out)]).startswith(message)
    assert not out.exists()


def test_report_still_takes_its_flags(tmp_path, monkeypatch):
    from kvsim.report import build

    seen = {}

    def build_report(base, output, cfg, progress=None):
        seen["base"] = base
        return output

    monkeypatch.setattr(build, "build_report", build_report)
    result = runner.invoke(app, ["report", "--quick", "--workers", "1", "--kv-cache-memory-bytes", "12GiB",
                                 "--kv-cache-dtype", "fp8", "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                 "--max-model-len", "4096", "-o", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    base = seen["base"]
    assert (base.model, base.gpu, base.engine.kv_cache_memory_bytes, base.engine.kv_cache_dtype,
            base.engine.max_model_len) == ("llama-3.1-8b", "h100-80gb", 12 * 2**30, "fp8", 4096)


@pytest.mark.parametrize("gpu", ["", " "])
def test_calibrate_refuses_an_empty_gpu(tmp_path, gpu):
    """The GPU name is recorded in the profile, and a profile that names none is checked against no GPU when a
    scenario reads it: `--gpu ''` made a profile any GPU's scenario would take."""
    assert one_line_exit_2(["calibrate", "--gpu", gpu, "--dry-run", "-o", str(tmp_path / "p.csv")]) == (
        f"--gpu={gpu!r}: is empty: name the GPU the profile is measured on (e.g. h200)")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("argv", "message"), [
    (["validate", ""], "measured='': is empty"),
    (["validate", MEASURED, "--latency", "calibrated", "--profile", ""],
     "--profile='': is empty: name a measured profile bundle or CSV"),
    (["import-profile", ""], "profile '': is empty"),
    (["run", ""], "scenario='': is empty"),
], ids=["validate-measured", "validate-profile", "import-profile-source", "run-scenario"])
def test_an_empty_path_is_not_the_working_folder(tmp_path, monkeypatch, argv, message):
    """`Path('')` is the working folder: `validate ''` read it as the measured run (refused only for lacking
    vllm/meta.json), `--profile ''` and `import-profile ''` as a profile bundle (`profile .: not a profile
    bundle`) and `run ''` as a folder given for the scenario (an unset shell variable, each)."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2([*argv, "-o", str(tmp_path / "out")]) == message
    assert list(tmp_path.iterdir()) == []


def test_simulate_names_an_empty_scenario_path():
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError, match="^scenario='': is empty$"):
        kvsim.simulate("")


@pytest.mark.parametrize(("config", "message"), [
    ("{method: ngram, num_speculative_tokens: 2, acceptance_rates: 0.5, model: llama-3.1-8b}",
     "model='llama-3.1-8b': method=ngram does not read it (only draft_model, eagle, eagle3)"),
    ("{method: ngram, num_speculative_tokens: 2, acceptance_rates: 0.5, rejection_sample_method: synthetic}",
     "rejection_sample_method='synthetic' takes synthetic_acceptance_rates or synthetic_acceptance_length "
     "(got acceptance_rates, a model of another sampler)"),
    ("{method: eagle, num_speculative_tokens: 3, acceptance_length: 2, rejection_sample_method: synthetic}",
     "rejection_sample_method='synthetic' takes synthetic_acceptance_rates or synthetic_acceptance_length "
     "(got acceptance_length, a model of another sampler)"),
], ids=["ngram-with-a-model", "synthetic-with-conditional-rates", "synthetic-with-a-length"])
def test_a_speculative_setting_its_method_does_not_read_is_refused(tmp_path, config, message):
    """n-gram drafting has no draft model: the model was dropped without a word (the run drafted by n-gram at no
    GPU cost). `rejection_sample_method: synthetic` names vLLM's synthetic sampler, which kvsim models only from
    `synthetic_acceptance_*`: beside `acceptance_rates` the conditional model ran instead."""
    out = tmp_path / "out"
    assert one_line_exit_2([*RUN, "--set", f"engine.speculative_config={config}", "-o", str(out)]) == (
        f"engine.speculative_config: {message}")
    assert not out.exists()


@pytest.mark.parametrize("config", [
    {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rates": 0.5, "model": "some/eagle-head"},
    {"method": "ngram", "num_speculative_tokens": 3, "synthetic_acceptance_length": 2.0,
     "rejection_sample_method": "synthetic"},
    {"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.5, "rejection_sample_method": "strict"},
])
def test_speculative_settings_their_method_reads_still_load(config):
    from kvsim.workload.scenario import load_scenario

    assert load_scenario(None, {"engine.speculative_config": config}).engine.speculative_config is not None


@pytest.mark.parametrize("cv", ["1e300", "1e-170", "1e-160"])
def test_a_gamma_cv_whose_shape_is_not_a_number_is_refused(tmp_path, cv):
    """Gamma gaps have shape 1/cv²: cv=1e300 overflowed it (OverflowError), 1e-170 made it a division by zero and
    1e-160 an infinite shape whose NaN arrivals ended the run in a RuntimeError: three tracebacks."""
    out = tmp_path / "out"
    assert one_line_exit_2([*RUN, "--set", f"workload.arrival={{process: gamma, rate: 1, cv: {cv}}}", "-o",
                            str(out)]) == f"workload.arrival.cv={cv!r}: the gamma gaps' shape 1/cv² is not a finite number"
    assert not out.exists()


@pytest.mark.parametrize("cv", [1e154, 1e-154])
def test_a_gamma_cv_whose_shape_is_a_number_still_runs(cv):
    import kvsim

    result = kvsim.simulate(None, workload__num_requests=4, steps="none",
                            workload__arrival={"process": "gamma", "rate": 1, "cv": cv})
    assert result.summary["num_finished"] == 4


def test_simulate_refuses_a_gamma_cv_whose_shape_is_not_a_number():
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError, match=r"^workload\.arrival\.cv=1e\+300: the gamma gaps' shape 1/cv² is not a finite number$"):
        kvsim.simulate(None, workload__num_requests=4, workload__arrival={"process": "gamma", "rate": 1, "cv": 1e300})

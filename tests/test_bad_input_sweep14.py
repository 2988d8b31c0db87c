"""Bad input found by the fourteenth sweep (integers of hundreds of digits echoed whole, ...): each exits 2 with
one line naming the field and the value, and writes nothing, never a traceback or a value echoed back whole."""

from pathlib import Path

import pytest
from conftest import one_line_exit_2

# A calibrated run on the profile bundle `test_skew.skew_bundle` writes (in the working folder's `bf16`).
SKEW_RUN_ARGV = ["run", "--set", "gpu=rtx-pro-6000", "--set", "latency={model: calibrated, profile: bf16}",
                 "--set", "engine={max_model_len: 1024, max_num_seqs: 16, max_num_batched_tokens: 256}",
                 "--set", "workload={num_requests: 200, arrival: {process: poisson, rate: 20}, prompt_len: {dist: "
                 "lognormal, mean: 100, p99: 400}, output_len: {dist: lognormal, mean: 40, p99: 300}}",
                 "--set", "seed=3", "-o", "out"]

RUN = ["run", "--set", "workload.num_requests=3", "--set", "steps=none"]
BIG = "9" * 400
CUT = "9" * 57 + "..."  # docs/commands.md: a value shown in an error is cut to 60 characters


def _files(folder):
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.mark.parametrize(("argv", "expected"), [
    (["run", "--set", f"engine.max_model_len={BIG}"],
     f"max_model_len={CUT}: exceeds llama-3.1-8b's max_position_embeddings=131072"),
    (["run", "--set", f"engine.tensor_parallel_size={BIG}"],
     f"tensor_parallel_size={CUT}: must divide llama-3.1-8b's 32 attention heads"),
    (["run", "--set", f"engine.max_num_seqs={BIG}"],
     "engine.max_num_batched_tokens=8192: vLLM refuses this: max_num_batched_tokens (8192) must be greater than "
     f"or equal to max_num_seqs ({CUT})"),
    (["capacity", "-tp", BIG], f"tensor_parallel_size={CUT}: must divide llama-3.1-8b's 32 attention heads"),
    (["capacity", "--block-size", BIG], f"engine: block_size={CUT}: vLLM accepts 1, 8, 16, 32, 64, 128, 256"),
    (["plan", "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb", "-tp", BIG],
     f"tensor_parallel_size={CUT}: must divide llama-3.1-8b's 32 attention heads"),
])
def test_a_huge_integer_is_cut_in_the_error_line(tmp_path, monkeypatch, argv, expected):
    """An integer field takes any size, and the messages naming it as `field={value}` printed all 400 digits."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2(argv) == expected
    assert _files(tmp_path) == []


@pytest.mark.parametrize(("flags", "expected"), [
    (["--set", "latency={model: calibrated, profile: nope.csv}"], "latency.profile='nope.csv': file not found: "),
    (["--set", "workload.prompt_len={dist: empirical, table: nope.csv, column: prompt}"],
     "workload.prompt_len.table='nope.csv': file not found: "),
    (["--set", "workload.output_len={dist: empirical, table: 'builtin:nope', column: output}"],
     "workload.output_len.table='builtin:nope': no built-in data named 'nope' (there are: "),
])
def test_a_missing_data_file_names_the_field_that_gave_it(tmp_path, monkeypatch, flags, expected):
    """A missing latency profile or length table was reported as `path='...'`, a field the user had not set."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2([*RUN, *flags]).startswith(expected)
    assert _files(tmp_path) == []


@pytest.mark.parametrize("command", [RUN, ["plan", "--slo", "ttft_s.p90=2", "--gpu", "h100-80gb"]])
@pytest.mark.parametrize("output", ["a\nb", "a\tb", "a\x1b[31mb"])
def test_an_output_folder_with_a_control_character_is_refused(tmp_path, monkeypatch, command, output):
    """`-o $'a\\nb'` made a folder whose name split the "results written to" line in two, as a scenario name
    with a newline split error lines before `Label` refused it."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2([*command, "-o", output]) == (
        f"--output={output!r}: holds the control character {output[1]!r}; name a folder with one line of printable "
        "text; kvsim only replaces output it wrote itself (choose a new path)")
    assert _files(tmp_path) == []


@pytest.mark.parametrize("flags", [["--steps", "none"], ["--set", "steps=none"]])
@pytest.mark.parametrize("steps_format", ["csv", "parquet", "auto"])
def test_a_steps_format_for_a_run_keeping_no_steps_is_refused(tmp_path, monkeypatch, flags, steps_format):
    """`--steps-format` chooses the steps file, and steps=none writes none: the flag was dropped without a word,
    where kvsim refuses a flag another makes it ignore (`capacity --num-sequences` without a shared prefix,
    `validate --profile` without `--latency calibrated`)."""
    monkeypatch.chdir(tmp_path)
    argv = ["run", "--set", "workload.num_requests=3", *flags, "--steps-format", steps_format]
    assert one_line_exit_2(argv) == (f"--steps-format={steps_format}: chooses the file the steps are written to, "
                                     "but this run keeps none (steps=none)")
    assert _files(tmp_path) == []


def test_a_steps_format_for_sampled_steps_still_writes_that_file(tmp_path):
    """`sampled` keeps a steps file, so the flag is read there."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    argv = ["run", "--set", "workload.num_requests=3", "--steps", "sampled", "--steps-format", "csv",
            "-o", str(tmp_path / "out")]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "steps.csv").is_file()


WORKLOAD = {"num_requests": 3, "prompt_len": {"dist": "fixed", "value": 5}, "output_len": {"dist": "fixed", "value": 2}}


@pytest.mark.parametrize(("fields", "message"), [
    ({"seed": "-5", "workload": WORKLOAD}, "seed='-5': Input should be greater than or equal to 0"),
    ({"workload": {"num_requests": "1_0"}}, "workload: num_requests='1_0': a number written with an underscore"),
    ({"nope": "1", "workload": WORKLOAD}, "nope: unknown key"),
])
def test_model_validate_strings_refuses_as_model_validate_does(fields, message):
    """Pydantic's `model_validate_strings` raised its multi-line ValidationError, no `KvsimError`."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError) as raised:
        kvsim.Scenario.model_validate_strings(fields)
    assert str(raised.value).startswith(message)
    with pytest.raises(KvsimError) as direct:
        kvsim.Scenario.model_validate(fields)
    assert str(direct.value) == str(raised.value)
    assert kvsim.Scenario.model_validate_strings({"seed": "7", "workload": WORKLOAD}).seed == 7


@pytest.mark.parametrize(("fields", "message"), [
    ({"seed": -5, "workload": WORKLOAD}, "seed=-5: Input should be greater than or equal to 0"),
    ({"nope": 3, "workload": WORKLOAD}, "nope: unknown key"),
    ({}, "workload: required field is missing"),
])
def test_model_construct_validates_as_model_validate_does(fields, message):
    """Pydantic's `model_construct` skips validation: a seed of -5 reached numpy mid-run, an unknown key was kept
    and a scenario without a workload was made."""
    import kvsim
    from kvsim.model.errors import KvsimError

    with pytest.raises(KvsimError) as raised:
        kvsim.Scenario.model_construct(**fields)
    assert str(raised.value).startswith(message)


def test_model_construct_keeps_pydantics_fields_set():
    import kvsim

    made = kvsim.Scenario.model_construct(workload=WORKLOAD, seed=3)
    assert (made.seed, made.model_fields_set) == (3, {"workload", "seed"})
    assert kvsim.Scenario.model_construct({"workload"}, workload=WORKLOAD, seed=3).model_fields_set == {"workload"}
    assert made == kvsim.Scenario.model_validate({"workload": WORKLOAD, "seed": 3})


SLOW_GPU = ("memory_bytes: 81559MiB\nhbm_bandwidth_bytes_per_s: 3.35e12\nfp16_flops: {flops}\n"
            "host_link_bandwidth_bytes_per_s: 64e9\n")
FIXED_LENGTHS = ["--set", "workload.prompt_len={dist: fixed, value: 100}",
                 "--set", "workload.output_len={dist: fixed, value: 2}"]


@pytest.mark.parametrize("steps", ["none", "all"])
def test_a_step_past_the_clock_is_refused(tmp_path, monkeypatch, steps):
    """`fp16_flops: 1` made a prefill step of 1.5e13 s (about 500,000 years): the run went on past 2**32 s, where
    the clock keeps no microsecond, without a word (sweep 13 bounded only the arrivals). A 100-token prefill of
    Llama-3.1-8B (8.0e9 parameters, 2 FLOPs each per token) needs at least 1.6e12 FLOPs, so at 1 FLOP/s its step
    takes at least 1.6e12 s, past 2**32 = 4.29e9 s."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "slow.yaml").write_text(SLOW_GPU.format(flops=1))
    message = one_line_exit_2(["run", "--set", "gpu=slow.yaml", "--set", f"steps={steps}", *FIXED_LENGTHS,
                               "--set", "workload.num_requests=3", "-o", "out"])
    head, _, tail = message.partition(" s would end at ")
    assert head.startswith("latency=roofline: a step of ")
    assert float(head.removeprefix("latency=roofline: a step of ")) >= 2 * 8.0e9 * 100
    assert tail.endswith("(past 4.29497e+09 s, about 136 years, where the clock keeps no microsecond); no GPU step "
                         "or KV transfer takes that long: check the GPU's figures (flops, bandwidths, link, "
                         "efficiency)")
    assert _files(tmp_path) == ["slow.yaml"]


def test_a_slow_gpu_within_the_clock_still_runs(tmp_path):
    """The bound is the clock's, not a bound on the figures: 1e9 FLOP/s (1e6 times below an H100) takes
    ~1.6e3 s per 100-token prefill and runs."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    (tmp_path / "slow.yaml").write_text(SLOW_GPU.format(flops=1e9))
    argv = ["run", "--set", f"gpu={tmp_path / 'slow.yaml'}", "--set", "steps=none", *FIXED_LENGTHS,
            "--set", "workload.num_requests=3", "-o", str(tmp_path / "out"), "--format", "json"]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 0, result.output
    import json

    assert json.loads(result.stdout)["ttft_s"]["mean"] >= 2 * 8.0e9 * 100 / 1e9


def test_a_kv_transfer_past_the_clock_is_refused(tmp_path, monkeypatch):
    """A 1 B/s KV link moves one 8,000-token prompt of Llama-3.1-8B (32 layers x 8 KV heads x 128 dims x K and V x
    2 bytes = 131,072 B a token: 1.05e9 B) in 1.05e9 s; five sharing the link end together at 5.2e9 s, past
    2**32 = 4.29e9 s, where the run went on without a word."""
    monkeypatch.chdir(tmp_path)
    scenario = Path(__file__).parents[1] / "scenarios" / "disagg-1p1d.yaml"
    argv = ["run", str(scenario), "--set", "workload.num_requests=5",
            "--set", "workload.prompt_len={dist: fixed, value: 8000}", "--set", "workload.output_len={dist: fixed, "
            "value: 2}", "--set", "workload.arrival={process: poisson, rate: 1000}",
            "--set", "kv_transfer_config={kv_connector: NixlConnector, kv_link: rdma, kv_link_bandwidth_bytes_per_s: 1}",
            "--set", "steps=none", "-o", "out"]
    message = one_line_exit_2(argv)
    head, _, tail = message.partition(" s (past ")
    assert head.startswith("kv_transfer_config: a KV transfer at 1 B/s would end at ")
    assert float(head.removeprefix("kv_transfer_config: a KV transfer at 1 B/s would end at ")) == pytest.approx(
        5 * 8000 * 131_072, rel=1e-3)
    assert message.endswith("(past 4.29497e+09 s, about 136 years, where the clock keeps no microsecond); no GPU "
                            "step or KV transfer takes that long: check kv_link_bandwidth_bytes_per_s and "
                            "kv_link_latency_s")
    assert _files(tmp_path) == []


def test_a_negative_alpha_is_applied_until_it_makes_attention_negative():
    """Measured bundles hold negative alphas (a skewed batch timed a little faster than the uniform one, in 11 to
    18 % of the buckets of each RTX PRO 6000 bundle, down to -735 on Llama-3.1-8B at TP 2), so they are read; one
    below -t_mean / (t_max - t_mean) made the step's attention negative, and a step of negative time stopped SimPy
    with a traceback ('Negative delay')."""
    from test_skew import correction

    from kvsim.model.errors import KvsimError

    # decodes at 1000, 1000, 4000: bucket (pc 0, n <= 4, share 1/3 <= 0.4, longest <= 4096, no prefill)
    assert correction([(0, 4, 0.4, 4096, 0, -0.2)]).corrected(10.0, 40.0, 0, 3, 2000.0, 1000, 4000, 0) == (
        pytest.approx(10 - 0.2 * 30))
    with pytest.raises(KvsimError) as raised:  # 10 - 2 * (40 - 10) = -50
        correction([(0, 4, 0.4, 4096, 0, -2)]).corrected(10.0, 40.0, 0, 3, 2000.0, 1000, 4000, 0)
    assert str(raised.value) == (
        "profile test: attention_skew row (query_len=0, batch=4, skew_share=0.4, decode_context_len=4096, "
        "context_len=0): alpha=-2 makes a step's attention -50 s, below zero (t_mean + alpha * (t_max - t_mean), "
        "t_mean=10 s, t_max=40 s); no batch attends in negative time: refit or drop that alpha")
    with pytest.raises(KvsimError, match=r"^profile test: attention_skew_alpha_default: alpha=-2 makes"):
        correction([], default=-2).corrected(10.0, 40.0, 0, 5, 2000.0, 1000, 4000, 0)  # n = 5: unmeasured bucket


def test_a_run_reaching_an_alpha_that_makes_attention_negative_stops_in_one_line(tmp_path, monkeypatch):
    from test_skew import skew_bundle

    monkeypatch.chdir(tmp_path)
    table = skew_bundle(tmp_path / "bf16") / "tp1" / "skew_fit.csv"
    table.write_text(table.read_text().replace(",0.5,", ",-1000,"))
    message = one_line_exit_2(SKEW_RUN_ARGV)
    assert message.startswith("profile meta-llama/Llama-3.1-8B/bf16/tp1: skew_fit.csv row (pc=0, n_label=n<=4, "
                              "skew_rate_label=sr<=40%, kv_big_label=kvB<=1k, kp_label=kp=0): alpha=-1000 makes a "
                              "step's attention -"), message  # the bundle's row, by its own columns (sweep 15)
    assert _files(tmp_path / "bf16") and not (tmp_path / "out").exists()

"""A new user's first hour: names a serving engineer types from habit, answered with the nearest thing kvsim knows.

Found following the README from a fresh clone: a GPU named as its vendor does (`H100-SXM`, `NVIDIA-H100-80GB-HBM3`)
and a model named by its Hugging Face id (`meta-llama/Llama-3.1-8B`, as vLLM's `--model` takes it) listed every
preset and suggested none; a scenario path one character off the README's (`.yml`, `scenario/`, `paper_paged`,
the bare name) said `file not found` and no more."""

import pytest
from conftest import one_line_exit_2


@pytest.mark.parametrize(("flag", "name", "hint"), [
    # a preset held whole inside a longer name (a Hugging Face id, as vLLM's --model takes it): the longest such
    ("--model", "meta-llama/Llama-3.1-8B", " (did you mean llama-3.1-8b?)"),
    ("--model", "Qwen/Qwen3-30B-A3B", " (did you mean qwen3-30b-a3b?)"),
    ("--model", "Qwen/Qwen3-30B-A3B-Instruct-2507-FP8", " (did you mean qwen3-30b-a3b-instruct-2507?)"),
    ("--model", "meta-llama/Meta-Llama-3.1-8B-Instruct", " (did you mean llama-3.1-8b?)"),
    ("--gpu", "NVIDIA-H100-80GB-HBM3", " (did you mean h100-80gb?)"),
    ("--gpu", "nvidia-l40s", " (did you mean l40s?)"),
    ("--gpu", "l4-24gb", " (did you mean l4?)"),
    # the family word (letters, then digits) begins up to three presets
    ("--gpu", "H100-SXM", " (did you mean h100-80gb or h100-pcie?)"),
    ("--gpu", "h100sxm", " (did you mean h100-80gb or h100-pcie?)"),
    ("--gpu", "B200-SXM", " (did you mean b200?)"),
    ("--gpu", "NVIDIA H100 80GB HBM3", " (did you mean h100-80gb or h100-pcie?)"),  # nvidia-smi's name: its 2nd word
    ("--gpu", "NVIDIA L4", " (did you mean l4?)"),
    # a preset followed by a digit is not held: `rtx-a4000` holds `a40` but is no A40
    ("--gpu", "rtx-a4000", " (did you mean rtx-4090 or rtx-pro-6000?)"),
    # what the earlier rules answered stays
    ("--gpu", "h100", " (did you mean h100-80gb or h100-pcie?)"),
    ("--model", "Llama-3.1-8B", " (did you mean llama-3.1-8b?)"),
    ("--model", "llama", ""),
    ("--model", "meta-llama/", ""),
])
def test_a_vendor_or_hugging_face_name_is_answered_with_the_preset(tmp_path, monkeypatch, flag, name, hint):
    monkeypatch.chdir(tmp_path)
    message = one_line_exit_2(["capacity", flag, name])
    assert message.startswith(f"{flag.removeprefix('--')}={name!r}: not a preset (")
    assert message.endswith(f") nor a file{hint}"), message


@pytest.mark.parametrize(("given", "hint"), [
    ("scenarios/paper-paged.yml", " (did you mean scenarios/paper-paged.yaml?)"),
    ("scenarios/paper_paged.yaml", " (did you mean scenarios/paper-paged.yaml?)"),
    ("scenario/paper-paged.yaml", " (did you mean scenarios/paper-paged.yaml?)"),  # the folder one letter off
    ("paper-paged", " (did you mean scenarios/paper-paged.yaml?)"),  # a bare name: the working folder's scenarios/
    ("lab.yaml", " (did you mean lab.yml?)"),  # the working folder's own files first
    ("scenarios/nothing-like.yaml", ""),
    ("nowhere/paper-paged.yaml", ""),
])
def test_a_scenario_path_one_typo_off_is_answered_with_the_file(tmp_path, monkeypatch, given, hint):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "scenarios").mkdir()
    for name in ("paper-paged.yaml", "paper-slab-max.yaml", "notes.txt"):
        (tmp_path / "scenarios" / name).write_text("workload: {num_requests: 1}\n")
    (tmp_path / "lab.yml").write_text("workload: {num_requests: 1}\n")
    before = sorted(tmp_path.rglob("*"))
    assert one_line_exit_2(["run", given]) == f"scenario={given!r}: file not found{hint}"
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize(("argv", "expected"), [
    (["--gpu", "h100-80gb"], "plan.slo: required field is missing: give --slo (e.g. --slo ttft_s.p90=2, repeatable) "
                             "or `slo` in a --spec file"),
    (["--slo", "ttft_s.p90=2"], "plan.gpus: required field is missing: give --gpu (e.g. --gpu h100-80gb, repeatable) "
                                "or `gpus` in a --spec file"),
])
def test_plan_without_an_slo_or_a_gpu_names_the_flag(tmp_path, monkeypatch, argv, expected):
    """`kvsim plan --gpu h100-80gb` said `plan.slo: required field is missing`, a field no flag is called (the flag
    is --slo; for `gpus`, --gpu)."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2(["plan", *argv]) == expected
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("given", "hint"), [
    ("measured/RTXPRO6000/llama-3.1-8b", " (did you mean measured/RTXPRO6000/Llama-3.1-8B?)"),  # the case
    ("measured/RTX-PRO-6000/Llama-3.1-8B", " (did you mean measured/RTXPRO6000/Llama-3.1-8B?)"),  # the folder
    ("measured/RTXPRO6000/Qwen3-32B", ""),
])
def test_a_measured_run_path_one_typo_off_is_answered_with_the_folder(tmp_path, monkeypatch, given, hint):
    """`kvsim validate benchmarks/validation_set/measured/RTXPRO6000/llama-3.1-8b` (the model's preset spelling) said
    only 'no such file or folder'."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "measured" / "RTXPRO6000" / "Llama-3.1-8B").mkdir(parents=True)
    assert one_line_exit_2(["validate", given]) == f"measured={given!r}: no such file or folder{hint}"
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*")) == [
        "measured", "measured/RTXPRO6000", "measured/RTXPRO6000/Llama-3.1-8B"]


@pytest.mark.parametrize(("setting", "expected"), [
    ("max_model_len=4096", "max_model_len: unknown key (did you mean engine.max_model_len?)"),
    ("block_size=32", "block_size: unknown key (did you mean engine.block_size?)"),
    ("num_requests=10", "num_requests: unknown key (did you mean workload.num_requests?)"),
    ("workload.rate=10", "workload.rate: unknown key (did you mean workload.arrival.rate?)"),
    ("engine.max_num_seq=8", "engine.max_num_seq: unknown key (did you mean max_num_seqs?)"),  # a typo: as before
    ("rate=3", "rate: unknown key"),  # a field two sections down: no guess
])
def test_a_set_of_a_field_one_section_off_names_its_place(tmp_path, monkeypatch, setting, expected):
    """`--set max_model_len=4096`, vLLM's flag without the scenario's `engine.`, said `unknown key` and no more."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2(["run", "--set", setting]) == expected
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("flag", "key"), [("--request-rate", "workload.arrival.rate"),
                                           ("--num-prompts", "workload.num_requests")])
def test_a_vllm_bench_serve_flag_is_told_as_its_set(tmp_path, monkeypatch, flag, key):
    """`kvsim run --request-rate 10`, as `vllm bench serve` takes it, said `No such option` and offered nothing."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2(["run", flag, "10"]) == (
        f"No such option: {flag}: {key} is a scenario field; give it as --set {key}=VALUE (see 'kvsim run --help')")
    assert list(tmp_path.iterdir()) == []


def test_a_profile_path_one_typo_off_is_answered_with_the_folder(tmp_path, monkeypatch):
    """The README's import-profile line with the model's folder in the preset's case (`llama-3.1-8B`) said only
    'no such file or folder'; the folder two levels up is found as the measured run's is."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p" / "meta-llama" / "Llama-3.1-8B" / "bf16").mkdir(parents=True)
    given = "p/meta-llama/llama-3.1-8B/bf16"
    assert one_line_exit_2(["import-profile", given, "--model", "llama-3.1-8b", "--gpu", "rtx-pro-6000", "-o",
                            "x.csv"]) == (f"profile {given}: no such file or folder "
                                          "(did you mean p/meta-llama/Llama-3.1-8B/bf16?)")
    assert not (tmp_path / "x.csv").exists()


def test_a_data_file_one_typo_off_is_answered_with_the_file(tmp_path, monkeypatch):
    """A trace path with its suffix misspelt (`trace.cvs`) said 'file not found' and no more."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "trace.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    assert one_line_exit_2(["run", "--set", "workload.trace={format: azure, path: trace.cvs}", "--set",
                            "workload.prompt_len=null", "--set", "workload.output_len=null"]) == (
        "workload.trace.path='trace.cvs': file not found: trace.cvs (did you mean trace.csv?)")
    assert [p.name for p in tmp_path.iterdir()] == ["trace.csv"]


@pytest.mark.parametrize(("argv", "expected"), [
    (["--gpu-hourly-cost", "4.76"], "--gpu-hourly-cost '4.76': expected NAME=VALUE, e.g. --gpu-hourly-cost h100-80gb=4.76"),
    (["--engine", "max_num_seqs"], "--engine 'max_num_seqs': expected NAME=VALUE, e.g. --engine max_num_seqs=128,256"),
])
def test_a_plan_pair_flag_without_a_name_shows_the_form(tmp_path, monkeypatch, argv, expected):
    """`kvsim plan --gpu-hourly-cost 4.76`, as `capacity` and `report` take it (one price), said only
    `expected NAME=VALUE`, where plan's names the GPU each price is for."""
    monkeypatch.chdir(tmp_path)
    assert one_line_exit_2(["plan", "--gpu", "h100-80gb", "--slo", "ttft_s.p90=2", *argv]) == expected
    assert list(tmp_path.iterdir()) == []

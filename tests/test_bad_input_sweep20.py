"""Bad input found by the twentieth sweep. Each is refused (the CLI: exit 2, one line naming the field and the value,
nothing written; the Python API: a `KvsimError`), read as vLLM reads it, or warned of in one line where kvsim does
not read it.

Found: a config.json whose `rope_scaling` gave a `rope_type` and a legacy `type` that disagree ran on `rope_type`
(vLLM's `patch_rope_parameters_dict` refuses them); a yarn `original_max_position_embeddings` of `32768.0` was refused
as "a positive integer" (vLLM multiplies it by the factor as it is); `architectures` given as one name, not a list,
was "names no model kvsim reads" (vLLM's registry reads a name as a list of one). A 2 GiB file given as a bench's
`--output`, or named `.kvsim-output` in a folder given as `-o`, was read whole (2 GB of memory) to tell whether kvsim
wrote it. `bench_kernels.py --output-dir D` wrote kernels.json and kernels.md, and `bench_vidur.py --write-scenarios D`
a scenario and three traces, over whatever files were there. A trace's token count of `600.0` was 600 in JSON and
refused in a CSV cell, and acceptance lengths of `2.0` refused in both. A SIGTERM killed `kvsim run` on the spot,
leaving its hidden temporary folder and saying nothing. A `gpu_link` with tensor_parallel_size 1 and an EAGLE
drafter's `model` were read by nothing, without a word. `kvsim validate` dropped a meta.json's
`num_gpu_blocks_override`, `kv_cache_memory_bytes`, `scheduling_policy`, `disable_hybrid_kv_cache_manager` and
`speculative_config` without a word, and called a vllm/meta.json that is a folder or a FIFO missing.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import benchmark_script, one_line_exit_2  # tests/ is on sys.path

import kvsim
from kvsim.model.errors import KvsimError
from kvsim.model.families import fields_from_hf_config
from kvsim.results.output_checks import check_output_file
from kvsim.workload.traces import read_azure, read_lengths, read_mooncake, read_sharegpt_tokens

ROOT = Path(__file__).resolve().parent.parent
PRESETS = Path(kvsim.__file__).parent / "model" / "presets" / "models"
# Qwen2.5-7B's text part, with the 32,768 positions its model card gives before YaRN
QWEN = {"model_type": "qwen2", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064, "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16"}


def _folder(tmp_path: Path, config: dict) -> Path:
    (tmp_path / "M").mkdir()
    (tmp_path / "M" / "config.json").write_text(json.dumps(config))
    return tmp_path / "M"


def test_a_rope_type_and_a_legacy_type_that_disagree_are_refused_as_vllm_refuses_them(tmp_path):
    folder = _folder(tmp_path, {**QWEN, "rope_scaling": {"type": "linear", "rope_type": "yarn", "factor": 4.0,
                                                           "original_max_position_embeddings": 32768}})
    assert one_line_exit_2(["capacity", "--model", str(folder)]) == (
        "model config M: rope_scaling.rope_type='yarn' and its legacy type='linear' disagree (vLLM refuses both); "
        "give one of them")
    with pytest.raises(KvsimError, match=r"^model config M: rope_scaling.rope_type='yarn' and its legacy"):
        kvsim.simulate(None, model=str(folder))


@pytest.mark.parametrize(("rope_scaling", "max_len"), [
    ({"type": "su", "rope_type": "longrope", "factor": 4.0}, 32768),  # the pairs vLLM lets stand: unscaled
    ({"type": "mrope", "rope_type": "default"}, 32768),  # default: factor 1
    ({"type": "yarn", "rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16384}, 32768),
])
def test_a_legacy_type_that_vllm_lets_stand_is_read(rope_scaling, max_len):
    assert fields_from_hf_config({**QWEN, "rope_scaling": rope_scaling}, "M")["max_position_embeddings"] == max_len


@pytest.mark.parametrize(("original", "max_len"), [(32768.0, 131072), (8192.5, 32770)])
def test_a_float_original_length_of_yarn_is_multiplied_as_vllm_multiplies_it(original, max_len):
    """vLLM: `derived_max_model_len = original; derived_max_model_len *= factor; int(...)`: 4 x 32,768.0 is
    131,072 and 4 x 8,192.5 is 32,770."""
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": original}
    assert fields_from_hf_config({**QWEN, "rope_scaling": rope}, "M")["max_position_embeddings"] == max_len


@pytest.mark.parametrize("original", ["32768", True, 0, -1.0, float("inf")])
def test_an_original_length_of_yarn_that_is_no_positive_number_is_still_refused(original):
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": original}
    with pytest.raises(KvsimError, match=r"^model config M: rope_scaling.original_max_position_embeddings=.*: a yarn "
                                         r"one needs it, must be a positive number$"):
        fields_from_hf_config({**QWEN, "rope_scaling": rope}, "M")


def test_architectures_given_as_one_name_is_read_as_a_list_of_it(tmp_path):
    """vLLM's registry (`_normalize_archs`) reads `"architectures": "Qwen2ForCausalLM"` as `["Qwen2ForCausalLM"]`."""
    config = {key: value for key, value in QWEN.items() if key != "model_type"}
    as_text = fields_from_hf_config({**config, "architectures": "Qwen2ForCausalLM"}, "M")
    assert as_text == fields_from_hf_config({**config, "architectures": ["Qwen2ForCausalLM"]}, "M")
    with pytest.raises(KvsimError, match=r"^model config M: model_type is missing and architectures='Qwen2' "):
        fields_from_hf_config({**config, "architectures": "Qwen2"}, "M")


def test_a_large_file_given_as_a_json_result_is_refused_after_a_bounded_read(tmp_path):
    """`check_output_file` read a bench's `--output` whole to see whether it was an earlier result: a 2 GiB file took
    2.6 GB of memory and 14 s. It reads at most `MAX_JSON_RESULT_BYTES` + 1 now (a result is kilobytes)."""
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(2**31)  # sparse: no disk used
    with pytest.raises(KvsimError, match=rf"^path='{re.escape(str(big))}': exists and is over 67,108,864 B, no "
                                         r"JSON result kvsim writes; kvsim only replaces"):
        check_output_file(big, frozenset({"a"}))
    assert big.stat().st_size == 2**31


@pytest.mark.parametrize("special", ["fifo", "/dev/zero"])
def test_a_fifo_or_a_device_given_as_a_json_result_is_refused_unread(tmp_path, special):
    path = Path(special) if special.startswith("/") else tmp_path / special
    if special == "fifo":
        os.mkfifo(path)  # opened for reading, it would wait for a writer
    with pytest.raises(KvsimError, match=r"': exists and is not a file; kvsim only replaces"):
        check_output_file(path, frozenset({"a"}))


def _bench_kernels(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_kernels.py"), *args], capture_output=True,
                          text=True, env=env, timeout=120)


# a result of bench_kernels.py's keys with one decode and one prefill point (the tables' two kinds of row)
KERNELS = {"benchmark": "paged_attention", "device": "cpu", "torch": "2", "triton": "3", "copy_bytes_per_s": 3e12,
           "bf16_peak_flops": 790e12, "heads": 32, "kv_heads": 8, "head_dim": 128, "dtype": "bfloat16",
           "results": [{"kind": "decode", "block_size": 16, "batch": 1, "context_len": 4096, "bytes": 2**24,
                        "paged_s": 1e-5, "sdpa_s": 2e-5},
                       {"kind": "prefill", "block_size": 16, "batch": 1, "query_len": 1024, "context_len": 1024,
                        "flops": 1e12, "paged_s": 1e-2, "sdpa_s": 2e-2}]}


@pytest.mark.parametrize("files", [{"kernels.md": "my notes\n"}, {"kernels.json": '{"a": 1}\n'},
                                   {"kernels.md": "my notes\n", "kernels.json": json.dumps(KERNELS)}])
def test_bench_kernels_refuses_an_output_dir_holding_files_it_did_not_write(tmp_path, files):
    """`bench_kernels.py --output-dir D` wrote D/kernels.json and D/kernels.md over whatever was there (after the
    whole GPU run); each must now be new or this bench's earlier result, checked before torch is imported."""
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    done = _bench_kernels("--output-dir", str(tmp_path))
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.splitlines()) == 1 and done.stderr.startswith("bench_kernels.py: error: --output")
    assert "kernels.md" in done.stderr if "kernels.md" in files and len(files) == 2 else "kernels.json" in done.stderr
    assert {path.name: path.read_text() for path in tmp_path.iterdir()} == files


def test_bench_kernels_replaces_its_own_earlier_results(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    bench = benchmark_script("bench_kernels")
    first = bench.write_outputs(tmp_path, KERNELS)
    assert first.startswith("Paged attention on cpu (torch 2, Triton 3)")
    bench.check_outputs(tmp_path)  # an earlier result: no exit
    again = {**KERNELS, "device": "gpu"}
    assert bench.write_outputs(tmp_path, again) == (tmp_path / "kernels.md").read_text() != first
    assert json.loads((tmp_path / "kernels.json").read_text()) == again
    assert sorted(path.name for path in tmp_path.iterdir()) == ["kernels.json", "kernels.md"]  # no temporary left
    umask = os.umask(0o022)
    os.umask(umask)  # both as open(..., "w") makes a new file: 0666 less the umask (kernels.md was 0600)
    assert {path.name: path.stat().st_mode & 0o777 for path in tmp_path.iterdir()} == dict.fromkeys(
        ("kernels.json", "kernels.md"), 0o666 & ~umask)


def test_bench_vidur_write_scenarios_refuses_a_folder_it_did_not_write_and_replaces_its_own(tmp_path, traces,
                                                                                           monkeypatch):
    """`bench_vidur.py --write-scenarios DIR` wrote DIR/NAME/scenario.yaml and three traces over a user's files;
    DIR is now new or this option's earlier output, written whole (its scenario names the trace where it ends up).
    The bench converts the Azure conversation trace of ../shared (`traces`: skips on a bare clone). The refusal
    runs the script as a process (its exit status and stderr); the runs that succeed call its `main` in this
    process with the same arguments (~1 CPU s of interpreter start each)."""
    if not (traces / "azure_llm_2023" / "AzureLLMInferenceTrace_conv.csv").is_file():
        pytest.skip("the traces folder holds no Azure 2023 conversation trace")
    args = ["--scenarios", "azure_conv", "--num-requests", "5"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    bench = [sys.executable, str(ROOT / "benchmarks" / "bench_vidur.py"), *args, "--write-scenarios"]
    (tmp_path / "mine" / "azure_conv").mkdir(parents=True)
    (tmp_path / "mine" / "azure_conv" / "scenario.yaml").write_text("my notes\n")
    done = subprocess.run([*bench, str(tmp_path / "mine")], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and done.stdout == "" and done.stderr == (
        f"bench_vidur.py: error: --write-scenarios='{tmp_path / 'mine'}': exists and has no .kvsim-output marker; kvsim only "
        "replaces output it wrote itself (choose a new path)\n")
    assert (tmp_path / "mine" / "azure_conv" / "scenario.yaml").read_text() == "my notes\n"
    script = benchmark_script("bench_vidur")

    def main(folder: str) -> None:  # `python bench_vidur.py ARGS --write-scenarios FOLDER`, returning: exit 0
        monkeypatch.setattr(sys, "argv", [*bench[1:], folder])
        script.main()

    for _ in range(2):  # new, then its own earlier output
        main(str(tmp_path / "out"))
    scenario = json.loads((tmp_path / "out" / "azure_conv" / "scenario.yaml").read_text())
    trace = Path(scenario["workload"]["trace"]["path"])
    assert trace == tmp_path / "out" / "azure_conv" / "kvsim_trace.csv" and len(trace.read_text().splitlines()) == 6
    # a folder given through one that does not exist is written where the OS puts it, and named so: the scenario
    # named `.../gone/../again/...`, a path no open() resolves while `gone` is missing
    monkeypatch.chdir(tmp_path)
    main("gone/../again")
    scenario = json.loads((tmp_path / "again" / "azure_conv" / "scenario.yaml").read_text())
    assert scenario["workload"]["trace"]["path"] == str(tmp_path / "again" / "azure_conv" / "kvsim_trace.csv")


def _trace(tmp_path: Path, reader: str, cell) -> Path:
    """A one-request trace of `reader`'s format whose prompt length is `cell` (text in a CSV, a JSON value)."""
    if reader == "lengths":
        (path := tmp_path / "t.csv").write_text(f"num_prefill_tokens,num_decode_tokens\n{cell},10\n")
    elif reader == "azure":
        (path := tmp_path / "t.csv").write_text(
            f"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,{cell},10\n")
    elif reader == "mooncake":
        row = {"timestamp": 0, "input_length": cell, "output_length": 10, "hash_ids": [1, 2]}
        (path := tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n")
    else:
        (path := tmp_path / "t.jsonl").write_text(json.dumps({"arrival_time_ns": 0, "input_toks": cell,
                                                             "output_toks": 10}) + "\n")
    return path


READERS = {"lengths": read_lengths, "azure": read_azure, "mooncake": read_mooncake,
           "sharegpt_tokens": read_sharegpt_tokens}


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("cell", [600, 600.0, "600", "600.0", "600.00", " 600 ", "+600"])
def test_a_token_count_of_an_integral_float_is_600_in_every_trace_format(tmp_path, reader, cell):
    """A JSON 600.0 was 600, a CSV's "600.0" refused as "not an integer": the same number, read two ways. Each
    is now the integer it is in every format, as the scenario's own integers are read (pydantic's lax int)."""
    if reader in ("lengths", "azure") and not isinstance(cell, str):
        cell = str(cell)  # a CSV cell is text
    assert READERS[reader](_trace(tmp_path, reader, cell))[0].prompt_len == 600


@pytest.mark.parametrize("reader", READERS)
@pytest.mark.parametrize("cell", ["600.5", "6e2", "6_00", "600.", "", 600.5, True, 1e400])
def test_a_token_count_that_is_no_integer_is_refused_in_every_trace_format(tmp_path, reader, cell):
    if reader in ("lengths", "azure") and not isinstance(cell, str):
        cell = json.dumps(cell)  # true, 600.5, Infinity: text in a CSV
    with pytest.raises(KvsimError, match=r":2: (num_prefill_tokens|ContextTokens)=.* is not an integer$"
                                         if reader in ("lengths", "azure") else
                                         r":1: (input_length|input_toks)=.* is not an integer$"):
        READERS[reader](_trace(tmp_path, reader, cell))


def _as_a_scheduler_starts_it() -> None:
    """A child with SIGTERM and SIGHUP handled by default and not blocked (the test process may have them
    otherwise)."""
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGHUP})


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_sigterm_is_handled_as_a_ctrl_c(tmp_path, signum, status):
    """SIGTERM (`kill PID`) killed `kvsim run` on the spot: exit 143 by the signal, no line, and the hidden
    temporary folder `.out.kvsim-PID-...` left beside the output; so did SIGHUP (the terminal closed), 129. Now
    each is a Ctrl-C of that status (128 + the signal): one line, the earlier output intact, no temporary left."""
    out = tmp_path / "out"
    assert subprocess.run([sys.executable, "-m", "kvsim", "run", "--set", "workload.num_requests=5", "-o", str(out)],
                          capture_output=True, timeout=120).returncode == 0
    before = sorted((p.name, p.read_bytes()) for p in out.iterdir())
    child = subprocess.Popen([sys.executable, "-m", "kvsim", "run", "--set", "workload.num_requests=1000000",
                              "--steps", "none", "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True, preexec_fn=_as_a_scheduler_starts_it)
    try:
        while not any((p / ".kvsim-output").exists() for p in tmp_path.glob(".out.kvsim-*")) and child.poll() is None:
            time.sleep(0.05)  # polling for the temporary folder's marker (the run is writing), not timing
        child.send_signal(signum)
        _, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    # 128 + signum: not death by SIGINT, which CPython's `python -m` dealt where a KeyboardInterrupt of that exact type
    # ended code a string `exec` ran (kvsim raises a subclass: `kvsim.cli.interrupts`, tidy30)
    assert child.returncode == status, (child.returncode, stderr)
    *progress, last = stderr.splitlines()
    assert last == f"kvsim: interrupted (kvsim run): {out} was not written; what was there before is intact"
    assert all(line.startswith("kvsim run: simulated ") for line in progress), stderr
    assert sorted((p.name, p.read_bytes()) for p in out.iterdir()) == before
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_sigterm_handled_or_ignored_by_someone_else_is_left_as_it_is(monkeypatch, signum, status):
    from kvsim.cli import interrupts

    monkeypatch.setattr(interrupts, "_signals", [])
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)
    previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        signal.signal(signum, signal.SIG_IGN)  # as `nohup` or a parent that ignores it leaves it
        interrupts.install()
        assert signal.getsignal(signum) is signal.SIG_IGN
        signal.signal(signum, signal.SIG_DFL)
        interrupts.install()
        assert signal.getsignal(signum) is interrupts._on_signal
        interrupts._signals.append(signum)
        assert interrupts._interrupt().kvsim_exit_status == status  # 128 + 15, 128 + 1
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


RUN = ["run", "--set", "workload.num_requests=20", "--set", "steps=none", "--format", "json"]
PCIE = '{"kind": "pcie", "bandwidth_bytes_per_s": 64.0e9, "latency_s": 1.0e-5}'
EAGLE = {"method": "eagle", "num_speculative_tokens": 3, "acceptance_rates": 0.5}


def _run(tmp_path: Path, name: str, *sets: str):
    from typer.testing import CliRunner

    from kvsim.cli import app

    args = [item for value in sets for item in ("--set", value)]
    result = CliRunner().invoke(app, [*RUN, *args, "-o", str(tmp_path / name)], prog_name="kvsim")
    assert result.exit_code == 0, (result.output, result.exception)
    return result.stderr.splitlines(), (tmp_path / name / "requests.csv").read_text()


def test_a_gpu_link_no_collective_crosses_is_warned_of_and_changes_nothing(tmp_path):
    """`gpu_link` prices tensor-parallel all-reduces (and an MoE's exchange across a data-parallel group): with
    tensor_parallel_size 1 a dense model crosses no link, and the setting ran without a word."""
    warned, requests = _run(tmp_path, "link", f"gpu_link={PCIE}")
    assert warned == ["kvsim: warning: gpu_link (kind pcie) is unread: tensor_parallel_size=1 runs no collective "
                      "over it"]
    assert requests == _run(tmp_path, "plain")[1]
    assert _run(tmp_path, "tp2", f"gpu_link={PCIE}", "engine.tensor_parallel_size=2")[0] == []


def test_a_gpu_link_an_moe_crosses_across_its_data_parallel_group_is_not_warned_of(tmp_path):
    moe = ["model=qwen3-30b-a3b", f"gpu_link={PCIE}"]
    assert _run(tmp_path, "dp1", *moe)[0] == [
        "kvsim: warning: gpu_link (kind pcie) is unread: tensor_ and data_parallel_size=1 run no collective over it"]
    assert _run(tmp_path, "dp2", *moe, "engine.data_parallel_size=2")[0] == []


def test_an_eagle_head_named_by_model_is_warned_of_as_unread_and_changes_nothing(tmp_path):
    """vLLM loads the EAGLE head `model` names; kvsim prices one decoder layer of the target's shape whatever it
    names, so the name is read by nothing (documented, but said by no run)."""
    warned, requests = _run(tmp_path, "named", f"engine.speculative_config={json.dumps({**EAGLE, 'model': 'a/head'})}")
    assert warned == ["kvsim: warning: engine.speculative_config.model='a/head' is unread: the eagle head is priced "
                      "as one decoder layer of the target's shape"]
    assert requests == _run(tmp_path, "unnamed", f"engine.speculative_config={json.dumps(EAGLE)}")[1]


def _measured_run(tmp_path: Path, **engine_kwargs) -> Path:
    from test_validate import _patch_json, write_run  # tests/ is on sys.path

    run = write_run(tmp_path)
    meta = json.loads((run / "vllm" / "meta.json").read_text())
    _patch_json(run / "vllm" / "meta.json", engine_kwargs={**meta["engine_kwargs"], **engine_kwargs})
    return run


def test_a_measured_runs_engine_arguments_kvsim_models_are_replayed_not_dropped(tmp_path):
    """A meta.json's `num_gpu_blocks_override`, `kv_cache_memory_bytes`, `scheduling_policy` and
    `disable_hybrid_kv_cache_manager` (vLLM's engine arguments, kvsim's engine fields of the same names) were
    dropped without a word: the replay ran on the GPU's whole pool, first come first served."""
    import yaml
    from typer.testing import CliRunner

    from kvsim.cli import app

    run = _measured_run(tmp_path, num_gpu_blocks_override=9000, scheduling_policy="priority",
                        disable_hybrid_kv_cache_manager=True, enable_chunked_prefill=True)
    result = CliRunner().invoke(app, ["validate", str(run), "--gpu", "h100-80gb", "-o", str(tmp_path / "o"),
                                      "--no-figures"])
    assert result.exit_code == 0, (result.output, result.exception)
    engine = yaml.safe_load((tmp_path / "o" / "sim" / "scenario.yaml").read_text())["engine"]
    assert (engine["num_gpu_blocks_override"], engine["scheduling_policy"]) == (9000, "priority")
    assert engine["disable_hybrid_kv_cache_manager"] is True


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scheduling_policy": 5}, "engine_kwargs.scheduling_policy=5 is not a string"),
    ({"num_gpu_blocks_override": "9000"}, "engine_kwargs.num_gpu_blocks_override='9000' is not an integer"),
    ({"disable_hybrid_kv_cache_manager": "true"}, "engine_kwargs.disable_hybrid_kv_cache_manager='true' is not true "
                                                  "or false"),
])
def test_a_measured_runs_engine_argument_of_the_wrong_json_type_is_named(tmp_path, kwargs, message):
    run = _measured_run(tmp_path, **kwargs)
    assert one_line_exit_2(["validate", str(run), "--gpu", "h100-80gb", "-o", str(tmp_path / "o")]) == (
        f"{run / 'vllm' / 'meta.json'}: {message}")
    assert not (tmp_path / "o").exists()


def test_a_large_file_named_as_the_output_marker_is_read_only_in_part(tmp_path):
    """`-o FOLDER` reads FOLDER/.kvsim-output to tell kvsim's own output: a stranger's 1 GiB file of that name was
    read whole (2 GB of memory, 10 s) before the folder was refused."""
    from kvsim.results.output_checks import MARKER_NAME, check_output_dir

    (tmp_path / "mine").mkdir()
    with (tmp_path / "mine" / MARKER_NAME).open("wb") as f:
        f.truncate(2**30)
    with pytest.raises(KvsimError, match=r"': exists and has no .kvsim-output marker; kvsim only replaces"):
        check_output_dir(tmp_path / "mine", "run")


@pytest.mark.parametrize(("make", "problem"), [(Path.mkdir, "is a directory, not a JSON file"),
                                               (os.mkfifo, "not a regular file (a FIFO)")])
def test_a_measured_runs_meta_json_that_is_no_file_is_named_as_such(tmp_path, make, problem):
    """A folder or a FIFO at vllm/meta.json was "no vllm/meta.json in this folder", of a folder that has one."""
    run = _measured_run(tmp_path)
    (run / "vllm" / "meta.json").unlink()
    make(run / "vllm" / "meta.json")
    assert one_line_exit_2(["validate", str(run), "--gpu", "h100-80gb", "-o", str(tmp_path / "o")]) == (
        f"measured={str(run)!r}: vllm/meta.json: {problem}")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize(("cell", "lengths"), [([2.0, 3], (2, 3)), ("2.0 3", (2, 3)), ("[2, 3.00]", (2, 3))])
def test_acceptance_lengths_of_integral_floats_are_read_as_the_token_counts_are(tmp_path, cell, lengths):
    """An acceptance column's `[2.0, 3]` (JSON) and `"2.0 3"` (a cell) were refused where a token count or a
    priority of 2.0 is 2: the same number, read two ways in one row."""
    from kvsim.workload.traces import TraceColumns

    row = {"timestamp": 0, "input_length": 16, "output_length": 4, "hash_ids": [1], "accepted": cell}
    (path := tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n")
    assert read_mooncake(path, TraceColumns(acceptance="accepted"))[0].acceptance_lengths == lengths
    (path := tmp_path / "t.csv").write_text(f'num_prefill_tokens,num_decode_tokens,accepted\n16,4,"{cell}"\n')
    if isinstance(cell, str):
        assert read_lengths(path, TraceColumns(acceptance="accepted"))[0].acceptance_lengths == lengths


@pytest.mark.parametrize("cell", [[2.5], "2.5", [True], "0", "2e0"])
def test_acceptance_lengths_that_are_no_integers_of_at_least_1_are_still_refused(tmp_path, cell):
    from kvsim.workload.traces import TraceColumns

    row = {"timestamp": 0, "input_length": 16, "output_length": 4, "hash_ids": [1], "accepted": cell}
    (path := tmp_path / "t.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(KvsimError, match=r"t.jsonl:1: acceptance column accepted: .* is not an acceptance length"):
        read_mooncake(path, TraceColumns(acceptance="accepted"))


def test_a_measured_run_that_drafted_speculatively_is_not_replayed_without_its_drafts(tmp_path):
    """A meta.json's `engine_kwargs.speculative_config` was dropped: the run was replayed as one without speculative
    decoding and its errors tabulated against it. vLLM records no acceptance model, so the replay needs one given."""
    from typer.testing import CliRunner

    from kvsim.cli import app

    spec = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}
    run = _measured_run(tmp_path, speculative_config=spec)
    assert one_line_exit_2(["validate", str(run), "--gpu", "h100-80gb", "-o", str(tmp_path / "o")]) == (
        "measured run case: engine_kwargs.speculative_config={'method': 'ngram', 'num_speculative_tokens': 3, "
        "'prompt_...: the run drafted speculatively, and vLLM records no acceptance model to replay it with; give one "
        "with --set engine.speculative_config=...")
    assert not (tmp_path / "o").exists()
    given = '{"method": "ngram", "num_speculative_tokens": 3, "acceptance_rates": 0.5}'
    result = CliRunner().invoke(app, ["validate", str(run), "--gpu", "h100-80gb", "--set",
                                      f"engine.speculative_config={given}", "-o", str(tmp_path / "o"), "--no-figures"])
    assert result.exit_code == 0, (result.output, result.exception)
    run = _measured_run(tmp_path / "2", speculative_config="ngram")
    assert one_line_exit_2(["validate", str(run), "--gpu", "h100-80gb", "-o", str(tmp_path / "o2")]) == (
        f"{run / 'vllm' / 'meta.json'}: engine_kwargs.speculative_config='ngram' is not an object")

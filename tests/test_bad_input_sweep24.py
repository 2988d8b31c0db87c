"""Bad input found by the twenty-fourth sweep. Each is refused (the CLI: exit 2, one line naming the field and the
value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: an SLO class of more digits than `int()` converts said Python's conversion-limit message (`parse_slo_key`);
`window_evidence` on a table missing a column raised a bare KeyError; `probe_passes`, `why_failed` and
`missed_within_noise` judged the verdict before the SLO (an unknown key False on an overloaded run, a ValueError on
a stable one; a limit of 0 divided by zero); a measured request_id that is not text was paired by position; the
trace readers refused a path given as text (AttributeError); a 100 MB scenario YAML parsed for ~41 s before its
error; KVSIM_KERNELS_COMMIT spanning lines was written into a profile's metadata; a Vidur mlp.csv or a bundle CSV
with a header alone was imported (or told as a TP mismatch); files were read and written in the locale's encoding
and stdout refused what it could not encode (tracebacks under an ASCII locale); `calibrate` planned an MLA model's
grid as MHA's; COLUMNS=0 printed nothing and a superscript COLUMNS was a traceback; a blank `--source-*` flag of
`import-profile` was ignored or recorded blank.
"""

from __future__ import annotations

import re

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path

from kvsim.model.errors import KvsimError


def test_an_slo_class_of_more_digits_than_int_converts_is_refused_as_any_other_class(tmp_path):
    """`int()` refuses text of more than 4,300 digits (`sys.get_int_max_str_digits()`) with its own advice to raise
    the limit: the key's line said that, not what a class is. 4,301 ones is no priority vLLM takes (an int64)."""
    from kvsim.planning.slo import parse_slo_key

    key = "ttft_s.p90@" + "1" * 4301
    # a KvsimError (bad42: a notebook's bad SLO was a bare ValueError) cuts the 4,301 digits as it cuts any long number
    with pytest.raises(KvsimError, match=r"the class after '@' must be an integer request priority, got '1+\.\.\.'$"):
        parse_slo_key(key)
    out = tmp_path / "plan"
    line = one_line_exit_2(["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", f"{key}=2", "-o", str(out)])
    assert "the class after '@' must be an integer request priority" in line and "limit" not in line
    assert not out.exists()
    assert parse_slo_key("ttft_s.p90@-" + "9" * 18)[2] == -(10**18 - 1)  # a long class within the limit is read


def _requests(num_requests: int = 100):
    """A requests table of `num_requests` one-second services arriving 1 s apart (a window opens: ≥ 2 servable)."""
    import numpy as np

    arrival = np.arange(num_requests, dtype=float)
    return {"request_id": np.arange(num_requests), "arrival_s": arrival, "first_scheduled_s": arrival,
            "first_token_s": arrival + 0.5, "finish_s": arrival + 1.0, "status": ["finished"] * num_requests,
            "output_tokens": np.full(num_requests, 10), "num_samples": np.ones(num_requests, int),
            "replica": np.zeros(num_requests, int), "ttft_s": np.full(num_requests, 0.5),
            "tpot_s": np.full(num_requests, 0.05), "e2e_s": np.ones(num_requests), "queue_s": np.zeros(num_requests)}


@pytest.mark.parametrize(("drop", "transfers", "message"), [
    ("status", None, "requests: no column 'status'; expected a run's requests table (RunResult.requests)"),
    ("ttft_s", None, "requests: no column 'ttft_s'"),
    ("num_samples", None, "requests: no column 'num_samples'"),
    ("replica", {"request_id": [0], "handoff_s": [0.2], "prefill_replica": [0]}, "requests: no column 'replica'"),
    (None, {"request_id": [0], "handoff_s": [0.2]},
     "transfers: no column 'prefill_replica'; expected a run's transfers table (RunResult.tables['transfers'])"),
])
def test_window_evidence_names_a_missing_column(drop, transfers, message):
    """`window_evidence` on a table without a column it reads raised a bare KeyError (its column name alone)."""
    from kvsim.model.errors import KvsimError
    from kvsim.planning.window import STABLE, window_evidence

    table = _requests()
    with pytest.raises(KvsimError, match="^" + re.escape(message)):
        window_evidence({k: v for k, v in table.items() if k != drop}, transfers=transfers)
    # the whole table is judged: one-second services 1 s apart, nothing waits; the window [19.8, 89.1) s (20 % and
    # 10 % of the 99 s span left out) holds 70 arrivals, over the 50 and 10 service times a verdict needs
    assert window_evidence(table)["verdict"] == STABLE


@pytest.mark.parametrize(("slo", "message"), [
    ({"ttft.p90": 2.0}, r"^'ttft\.p90': expected METRIC\.STAT or METRIC\.STAT@PRIORITY"),
    ({"ttft_s.p90@x": 2.0}, r"^'ttft_s\.p90@x': the class after '@' must be an integer"),
    ({90: 2.0}, r"^90: expected METRIC\.STAT or METRIC\.STAT@PRIORITY, a string$"),
    ({"ttft_s.p90": 0}, r"^ttft_s\.p90=0: must be a positive, finite number of seconds$"),
    ({"ttft_s.p90": float("nan")}, r"^ttft_s\.p90=nan: must be"),
    ({"ttft_s.p90": "2"}, r"^ttft_s\.p90='2': must be"),
])
@pytest.mark.parametrize("verdict", ["stable", "overloaded", "stalled"])
def test_every_slo_reader_refuses_a_bad_slo_whatever_the_verdict(slo, message, verdict):
    """`probe_passes` answered False for an unknown key on an unstable run and raised on a stable one (as
    `slo_values` and `headroom` always did); `why_failed` said 'is overloaded'; a limit of 0 divided by zero."""
    from kvsim.planning.slo import headroom, missed_within_noise, probe_passes, slo_values, why_failed
    from kvsim.planning.window import stalled_evidence

    evidence = {**stalled_evidence(10, "stall"), "verdict": verdict}
    for reader in (probe_passes, slo_values, headroom, missed_within_noise, why_failed):
        with pytest.raises(ValueError, match=message):
            reader(evidence, slo)


def test_slo_readers_judge_a_good_slo_by_the_verdict_and_the_window():
    """No request measured (a stalled run's evidence): every percentile is missing, so every SLO is missed."""
    from kvsim.planning.slo import headroom, probe_passes, why_failed
    from kvsim.planning.window import stalled_evidence

    evidence = stalled_evidence(10, "stall")
    assert not probe_passes(evidence, {"ttft_s.p90@1": 2}) and why_failed(evidence, {"ttft_s.p90": 2}) == "is stalled"
    assert headroom(evidence, {"e2e_s.mean": 2.0}) == -float("inf")
    assert why_failed({**evidence, "verdict": "stable"}, {"ttft_s.p90": 2}) == "misses ttft_s.p90"


@pytest.mark.parametrize(("request_id", "shown_as"), [(None, "None"), (1.0, "1.0"), (True, "True"), (1, "1"),
                                                      (["bench-1"], "['bench-1']")])
def test_a_measured_request_id_that_is_not_text_is_refused(tmp_path, request_id, shown_as):
    """vLLM's request ids are text (`bench-N` from its benchmark); `str()` of null, 1.0 or true has no trailing
    number, so the row was paired with the workload line at its position without a word (1 happened to read)."""
    import json

    from test_validate import write_run

    out = tmp_path / "o"
    run = write_run(tmp_path)
    path = run / "vllm" / "requests.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[1]["request_id"] = request_id
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    line = one_line_exit_2(["validate", str(run), "--gpu", "h100-80gb", "-o", str(out)])
    assert line == (f"{path}:2: request_id={shown_as}: expected text, vLLM's request id (its benchmark's 'bench-N' "
                    "pairs the request with workload line N + 1)") and not out.exists()


@pytest.mark.parametrize(("reader", "text"), [
    ("read_mooncake", '{"timestamp": 1000, "input_length": 600, "output_length": 5, "hash_ids": [7, 8]}\n'),
    ("read_sharegpt_tokens", '{"arrival_time_ns": 1000000000, "input_toks": 600, "output_toks": 5}\n'),
    ("read_azure", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03.9799600,600,5\n"),
    ("read_lengths", "num_prefill_tokens,num_decode_tokens\n600,5\n"),
    ("iter_jsonl", '{"input_length": 600}\n'),
])
def test_a_trace_reader_takes_its_path_as_text(tmp_path, reader, text):
    """`read_mooncake("trace.jsonl")` (a notebook's way) raised AttributeError: 'str' object has no attribute
    'name' deep in the file opener; a `Path` and its text read the same."""
    from pathlib import Path

    from kvsim.workload import traces

    path = tmp_path / "t.jsonl"
    path.write_text(text)
    read = getattr(traces, reader)
    assert list(read(str(path))) == list(read(path)) and list(read(path))
    if reader == "read_mooncake":  # 600 tokens: one 512-token block and an 88-token rest, as the README of the trace
        assert read(str(path))[0].segments == ((("mooncake", 7), 512), (("mooncake", 8), 88))
    written = tmp_path / "w.jsonl"
    traces.write_sharegpt_tokens([traces.TraceRecord(0.5, 600, 5)], str(written))
    assert traces.read_sharegpt_tokens(Path(written)) == [traces.TraceRecord(0.5, 600, 5)]


def _padded(path, text: str, size_bytes: int):
    """`text` and a YAML comment that brings the file to `size_bytes` bytes."""
    path.write_text(text + "#" + "x" * (size_bytes - len(text.encode()) - 2) + "\n")
    assert path.stat().st_size == size_bytes
    return path


def test_a_scenario_file_over_a_mebibyte_is_refused_before_it_is_parsed(tmp_path):
    """A 100 MB file named as the scenario (a trace, a log) ran ~41 s in PyYAML before its error; 2**20 bytes is
    80 times the largest YAML kvsim ships (12 KB). One byte over is refused naming the file and its size; the
    limit itself is read."""
    from kvsim.model.yaml_io import MAX_YAML_BYTES, check_yaml_size

    assert MAX_YAML_BYTES == 1_048_576
    text = "workload:\n  num_requests: 3\n"
    big = _padded(tmp_path / "big.yaml", text, 1_048_577)
    out = tmp_path / "o"
    assert one_line_exit_2(["run", str(big), "-o", str(out)]) == (
        f"scenario {big}: 1,048,577 bytes, more than the 1,048,576 kvsim reads in a YAML or JSON settings file "
        "(is it the file you meant?)") and not out.exists()
    assert check_yaml_size(_padded(tmp_path / "ok.yaml", text, 1_048_576), "scenario") is None  # (parsing: 0.5 s)


def test_a_plan_spec_and_a_model_config_over_a_mebibyte_are_refused(tmp_path):
    """The same cap on the other settings files read through PyYAML: `plan --spec` and a model's config.json."""
    big = _padded(tmp_path / "spec.yaml", "slo: {ttft_s.p90: 2}\n", 1_048_577)
    line = one_line_exit_2(["plan", "--spec", str(big), "--gpu", "h100-80gb", "-o", str(tmp_path / "p")])
    assert line.startswith(f"spec {big}: 1,048,577 bytes, more than")
    config = tmp_path / "m" / "config.json"
    config.parent.mkdir()
    _padded(config, "{}\n", 1_048_577)
    line = one_line_exit_2(["capacity", "--model", str(config.parent), "--gpu", "h100-80gb"])
    assert ": 1,048,577 bytes, more than the 1,048,576" in line and str(config) in line


@pytest.mark.parametrize("commit", ["abc123\nkind,op", "abc\rkind"])
def test_calibrate_refuses_a_kernels_commit_that_spans_lines_before_measuring(tmp_path, monkeypatch, commit):
    """KVSIM_KERNELS_COMMIT is recorded as the profile's `# kernels_commit:` line (`kernels.calibrate`): one that
    spans lines wrote a profile whose next line `read_native` takes for a row, found only after the whole
    calibration, as sweep 22 found of `--gpu`. A one-line commit passes to the dry run's grid."""
    from kvsim.model.errors import shown

    monkeypatch.setenv("KVSIM_KERNELS_COMMIT", commit)
    out = tmp_path / "p.csv"
    assert one_line_exit_2(["calibrate", "--gpu", "h200", "--dry-run", "-o", str(out)]) == (
        f"KVSIM_KERNELS_COMMIT={shown(commit)}: spans lines; a profile CSV keeps each metadata value on one line")
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("KVSIM_KERNELS_COMMIT", "abc123")
    from typer.testing import CliRunner

    from kvsim.cli import app

    assert CliRunner().invoke(app, ["calibrate", "--gpu", "h200", "--dry-run", "--quick"]).exit_code == 0


def test_import_profile_of_a_vidur_mlp_csv_with_a_header_alone_says_it_has_no_rows(tmp_path):
    """A Vidur mlp.csv cut after its header said 'measured at num_tensor_parallel_workers , not
    tensor_parallel_size=1': the TP values of no rows, an empty list."""
    folder = tmp_path / "compute" / "h100" / "meta-llama" / "Llama-2-7b-hf"
    folder.mkdir(parents=True)
    mlp = folder / "mlp.csv"
    mlp.write_text("time_stats.emb.median,num_tokens,num_tensor_parallel_workers,n_embd,n_head\n")
    out = tmp_path / "p.csv"
    assert one_line_exit_2(["import-profile", str(mlp), "-o", str(out), "--model", "llama-2-7b", "--gpu",
                            "h100-80gb"]) == f"profile {mlp}: no rows (the table has a header but no rows)"
    assert not out.exists()


@pytest.mark.parametrize("name", ["dense.csv", "per_sequence.csv", "attention.csv"])
def test_import_profile_of_a_bundle_csv_with_a_header_alone_says_it_has_no_rows(tmp_path, name):
    """A bundle's dense.csv cut after its header was imported as a profile without linear layers (exit 0: they fell
    back to the roofline); an empty file (no header) was already refused, an absent optional one is not read."""
    from test_profiles import write_bundle

    bundle = write_bundle(tmp_path / "bf16")
    csv = bundle / "tp1" / name
    csv.write_text(csv.read_text().splitlines()[0] + "\n")
    out = tmp_path / "p.csv"
    assert one_line_exit_2(["import-profile", str(bundle), "-o", str(out), "--model", "llama-3.1-8b", "--gpu",
                            "rtx-pro-6000"]) == f"profile {csv}: no rows (the table has a header but no rows)"
    assert not out.exists()


def test_stdout_in_an_ascii_locale_escapes_a_name_it_cannot_encode(tmp_path, monkeypatch):
    """`PYTHONIOENCODING=ascii kvsim capacity --gpu gpu-é.yaml` (or LC_ALL=C with PYTHONUTF8=0) printed its table,
    then ended with a UnicodeEncodeError traceback, exit 1, on the GPU's name: Python's stdout refuses what its
    encoding lacks, where its stderr escapes it. The CLI's stdout escapes it as stderr does."""
    import io
    import sys

    from kvsim.cli import app
    from kvsim.cli.terminal import escape_unencodable_output

    gpu = tmp_path / "gpu-é.yaml"
    gpu.write_text("memory_bytes: 80GiB\nhbm_bandwidth_bytes_per_s: 3.35e12\nfp16_flops: 989e12\n"
                   "host_link_bandwidth_bytes_per_s: 64e9\n", encoding="utf-8")
    buffer = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(buffer, encoding="ascii"))
    escape_unencodable_output()
    app(["capacity", "--gpu", str(gpu), "--context-lengths", "1024"], standalone_mode=False)
    sys.stdout.flush()
    assert "llama-3.1-8b on gpu-\\xe9 " in buffer.getvalue().decode("ascii")
    # a C locale's stdout (surrogateescape) writes the bytes of a name it could not decode back as they were
    c_locale = io.BytesIO()
    monkeypatch.setattr(sys, "stdout", io.TextIOWrapper(c_locale, encoding="ascii", errors="surrogateescape"))
    escape_unencodable_output()
    print("gpu-\udcc3\udca9 gpu-\xe9", end="")
    sys.stdout.flush()
    assert c_locale.getvalue() == b"gpu-\xc3\xa9 gpu-\\xe9"
    kept = io.TextIOWrapper(io.BytesIO(), encoding="ascii", errors="replace")  # a choice of the user's is kept
    monkeypatch.setattr(sys, "stdout", kept)
    escape_unencodable_output()
    assert sys.stdout.errors == "replace"


def test_kvsim_reads_its_files_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    """Files were read in the locale's encoding: under an ASCII one (LC_ALL=C with PYTHONUTF8=0) every command ended
    in a UnicodeDecodeError traceback reading gpus.yaml (a '·' in a comment), and a UTF-8 scenario naming `café` was
    "not UTF-8 text"; a Latin-1 locale read it as `cafÃ©`. `Path.read_text` is made to read as such a locale does."""
    from pathlib import Path

    from kvsim.latency.efficiency import _fitted
    from kvsim.model.config import _gpu_presets
    from kvsim.planning.cost import _price_table
    from kvsim.validation.recorded import recorded_settings
    from kvsim.workload.scenario import load_scenario

    read_text = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, encoding=None, errors=None: read_text(
        self, encoding=encoding or "ascii", errors=errors))
    assert "h100-80gb" in _gpu_presets.__wrapped__() and _price_table.__wrapped__() and _fitted.__wrapped__()
    scenario = tmp_path / "s.yaml"
    scenario.write_bytes("name: café\nworkload: {num_requests: 2, prompt_len: {dist: fixed, value: 8}, output_len: {dist: fixed, value: 2}}\n".encode())
    assert load_scenario(scenario).name == "café"
    meta = tmp_path / "meta.json"  # vLLM's bench JSON, as `validate` reads the settings it recorded
    meta.write_bytes('{"gpu": "H100 – SXM"}'.encode())
    assert recorded_settings(meta) == {"gpu": "H100 – SXM"}  # it read {} (the decode failed without a word)


def test_kvsim_writes_its_files_as_utf8_whatever_the_locale(tmp_path, monkeypatch):
    """Files were written in the locale's encoding: under an ASCII or Latin-1 one a profile recording a GPU named
    with an en dash, or a report's '≤', ended in a UnicodeEncodeError traceback. `Path.open` and `Path.write_text`
    are made to write as an ASCII locale does; the profile reads back as written, in UTF-8."""
    from pathlib import Path

    from kvsim.latency.profiles import Profile
    from kvsim.latency.profiles.native import read_native, write_native

    path_open, write_text = Path.open, Path.write_text
    monkeypatch.setattr(Path, "open", lambda self, mode="r", buffering=-1, encoding=None, errors=None, newline=None:
                        path_open(self, mode, buffering, None if "b" in mode else encoding or "ascii", errors, newline))
    monkeypatch.setattr(Path, "write_text", lambda self, data, encoding=None, errors=None, newline=None: write_text(
        self, data, encoding or "ascii", errors, newline))
    out = tmp_path / "p.csv"
    write_native(Profile("x", {"gpu": "RTX PRO 6000 – Blackwell"}, [{"kind": "copy", "time_s": "1e-3", "bytes": "8"}]),
                 out)
    assert "# gpu: RTX PRO 6000 – Blackwell\n" in out.read_bytes().decode("utf-8")
    assert read_native(out).meta["gpu"] == "RTX PRO 6000 – Blackwell"


@pytest.mark.parametrize("model", ["deepseek-v3", "deepseek-v2-lite"])
def test_calibrate_refuses_an_mla_model(tmp_path, model):
    """DeepSeek's attention caches one latent per token (kv_lora_rank 512 + qk_rope_head_dim 64, its config.json),
    but `calibrate --model deepseek-v3` planned the kernel over 128 K/V heads of 7168 / 128 = 56 dims and GEMMs of
    a plain q/k/v projection: a profile whose rows match the model's recorded shapes, so a calibrated run would
    have priced MLA's attention as MHA's (about 25 times the KV bytes a decode reads)."""
    line = one_line_exit_2(["calibrate", "--gpu", "h200", "--model", model, "--dry-run", "-o", str(tmp_path / "p.csv")])
    assert line.startswith(f"--model='{model}': {model} caches MLA's latent") and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("name", "value"), [("COLUMNS", "0"), ("COLUMNS", "00"), ("COLUMNS", "²"), ("LINES", "²"),
                                             ("COLUMNS", "1" * 4301)])
def test_a_terminal_size_rich_misreads_is_ignored(monkeypatch, name, value):
    """rich reads COLUMNS and LINES with `int()` once `str.isdigit` passes them: COLUMNS=0 (fish exports it while
    reading its config) made a console 0 characters wide, so `kvsim capacity` printed nothing, exit 0; a
    superscript two was a ValueError traceback. Dropped, rich takes the terminal's size or 80 by 25."""
    import os

    from typer.testing import CliRunner

    from kvsim.cli import app
    from kvsim.cli.terminal import usable_terminal_size

    monkeypatch.setenv(name, value)
    monkeypatch.setenv("LINES" if name == "COLUMNS" else "COLUMNS", "100")  # a usable one is kept
    usable_terminal_size()
    assert name not in os.environ and os.environ["LINES" if name == "COLUMNS" else "COLUMNS"] == "100"
    result = CliRunner().invoke(app, ["capacity", "--context-lengths", "1024"])
    assert result.exit_code == 0 and "context_len" in result.stdout and "1,024" in result.stdout


@pytest.mark.parametrize(("flag", "value", "key"), [("--source-licence", " ", "source_licence"),
                                                    ("--source-repository", "", "source_repository"),
                                                    ("--source-commit", "\t", "source_commit")])
def test_import_profile_refuses_a_blank_source_field(tmp_path, flag, value, key):
    """`--source-repository ''` was ignored without a word (the format's origin recorded), `--source-licence ' '`
    recorded as a blank licence: the profile's provenance is what these lines say."""
    from test_profiles import write_bundle

    bundle = write_bundle(tmp_path / "bf16")
    out = tmp_path / "p.csv"
    argv = ["import-profile", str(bundle), "-o", str(out), "--model", "llama-3.1-8b", "--gpu", "rtx-pro-6000"]
    assert one_line_exit_2([*argv, flag, value]) == (
        f"{key}={value!r}: is empty: give the source's {key.removeprefix('source_')} or leave it out")
    assert not out.exists()
    from typer.testing import CliRunner

    from kvsim.cli import app

    good = "5daddb2" if flag == "--source-commit" else "MIT"  # a commit is hex digits (tests/test_tidy31.py)
    assert CliRunner().invoke(app, [*argv, flag, good]).exit_code == 0
    assert f"# {key}: {good}\n" in out.read_text()

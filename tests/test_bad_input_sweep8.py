"""Bad input found by the eighth sweep, in the files kvsim reads (traces, measured runs, profiles): each
exits 2 with one line naming the file, the row or field and the value, and writes nothing, never a hang, a
misleading error or a value read as another."""

import json

import pytest
from conftest import one_line_exit_2
from typer.testing import CliRunner

from kvsim.cli import app

runner = CliRunner()
SERVEGEN_PMF = "{100: 0.5, 200: 0.5}"


def _servegen(tmp_path, trace: str, inputs: str = SERVEGEN_PMF, window: str = "0") -> list[str]:
    """A one-client ServeGen folder `sg/` (its trace rows `trace`, one length window) and the argv running it."""
    (tmp_path / "sg").mkdir()
    (tmp_path / "sg" / "chunk-0-trace.csv").write_text(trace)
    (tmp_path / "sg" / "chunk-0-dataset.json").write_text(json.dumps(
        {window: {"input_tokens": inputs, "output_tokens": "{10: 1.0}"}}))
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: servegen, path: sg}}\nsteps: none\n")
    return ["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]


@pytest.mark.parametrize(("row", "message"), [
    ("0,nan,1", "rate='nan' is not a finite number >= 0"),
    ("0,inf,1", "rate='inf' is not a finite number >= 0"),
    ("0,1,nan", "cv='nan' is not a finite number >= 0"),
    ("nan,1,1", "window='nan' is not a finite number"),
    ("0,-1,1", "rate='-1' is not a finite number >= 0"),
    ("0,1,-2", "cv='-2' is not a finite number >= 0"),
    ("0,x,1", "rate='x' is not a number"),
    ("0,1", "expected window,rate,cv,... (got '0,1')"),
    ("0,1e9,1", "rate='1e9': the clients' rates would draw about 600,000,000,000 requests over [start_s, "
                "start_s + duration_s), more than kvsim samples (10,000,000); is it requests per second?"),
], ids=["rate-nan", "rate-inf", "cv-nan", "window-nan", "rate-negative", "cv-negative", "rate-text", "short",
        "rate-huge"])
def test_a_servegen_window_that_cannot_be_sampled_is_refused(tmp_path, row, message):
    """A NaN or infinite rate, CV or window start drew arrival gaps that never moved the clock past the
    window's end: `kvsim run` never ended (a hang, not an error). A rate of 1e9 req/s drew 6e11 requests one
    Python step at a time; a negative rate or CV was read as no traffic, or as a CV of 0.001."""
    assert one_line_exit_2(_servegen(tmp_path, f"{row}\n")) == f"{tmp_path}/sg/chunk-0-trace.csv:1: {message}"
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("inputs", "message"), [
    ("{100: -0.5, 200: 1.5}", "window 0 input_tokens: 100 tokens has probability -0.5, not a finite number >= 0"),
    ("{100: 0, 200: 0}", "window 0 input_tokens: every probability is 0"),
    ("{-100: 1}", "window 0 input_tokens: -100 tokens is not a whole number of tokens >= 1"),
    ("{10.7: 1}", "window 0 input_tokens: 10.7 tokens is not a whole number of tokens >= 1"),
    ("[1, 2]", "window 0 input_tokens='[1, 2]' is not a dict of tokens to probabilities"),
    ("[" * 100_000 + "]" * 100_000, "window 0 input_tokens='" + "[" * 56),
], ids=["negative-probability", "all-zero", "negative-length", "fractional-length", "a-list", "nested"])
def test_a_servegen_length_distribution_that_is_not_one_is_refused(tmp_path, inputs, message):
    """Each ran without a word: a negative probability made the CDF run backwards and all-zero ones a NaN CDF
    (every draw the largest length), a length of -100 tokens was drawn as 1 and 10.7 as 10."""
    error = one_line_exit_2(_servegen(tmp_path, "0,1,1\n", inputs))
    assert error.startswith(f"{tmp_path}/sg/chunk-0-dataset.json: {message}"), error
    assert not (tmp_path / "out").exists()


def test_a_servegen_window_key_that_is_not_a_time_is_refused(tmp_path):
    assert one_line_exit_2(_servegen(tmp_path, "0,1,1\n", window="nan")) == (
        f"{tmp_path}/sg/chunk-0-dataset.json: window 'nan' is not a finite start time (s)")


def test_a_servegen_model_that_is_well_formed_still_runs(tmp_path):
    argv = _servegen(tmp_path, "0,0,0,,0,0\n600,1.5,,Gamma,1,1\n")
    (tmp_path / "s.yaml").write_text("workload: {num_requests: 5, arrival: {process: trace}, "
                                     "trace: {format: servegen, path: sg, duration_s: 1200}}\nsteps: none\n")
    result = runner.invoke(app, [*argv, "--format", "json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["num_finished"] == 5


AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _azure(tmp_path, *stamps: str) -> list[str]:
    (tmp_path / "t.csv").write_text(AZURE_HEAD + "".join(f"{stamp},100,5\n" for stamp in stamps))
    (tmp_path / "s.yaml").write_text(f"workload: {{num_requests: {len(stamps)}, arrival: {{process: trace}}, "
                                     "trace: {format: azure, path: t.csv}}\nsteps: none\n")
    return ["run", str(tmp_path / "s.yaml"), "-o", str(tmp_path / "out")]


def _arrivals(tmp_path, argv: list[str]) -> list[float]:
    result = runner.invoke(app, [*argv, "--format", "json"])
    assert result.exit_code == 0, result.output
    lines = (tmp_path / "out" / "requests.csv").read_text().splitlines()
    return [float(line.split(",")[1]) for line in lines[1:]]


@pytest.mark.parametrize(("second", "message"), [
    ("2023-11-16 18:15:46.5e3", "TIMESTAMP='2023-11-16 18:15:46.5e3' is not a timestamp"),
    ("2023-11-16 18:15:46.6_7", "TIMESTAMP='2023-11-16 18:15:46.6_7' is not a timestamp"),
    ("2023-11-16 18:15:47.", "TIMESTAMP='2023-11-16 18:15:47.' is not a timestamp"),
    ("2023-11-16 18:15:47.5+02:00", "TIMESTAMP='2023-11-16 18:15:47.5+02:00' has a time zone, but line 2's has "
                                    "none: give every row's in one form"),
], ids=["exponent", "underscore", "dot-alone", "zone-beside-none"])
def test_an_azure_timestamp_is_read_as_written_or_refused(tmp_path, second, message):
    """The fraction after the seconds' dot went through float(): `46.5e3` arrived 500 s in, `46.6_7` at
    .67 s; a row with a time zone beside rows without one was read hours away from them."""
    assert one_line_exit_2(_azure(tmp_path, "2023-11-16 18:15:46.5", second)) == f"{tmp_path}/t.csv:3: {message}"
    assert not (tmp_path / "out").exists()


def test_an_azure_2024_timestamp_with_its_zone_is_read(tmp_path):
    """The 2024 Azure trace writes `2024-05-10 00:00:00.009930+00:00`: refused as "not a timestamp"."""
    assert _arrivals(tmp_path, _azure(tmp_path, "2024-05-10 00:00:00.009930+00:00",
                                      "2024-05-10 00:00:01.509930+00:00")) == pytest.approx([0.0, 1.5])


def test_an_azure_timestamp_without_a_zone_is_not_read_in_this_machines(tmp_path, monkeypatch):
    """A zone-less TIMESTAMP was read in the machine's time zone: on one that keeps daylight saving time, two
    requests two minutes apart across the clocks going back arrived 62 minutes apart. Azure's are UTC."""
    import time

    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        arrivals = _arrivals(tmp_path, _azure(tmp_path, "2023-11-05 01:59:00.0", "2023-11-05 02:01:00.0"))
    finally:
        monkeypatch.undo()
        time.tzset()
    assert arrivals == [0.0, 120.0]


BENCH = {"model_id": "meta-llama/Llama-3.1-8B", "input_lens": [16, 32], "output_lens": [5, 3], "ttfts": [0.01, 0.02],
         "itls": [[0.01] * 4, [0.02, 0.02]], "latencies": [0.05, 0.06], "start_times": [1000.0, 1000.015]}


@pytest.mark.parametrize("how", ["gz", "bom"])
def test_a_bench_json_reads_as_the_other_files_do(tmp_path, how):
    """`validate b.json.gz` said "b.json.gz: not UTF-8 text (byte 1)" (the gzip read as text) and a bench JSON
    starting with a byte-order mark "not JSON (Unexpected UTF-8 BOM ...)"; every other reader takes both."""
    import gzip

    text = json.dumps(BENCH)
    path = tmp_path / ("b.json.gz" if how == "gz" else "b.json")
    path.write_bytes(gzip.compress(text.encode()) if how == "gz" else ("\ufeff" + text).encode())
    result = runner.invoke(app, ["validate", str(path), "--model", "llama-3.1-8b", "--gpu", "h100-80gb",
                                 "-o", str(tmp_path / "out"), "--format", "json", "--no-figures"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "validation.json").exists()


def test_a_truncated_bench_json_gz_says_so(tmp_path):
    import gzip

    (tmp_path / "b.json.gz").write_bytes(gzip.compress(json.dumps(BENCH).encode())[:-12])
    assert one_line_exit_2(["validate", str(tmp_path / "b.json.gz"), "--model", "llama-3.1-8b", "--gpu",
                            "h100-80gb", "-o", str(tmp_path / "out")]).startswith(
        f"JSON file {tmp_path}/b.json.gz: cannot read, the compressed file is truncated or corrupt (")
    assert not (tmp_path / "out").exists()


def test_a_gzipped_vidur_csv_is_read_as_vidur(tmp_path):
    """A Vidur `mlp.csv.gz` was taken for a kvsim profile CSV (its header was read as gzip bytes) and refused
    with "column 'kind' is missing; expected the columns kind,op,batch,...", the wrong format's columns."""
    import gzip

    columns = ("n_head,n_kv_head,n_embd,n_expanded_embd,vocab_size,use_gated_mlp,num_tokens,"
               "num_tensor_parallel_workers,time_stats.attn_pre_proj.median,time_stats.mlp_up_proj.median")
    rows = [f"32,32,4096,11008,32000,True,{tokens},1,{ms},{ms}" for tokens, ms in ((1, 0.05), (256, 0.08))]
    folder = tmp_path / "compute" / "a100" / "meta-llama" / "Llama-2-7b-hf"
    folder.mkdir(parents=True)
    (folder / "mlp.csv.gz").write_bytes(gzip.compress("\n".join([columns, *rows, ""]).encode()))
    out = tmp_path / "p.csv"
    result = runner.invoke(app, ["import-profile", str(folder / "mlp.csv.gz"), "--model", "llama-2-7b", "--gpu",
                                 "a100-80gb", "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "# source_format: Vidur mlp.csv" in out.read_text()


def test_a_profile_csv_giving_a_metadata_key_twice_is_refused(tmp_path):
    """`# gpu: ...H100...` then `# gpu: ...RTX PRO 6000...` (two headers pasted together) was read as the last
    one: the H100's profile was imported for the RTX PRO 6000 without a word."""
    from test_bad_input import native_profile

    (tmp_path / "p.csv").write_text("# gpu: NVIDIA H100 80GB HBM3\n" + native_profile()["p.csv"])
    assert one_line_exit_2(["import-profile", str(tmp_path / "p.csv"), "-o", str(tmp_path / "out.csv"),
                            "--gpu", "rtx-pro-6000"]) == (
        f"profile {tmp_path}/p.csv: line 2: metadata gpu='NVIDIA RTX PRO 6000 Blackwell Server Edition', but an "
        "earlier line gives gpu='NVIDIA H100 80GB HBM3': give each key once")
    assert not (tmp_path / "out.csv").exists()
    (tmp_path / "p.csv").write_text(native_profile()["p.csv"].replace("# model:", "# gpu: NVIDIA RTX PRO 6000 "
                                                                      "Blackwell Server Edition\n# model:", 1))
    result = runner.invoke(app, ["import-profile", str(tmp_path / "p.csv"), "-o", str(tmp_path / "out.csv"),
                                 "--gpu", "rtx-pro-6000"])
    assert result.exit_code == 0, result.output  # the same value twice says nothing new

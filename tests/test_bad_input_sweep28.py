"""Bad input found by the twenty-eighth sweep (the files kvsim reads). Each is refused (the CLI: exit 2, one line
naming the field and the value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: a CSV trace cell (Azure, a length table, a priority column) of more digits than `int()` converts (4,300)
was a ValueError traceback ("Exceeds the limit (4300 digits) for integer string conversion"), and so was a
small count written with thousands of leading zeros (`int()` counts them against its limit). A ServeGen
dataset's length probabilities: an integer past a float's range (`{10: 1000…0}`, 401 digits) was an
OverflowError traceback; two of 1e308 summed to inf, so the CDF was [0, NaN] and the first length never drawn;
integers summing past 2**63 wrapped the int64 CDF negative ([-0.5, 1]), so again only the last length was drawn;
each without a word. An integer past a float's range (401 digits, which JSON and YAML read as an int) was an
OverflowError traceback wherever a file's number was checked with `math.isfinite` or read with `read_number(...,
float)`: a `vllm bench serve` JSON's ttfts, start_times, max_concurrency or request_rate (and a measured run's
requests.jsonl, through the same `is_number`), a GPU file's `efficiency` fractions and times, a profile's skew
`alpha_default`; and a model config.json's context length scaled by `rope_scaling` where the product is past a
float's range (a yarn `original_max_position_embeddings` or a `max_position_embeddings` of 401 digits times a
float factor). A model's config.json was read by PyYAML as YAML 1.1, where a number in JSON's exponent form
(`4e0`, `1e-05`, `2.5e3`: no dot or an unsigned exponent) is text: `rope_scaling.factor: 4e0` was refused as
"must be a positive number", where vLLM (`json.load`) reads 4.0.

Probed and found refused or read as the rule asks (not repeated here): Azure, Mooncake, sharegpt_tokens and length
files that are empty, a header alone, a BOM, CRLF or CR-only line ends, a truncated last line, `.gz` that is not
gzip, a 0-byte or truncated `.gz`, non-UTF-8 or UTF-16 bytes, NUL bytes, a 2 MB line, a folder, a FIFO (plain or
`.gz`), duplicated JSON keys, counts as strings, negative and zero counts, NaN and Infinity, times going
backwards, JSON integers of 5,000 digits, 1e400, JSON nested 100,000 deep, a list for a row; vLLM ShareGPT JSON
(empty, BOM, non-UTF-8, NaN, duplicate keys, deep nesting, turns that are no objects); ServeGen folders (BOM, CRLF,
NUL, a 200 KB cell, non-finite or 5,000-digit rates, datasets empty, non-UTF-8, of duplicate or NaN windows, a
FIFO); a FIFO given as a profile, a `.gz` profile, a scenario, a plan spec, a bench JSON, a GPU file or a model
folder's config.json (each refused, none blocks); `rope_theta`/`rms_norm_eps` of any value (not read by kvsim).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path
from test_bad_input_sweep20 import QWEN
from test_validate import bench_json

from kvsim.latency.skew import alpha_default
from kvsim.model.errors import KvsimError
from kvsim.model.families import fields_from_hf_config
from kvsim.model.units import is_number, read_number
from kvsim.validation.measured import load_measured
from kvsim.workload.servegen import read_servegen
from kvsim.workload.traces import TraceColumns, read_azure, read_lengths

HUGE = "9" * 4301  # one digit past int()'s default limit (sys.get_int_max_str_digits() == 4300)
AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens,prio\n2023-11-16 18:17:03.1,{},10,0\n"


@pytest.mark.parametrize(("reader", "text", "message"), [
    (read_azure, AZURE.format(HUGE), r":2: ContextTokens='9+\.\.\. is more tokens than kvsim counts \(9,007,199,254,740,992\)$"),
    (read_azure, AZURE.format("-" + HUGE), r":2: ContextTokens='-9+\.\.\. must be positive$"),
    (read_lengths, f"num_prefill_tokens,num_decode_tokens\n10,{HUGE}.0\n",
     r":2: num_decode_tokens='9+\.\.\. is more tokens than kvsim counts"),
])
def test_a_count_of_more_digits_than_int_converts_is_a_row_error(tmp_path, reader, text, message):
    """`_integral` called `int()` on any run of ASCII digits: past 4,300 digits a ValueError traceback."""
    path = tmp_path / "t.csv"
    path.write_text(text)
    with pytest.raises(KvsimError, match=message):
        reader(path)


def test_a_priority_of_more_digits_than_int_converts_is_outside_int64(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(AZURE.format("10").replace(",0\n", f",-{HUGE}\n"))
    with pytest.raises(KvsimError, match=r":2: priority column prio='-9+\.\.\. is outside int64$"):
        read_azure(path, TraceColumns(priority="prio"))


def test_a_count_with_thousands_of_leading_zeros_is_its_value(tmp_path):
    """`int('0' * 5000 + '7')` refuses the text (the limit counts leading zeros): the value is 7, as `int()` of
    `007` is, whatever the number of zeros; and -0…07 as a priority is -7."""
    path = tmp_path / "t.csv"
    path.write_text(AZURE.format("0" * 5000 + "7").replace(",0\n", f",-{'0' * 5000}7.00\n"))
    [record] = read_azure(path, TraceColumns(priority="prio"))
    assert (record.prompt_len, record.priority) == (7, -7)


def test_the_cli_says_it_in_one_line_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "t.csv").write_text(AZURE.format(HUGE))
    (tmp_path / "s.yaml").write_text("workload:\n  num_requests: 1\n  arrival: {process: trace}\n"
                                     "  trace: {format: azure, path: t.csv}\nsteps: none\n")
    line = one_line_exit_2(["run", "s.yaml", "-o", "out"])
    assert line.startswith("t.csv:2: ContextTokens='999") and line.endswith("is more tokens than kvsim counts "
                                                                           "(9,007,199,254,740,992)")
    assert not (tmp_path / "out").exists()


def servegen_prompts(folder, input_tokens: str) -> list[int]:
    """The prompt lengths ServeGen's model draws over one 600-s window at 1 req/s (seed 0) from a client whose
    dataset gives the input length probabilities `input_tokens` (as ServeGen writes them: a Python dict's text)."""
    (folder / "chunk-0-trace.csv").write_text("0,1.0,1.0\n")
    (folder / "chunk-0-dataset.json").write_text(json.dumps(
        {"0": {"input_tokens": input_tokens, "output_tokens": "{5: 1.0}"}}))
    return [record.prompt_len for record in read_servegen(folder, np.random.default_rng(0), 0.0, 600.0, None)]


@pytest.mark.parametrize("weights", ["{10: 4611686018427387904, 20: 4611686018427387904}",  # 2 x 2**62
                                     "{10: 1, 20: 1}", "{10: 0.5, 20: 0.5}"])
def test_servegen_lengths_of_equal_weights_are_drawn_alike_whatever_their_size(tmp_path, weights):
    """Two lengths of equal weight are each drawn with probability 1/2: of ~600 draws (a binomial's sd is ~12),
    each length's share is within 0.4 to 0.6. Two weights of 2**62 summed in int64 to -2**63, a CDF of
    [-0.5, 1] that drew 20 tokens every time."""
    prompts = servegen_prompts(tmp_path, weights)
    assert set(prompts) == {10, 20} and 0.4 < prompts.count(10) / len(prompts) < 0.6


@pytest.mark.parametrize(("weights", "message"), [
    ("{10: 1e308, 20: 1e308}", r"window 0 input_tokens: the probabilities sum past the largest float "
                               r"\('\{10: 1e308, 20: 1e308\}'\)$"),
    ("{10: 1" + "0" * 400 + "}", r"window 0 input_tokens: 10 tokens has probability 10+\.\.\., not a finite "
                                 r"number >= 0$"),
])
def test_servegen_probabilities_past_a_float_are_refused(tmp_path, weights, message):
    """1e308 twice: the CDF [1e308, inf] / inf = [0, NaN] never drew 10 tokens; 10**400: float() of it is an
    OverflowError, which no reader's guard caught (a traceback from `kvsim run`)."""
    with pytest.raises(KvsimError, match=message):
        servegen_prompts(tmp_path, weights)


PAST_FLOAT = 10**400  # a JSON or YAML integer of 401 digits: float() of it raises OverflowError


@pytest.mark.parametrize(("changes", "message"), [
    ({"ttfts": [PAST_FLOAT, 0.02, 0.0]}, r"ttfts\[0\]=10+\.\.\. is not a number$"),
    ({"start_times": [1000.0, -PAST_FLOAT, 1000.02]}, r"start_times\[1\]=-10+\.\.\. is not a number$"),
    ({"max_concurrency": PAST_FLOAT}, r"max_concurrency=10+\.\.\. is not a positive whole number$"),
    ({"request_rate": PAST_FLOAT, "start_times": None}, r"request_rate=10+\.\.\. is not a positive number$"),
])
def test_a_bench_number_past_a_floats_range_is_refused_naming_it(tmp_path, changes, message):
    with pytest.raises(KvsimError, match=f"b.json: {message}"):
        load_measured(bench_json(tmp_path / "b.json", **changes))


def test_a_number_past_a_floats_range_is_no_finite_number_and_reads_as_inf():
    """As text, the same number reads as inf (`float('1e400')`); as an int it raised OverflowError."""
    assert read_number(PAST_FLOAT, float) == float("inf") and read_number(-PAST_FLOAT, float) == float("-inf")
    assert read_number(2**1023, float) == 2.0**1023  # the largest power of two a float holds is still itself
    assert not is_number(PAST_FLOAT) and is_number(2**1023) and not is_number(True)
    with pytest.raises(KvsimError, match=r"^profile p: alpha_default=10+\.\.\. is not a finite number$"):
        alpha_default(PAST_FLOAT, "p", "alpha_default")


@pytest.mark.parametrize(("field", "said"), [("cpu_fixed_s", "expected seconds, 0 to 3600"),
                                             ("gemm_flops", "expected a positive fraction of the datasheet rate")])
def test_a_gpu_files_efficiency_past_a_floats_range_is_one_line(tmp_path, monkeypatch, field, said):
    import yaml

    from kvsim.model.config import load_gpu

    monkeypatch.chdir(tmp_path)
    fields = {key: value for key, value in load_gpu("h100-80gb").model_dump().items() if key != "name"}
    gpu = f"gpu-{field}"  # a file name of its own: `load_gpu` caches a GPU by the name it is given
    (tmp_path / f"{gpu}.yaml").write_text(yaml.safe_dump({**fields, "efficiency": {field: PAST_FLOAT}}))
    line = one_line_exit_2(["run", "--set", f"gpu={gpu}.yaml", "--set", "workload.num_requests=2", "-o", "out"])
    assert re.fullmatch(rf"gpu {gpu}: efficiency\.{field}=10+\.\.\.: {said}", line), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("config", "length"), [
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": PAST_FLOAT}}, "10+"),
    ({"max_position_embeddings": PAST_FLOAT, "rope_scaling": {"rope_type": "linear", "factor": 2.0}}, "10+"),
])
def test_a_scaled_context_length_past_a_floats_range_is_refused(config, length):
    """vLLM multiplies the length by the factor (`_get_and_verify_max_len`); an int of 401 digits times a float
    raised OverflowError (a traceback from `kvsim run --set model=FOLDER`)."""
    with pytest.raises(KvsimError, match=rf"^model config M: rope_scaling\.factor=[0-9.]+: the context length it "
                                         rf"scales \({length}\.\.\.\) times it is past a float's range$"):
        fields_from_hf_config({**QWEN, **config}, "M")


def test_a_scaled_context_length_of_integers_is_exact_however_long():
    """An int factor times an int length is an exact int, as `max_position_embeddings` of 401 digits alone is
    read (then bounded by the engine's max_model_len): only a float's overflow is refused."""
    fields = fields_from_hf_config({**QWEN, "max_position_embeddings": PAST_FLOAT,
                                    "rope_scaling": {"rope_type": "linear", "factor": 2}}, "M")
    assert fields["max_position_embeddings"] == 2 * PAST_FLOAT


@pytest.mark.parametrize("factor", ["2e0", "2.0e0", "20e-1", "0.2E1"])
def test_a_config_json_number_in_exponent_form_is_a_number_as_json_reads_it(tmp_path, factor):
    """Each spells 2.0 in JSON (RFC 8259's exponent: optional sign, no dot needed): 8,192 positions times a
    linear factor of 2 serve 16,384 (vLLM's `_get_and_verify_max_len`)."""
    from kvsim.model.config import load_model

    folder = tmp_path / f"m{factor.replace('.', '_')}"  # a path of its own: `load_model` caches by the path
    folder.mkdir()
    config = json.dumps({**QWEN, "max_position_embeddings": 8192, "rope_scaling": {"type": "linear", "factor": 0}})
    (folder / "config.json").write_text(config.replace('"factor": 0', f'"factor": {factor}'))
    assert load_model(str(folder)).max_position_embeddings == 16384

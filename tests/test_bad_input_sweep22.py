"""Bad input found by the twenty-second sweep. Each is refused (the CLI: exit 2, one line naming the field and the
value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: a resumed `kvsim plan` reused a point of points.jsonl whatever its values (a text, a missing stat or verdict:
a traceback deep in the search; a negative p90 met every SLO): `tests/test_plan_bad_input.py`. A bad
KVSIM_DASK_NO_WORKERS_TIMEOUT_S was read at the search's first wait, after `plan --workers N` had made its folder
and started its cluster (`tests/test_plan_bad_input.py`). `kvsim calibrate --gpu` spanning lines was recorded as a
`# gpu:` line whose next line the profile reader takes for a row, found only after the whole calibration.
"""

from __future__ import annotations

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path


@pytest.mark.parametrize("gpu", ["h200\nkind,op", "h200\rkind", "h200\x0cx"])
def test_calibrate_refuses_a_gpu_name_that_spans_lines_before_measuring(tmp_path, gpu):
    """`read_native` splits a profile at every line break `str.splitlines` knows: the name's second line was
    read back as a CSV row (`--dry-run` checks the arguments a real run would refuse only after timing)."""
    from kvsim.model.errors import shown

    assert one_line_exit_2(["calibrate", "--gpu", gpu, "--dry-run", "-o", str(tmp_path / "p.csv")]) == (
        f"--gpu={shown(gpu)}: spans lines; a profile CSV keeps each metadata value on one line")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("cls", ["1_0", "+1", "01", "\uff11", " 1", "-0", "--1"])
def test_an_slo_class_is_an_integer_as_python_writes_it(tmp_path, cls):
    """`int()` read `ttft_s.p90@1_0` as class 10 and `@01`, `@+1`, a fullwidth 1 or ` 1` as class 1: a second
    limit on a class whose key differs, or the SLO of another class than the one written."""
    out = tmp_path / "plan"
    message = one_line_exit_2(["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", f"ttft_s.p90@{cls}=2",
                               "-o", str(out)])
    assert message == (f"plan.slo: 'ttft_s.p90@{cls}': the class after '@' must be an integer request priority, "
                       f"got {cls!r}") and not out.exists()


@pytest.mark.parametrize(("key", "parsed"), [("ttft_s.p90@0", 0), ("e2e_s.mean@-1", -1), ("queue_s.p99@12", 12)])
def test_an_slo_class_written_as_an_integer_is_read(key, parsed):
    from kvsim.planning.slo import parse_slo_key

    assert parse_slo_key(key)[2] == parsed


def test_progress_is_told_the_simulated_seconds_not_a_fraction():
    """The refusal of a `progress` that cannot take three arguments named them (fraction, done, total); the first
    is the simulated time (`kvsim.engine.loop.ProgressFn`): a progress bar fed it as a fraction passed 100 %.
    The last call comes as the run ends, when its last request finishes."""
    import kvsim
    from kvsim.model.errors import KvsimError

    calls: list[tuple] = []
    result = kvsim.simulate(workload__num_requests=2, progress=lambda *args: calls.append(args))
    assert calls[-1] == (result.requests["finish_s"].max(), 2, 2) and calls[-1][0] > 1
    with pytest.raises(KvsimError, match=r"^progress=5: expected a function \(simulated_s, done, total\) or None$"):
        kvsim.simulate(workload__num_requests=2, progress=5)


LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096, "num_attention_heads": 32,
         "num_key_value_heads": 8, "num_hidden_layers": 32, "intermediate_size": 14336, "vocab_size": 128256,
         "max_position_embeddings": 8192, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("tie", ["false", "yes", 1, 0.0, [True]])
def test_tie_word_embeddings_that_is_no_boolean_is_refused(tmp_path, tie):
    """Pydantic's lax bool read the text "false" as False (and "yes" as True, 1 as True): Hugging Face reads any
    non-empty text as true (`if config.tie_word_embeddings:`), so the two counted the embedding table apart."""
    import json

    from kvsim.model.errors import shown

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "tie_word_embeddings": tie}))
    assert one_line_exit_2(["capacity", "--model", str(tmp_path / "config.json")]) == (
        f"model config {tmp_path.name}: tie_word_embeddings={shown(tie)}: must be true or false")


@pytest.mark.parametrize(("given", "tied"), [({"tie_word_embeddings": True}, True),
                                              ({"tie_word_embeddings": False}, False),
                                              ({"tie_word_embeddings": None}, False), ({}, False)])
def test_tie_word_embeddings_of_json_true_or_false_or_none_is_read(tmp_path, given, tied):
    import json

    from kvsim.model.config import load_model

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, **given}))
    assert load_model(str(tmp_path / "config.json")).tie_word_embeddings is tied


@pytest.mark.parametrize(("name", "text", "line"), [
    ("dense", "layer,tokens,time_us\nqkv_proj,1,30\nqkv_proj,256,60,7\n", 3),  # the 7 was dropped: 60 us read
    ("attention", "prefill_chunk,kv_prefill,n_decode,kv_decode,time_us\n16,0,0,0,5,9\n", 2),
    ("per_sequence", "layer,sequences,time_us\nlm_head,1,5\nlm_head,2\n", 3)])  # None: "time_us=None is not a number"
def test_a_bundle_row_without_the_headers_fields_is_refused_by_its_line(tmp_path, name, text, line):
    """`csv.DictReader` keys a long row's extra cells by None and fills a short row's missing ones with None:
    an extra cell was dropped without a word (Vidur's mlp.csv refused such a row: `first_ragged`)."""
    from test_bad_input import bundle  # tests/ is on sys.path

    files = bundle(**{name: text}) if name != "dense" else bundle(dense=text)
    for path, content in files.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(content)
    fields = len(text.splitlines()[0].split(","))
    assert one_line_exit_2(["import-profile", str(tmp_path / "b"), "-o", str(tmp_path / "out.csv"), "--gpu",
                            "rtx-pro-6000"]) == (f"profile {tmp_path / 'b' / 'tp1' / name}.csv: line {line} does not "
                                                 f"have the header's {fields} fields (a truncated or malformed file)")
    assert not (tmp_path / "out.csv").exists()


GPU = {"memory_bytes": 1000, "hbm_bandwidth_bytes_per_s": 3.35e12, "fp16_flops": 989e12,
       "host_link_bandwidth_bytes_per_s": 64e9}


@pytest.mark.parametrize(("name", "problem"), [
    ("my\ngpu", "holds the control character '\\n'; a name labels output rows, tables and one-line errors, so it is "
                "one line of printable text"),
    (" ", "is blank; a name labels output rows, tables and one-line errors, so it holds a character other than a "
          "space")])
def test_a_gpu_files_name_is_one_line_of_text(tmp_path, name, problem):
    """A GPU file's `name` replaces its stem in every message: with a newline, the refusal of a pool too small for
    the weights ("... but my<newline>gpu at gpu_memory_utilization=0.9 gives 900 B") was two lines."""
    import json

    from kvsim.model.errors import shown

    (tmp_path / "g.json").write_text(json.dumps({"name": name, **GPU}))
    assert one_line_exit_2(["capacity", "--gpu", str(tmp_path / "g.json")]) == f"gpu g.name={shown(name)}: {problem}"


def test_a_models_name_or_path_is_one_line_of_text(tmp_path):
    """`_name_or_path` names the model in its errors (`model meta/Llama<newline>3.num_layers=...`)."""
    import json

    (tmp_path / "config.json").write_text(json.dumps({**LLAMA, "_name_or_path": "meta/Llama\n3"}))
    assert one_line_exit_2(["capacity", "--model", str(tmp_path / "config.json")]) == (
        f"model file {tmp_path / 'config.json'}: _name_or_path='meta/Llama\\n3': holds the control character '\\n'; "
        "a name labels output rows, tables and one-line errors, so it is one line of printable text")


@pytest.mark.parametrize(("sizes", "shown_list", "bad"), [(["0"], "[0]", 0), (["1", "-2"], "[1, -2]", -2)])
def test_a_tp_size_that_is_not_positive_is_named_once(tmp_path, sizes, shown_list, bad):
    """The refusal said the list twice ("plan.tensor_parallel_sizes=[0]: [0]: tensor-parallel sizes must be
    positive"), not which item is wrong."""
    argv = ["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", "ttft_s.p90=2", "-o", str(tmp_path / "p")]
    for size in sizes:
        argv += ["-tp", size]
    assert one_line_exit_2(argv) == (
        f"plan.tensor_parallel_sizes={shown_list}: {bad} is not a positive tensor-parallel size")

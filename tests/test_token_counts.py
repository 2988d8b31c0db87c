"""`max_model_len` and `max_num_batched_tokens` take vLLM's human-readable integers (vllm/engine/arg_utils.py: both
flags' type is `human_readable_int`, `human_readable_int_or_auto` for --max-model-len): `--max-model-len 32k` and
`--set engine.max_model_len=32k` were refused as "unable to parse string as an integer", where vLLM starts.

Every expectation is vLLM's documented rule (its docstring: '1k' -> 1,000, '1K' -> 1,024, '25.6k' -> 25,600; a
lowercase k/m/g/t is a power of 1000, an uppercase K/M/G/T a power of 1024, and "Decimals are not allowed with
binary suffixes"), not kvsim's output. vLLM's `auto` (or -1) is its own longest context that fits memory: kvsim
refuses it, saying to give a number or leave the field unset (the model's `max_position_embeddings`).
"""

from __future__ import annotations

import pytest
import yaml

from kvsim.model.errors import KvsimError
from tests.conftest import one_line_exit_2

READABLE = [("32k", 32_000), ("32K", 32 * 1024), ("25.6k", 25_600), ("8192", 8192), (8192, 8192)]
AUTO = "vLLM's auto (the longest context that fits the KV cache) is not modelled: give a number of tokens, or " \
       "leave max_model_len unset for the model's max_position_embeddings"
DECIMAL_K = "a decimal with the binary suffix K is refused, as vLLM refuses it (did you mean 1.5k, powers of 1000?)"
TINY = {"latency": {"model": "constant"}, "steps": "none",
        "workload": {"num_requests": 2, "prompt_len": {"dist": "fixed", "value": 16},
                     "output_len": {"dist": "fixed", "value": 2}}}


@pytest.mark.parametrize("field", ["max_model_len", "max_num_batched_tokens"])
@pytest.mark.parametrize(("text", "tokens"), READABLE)
def test_an_engine_count_is_read_as_vllm_reads_it(field, text, tokens):
    from kvsim.model.engine_config import make_engine

    assert getattr(make_engine(**{field: text}), field) == tokens


@pytest.mark.parametrize(("field", "text", "said"), [
    ("max_model_len", "1.5K", DECIMAL_K), ("max_num_batched_tokens", "1.5K", DECIMAL_K),
    ("max_model_len", "auto", AUTO), ("max_model_len", -1, AUTO), ("max_model_len", "-1", AUTO),
    ("max_model_len", "1.0005k", "is 1000.5 tokens, not a whole number"),
    ("max_num_batched_tokens", "32kb", "Input should be a valid integer"),  # a byte unit is no count (vLLM: none)
])
def test_an_engine_count_vllm_refuses_is_refused_naming_it(field, text, said):
    from kvsim.model.engine_config import make_engine

    with pytest.raises(KvsimError) as caught:
        make_engine("engine", **{field: text})
    assert str(caught.value).startswith(f"engine.{field}={text!r}: {said}")


@pytest.mark.parametrize(("text", "tokens"), READABLE[:3])
def test_the_max_model_len_flag_reads_vllms_counts(text, tokens):
    from typer.testing import CliRunner

    from kvsim.cli import app

    result = CliRunner().invoke(app, ["capacity", "--max-model-len", text, "--context-lengths", "1024"],
                                prog_name="kvsim")
    assert result.exit_code == 0 and f"max_model_len={tokens:,}\n" in result.stdout


@pytest.mark.parametrize(("text", "tokens"), READABLE[:3])
def test_the_max_num_batched_tokens_flag_reads_vllms_counts(text, tokens):
    """vLLM refuses a step budget below max_num_seqs (`SchedulerConfig.verify_max_model_len`): the refusal shows
    the budget the flag was read as, with one sequence more than it holds."""
    said = one_line_exit_2(["capacity", "--max-num-batched-tokens", text, "--max-num-seqs", str(tokens + 1)])
    assert said.startswith(f"engine.max_num_batched_tokens={tokens}: vLLM refuses this: ")


@pytest.mark.parametrize(("flag", "text", "said"), [
    ("--max-model-len", "1.5K", DECIMAL_K), ("--max-num-batched-tokens", "1.5K", DECIMAL_K),
    ("--max-model-len", "auto", AUTO), ("--max-model-len", "-1", AUTO),
])
def test_a_flag_count_vllm_refuses_is_one_line(flag, text, said):
    assert one_line_exit_2(["capacity", flag, text]).startswith(f"Invalid value for '{flag}': '{text}': {said}")


def test_a_set_count_is_written_back_as_its_integer(tmp_path):
    from typer.testing import CliRunner

    from kvsim.cli import app

    (tmp_path / "s.yaml").write_text(yaml.safe_dump(TINY))
    result = CliRunner().invoke(app, ["run", str(tmp_path / "s.yaml"), "--set", "engine.max_model_len=25.6k",
                                      "--set", "engine.max_num_batched_tokens=32K", "-o", str(tmp_path / "out")],
                                prog_name="kvsim")
    assert result.exit_code == 0, result.output
    engine = yaml.safe_load((tmp_path / "out" / "scenario.yaml").read_text())["engine"]
    assert (engine["max_model_len"], engine["max_num_batched_tokens"]) == (25_600, 32_768)


@pytest.mark.parametrize(("setting", "said"), [
    ("engine.max_model_len=1.5K", f"engine.max_model_len='1.5K': {DECIMAL_K}"),
    ("engine.max_num_batched_tokens=1.5K", f"engine.max_num_batched_tokens='1.5K': {DECIMAL_K}"),
    ("engine.max_model_len=auto", f"engine.max_model_len='auto': {AUTO}"),
])
def test_a_set_count_vllm_refuses_is_one_line_and_writes_nothing(tmp_path, setting, said):
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(TINY))
    out = tmp_path / "out"
    assert one_line_exit_2(["run", str(tmp_path / "s.yaml"), "--set", setting, "-o", str(out)]) == said
    assert not out.exists()

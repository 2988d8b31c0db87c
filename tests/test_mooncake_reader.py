"""Mooncake rows become prompt segments as the trace defines them: one hash_id per 512-token block, block i
holding min(512, input_length - 512·i) tokens (FAST'25 trace README), each id a JSON integer or string."""

import json

import numpy as np
import pytest

from kvsim.model.errors import KvsimError
from kvsim.workload.traces import read_mooncake


def test_segments_are_512_token_blocks_and_the_rest(tmp_path):
    """Every prompt length around block edges (1, 511, 512, 513, 1024, 1025) and 2,000 random ones up to 20k
    tokens, integer and string ids: each row's segments are the ids with min(512, prompt - 512 i) tokens."""
    rng = np.random.default_rng(3)
    prompts = [1, 511, 512, 513, 1024, 1025, *rng.integers(1, 20_000, 2_000).tolist()]
    rows = []
    for n, prompt in enumerate(prompts):
        ids = [f"h{n}-{i}" if (n + i) % 3 == 0 else n * 100 + i for i in range(-(-prompt // 512))]
        rows.append({"timestamp": n * 10.0, "input_length": prompt, "output_length": 7, "hash_ids": ids})
    path = tmp_path / "t.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    records = read_mooncake(path)
    assert [r.prompt_len for r in records] == prompts
    for record, row in zip(records, rows, strict=True):
        expected = tuple((("mooncake", h), min(512, row["input_length"] - 512 * i))
                         for i, h in enumerate(row["hash_ids"]))
        assert record.segments == expected
        assert sum(length for _, length in record.segments) == row["input_length"]
    assert records[2].segments == ((("mooncake", 200), 512),)  # exactly one full block
    assert [length for _, length in records[3].segments] == [512, 1]


@pytest.mark.parametrize("hash_id", ["true", "1.0", "null", "[1]", '{"a": 1}'])
def test_a_hash_id_that_is_not_an_integer_or_string_is_refused(tmp_path, hash_id):
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [7, ' + hash_id + ']}\n')
    with pytest.raises(KvsimError, match=r"t\.jsonl:1: hash_ids must be integers or strings$"):
        read_mooncake(path)


@pytest.mark.parametrize("reader", ["mooncake", "sharegpt_tokens"])
@pytest.mark.parametrize("digits", [309, 400])
def test_an_integer_time_past_a_floats_range_is_a_row_error_not_an_overflow(tmp_path, reader, digits):
    """A JSON integer time of 309 or more digits has no float (float(10**308) is 1e308, float(10**309) an
    OverflowError that left the CLI as a traceback, exit 1): it is refused as the inf it would be."""
    from kvsim.workload.traces import read_sharegpt_tokens

    path = tmp_path / "t.jsonl"
    if reader == "mooncake":
        row, field, read = {"timestamp": 10**digits, "input_length": 10, "output_length": 3, "hash_ids": [1]}, \
            "timestamp", read_mooncake
    else:
        row, field, read = {"arrival_time_ns": 10**digits, "input_toks": 4, "output_toks": 2}, \
            "arrival_time_ns", read_sharegpt_tokens
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(KvsimError, match=rf"t\.jsonl:1: {field}=10000.* is not a finite number$"):
        read(path)

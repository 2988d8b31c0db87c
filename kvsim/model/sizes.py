"""Byte sizes and token counts as users type them: `parse_size` and the pydantic field type `Bytes` (`12GiB`,
`1.5 GB`, `4096`); `parse_token_count` and `Tokens` (`32k`, `32K`), `MaxModelLen` (also refusing vLLM's `auto`)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

_SIZE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
"""The units of more than one letter (and `b`), in any case: `12GiB`, `12gib` and `12 GB` mean what they say."""
_LETTER_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
"""A bare letter, by its case, as vLLM's `human_readable_int` reads `--kv-cache-memory-bytes`
(vllm/engine/arg_utils.py): lowercase decimal (`12g`: 12·10**9 B), uppercase binary (`12G`: 12·2**30 B). `12g` was
12 GiB here, 7 % more KV pool than the same flag gives vLLM, without a word."""
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: Any) -> Any:
    """Parse `12GiB`, `1.5 GB`, `512MiB`, `4096` or a number into bytes (an int).

    Binary units (KiB, MiB, GiB, TiB, and bare uppercase K/M/G/T) are powers of 1024; KB, MB, GB, TB and bare
    lowercase k/m/g/t are powers of 1000, as vLLM reads a bare letter (`_LETTER_UNITS`). Anything else is passed
    through for pydantic to reject with the field name.
    """
    if isinstance(value, bool):
        return value
    if isinstance(value, int):  # float() of an int past 1.8e308 was an OverflowError traceback
        return value
    if isinstance(value, float):
        return int(value) if value.is_integer() else value
    if isinstance(value, str):
        match = _SIZE_RE.match(value)
        unit = match.group(2) if match else ""
        multiplier = _LETTER_UNITS.get(unit, _SIZE_UNITS.get(unit.lower()))
        if match and multiplier is not None:
            number = float(match.group(1)) * multiplier
            return int(number) if number.is_integer() else value
        raise ValueError(f"not a size (use e.g. 12GiB, 512MiB, 4096): {value!r}")
    return value


MAX_BYTES = 2**63 - 1
"""The largest size kvsim takes (int64's largest, 8 EiB, past any memory or disk): a size of 10**400 B was an
OverflowError traceback where it was shown in GiB, and its 400 digits filled the error line."""

Bytes = Annotated[int, BeforeValidator(parse_size), Field(gt=0, le=MAX_BYTES)]
"""A positive byte count that also accepts `12GiB`-style strings."""

BytesOrZero = Annotated[int, BeforeValidator(parse_size), Field(ge=0, le=MAX_BYTES)]
"""A byte count that may be 0 (nothing: no tier, no memory outside PyTorch), with `Bytes`' forms and bound."""


_TOKENS_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)([kmgtKMGT])\s*$")
"""A whole or decimal number and one letter of `_LETTER_UNITS`, as vLLM's `human_readable_int` matches them."""


def parse_token_count(value: Any) -> Any:
    """A count of tokens as vLLM's `human_readable_int` reads `--max-model-len` and `--max-num-batched-tokens`
    (vllm/engine/arg_utils.py): a bare lowercase k/m/g/t is a power of 1000 and may follow a decimal (`32k`:
    32,000; `25.6k`: 25,600), an uppercase K/M/G/T a power of 1024 after a whole number only (`32K`: 32,768;
    `1.5K` refused, as vLLM refuses it). The product is exact (`Decimal`), so one that is not whole (`1.0005k`)
    is refused where vLLM's float would truncate it. Anything else (an int, `4096`) is passed through for the
    field's own check, byte units (`32kb`) included, which vLLM refuses too."""
    match = _TOKENS_RE.match(value) if isinstance(value, str) else None
    if match is None:
        return value
    number, letter = match.groups()
    if letter.isupper() and "." in number:
        raise ValueError(f"a decimal with the binary suffix {letter} is refused, as vLLM refuses it "
                         f"(did you mean {number}{letter.lower()}, powers of 1000?)")
    count = Decimal(number) * _LETTER_UNITS[letter]
    if count != count.to_integral_value():
        raise ValueError(f"is {count.normalize():f} tokens, not a whole number")
    return int(count)


def parse_max_model_len(value: Any) -> Any:
    """`parse_token_count`, refusing vLLM's `auto` (and its `-1`: the longest context the KV cache holds) with
    what to give instead: kvsim takes a number, or no value for the model's `max_position_embeddings`."""
    if (isinstance(value, str) and value.strip().lower() in ("auto", "-1")) or (
            isinstance(value, int) and not isinstance(value, bool) and value == -1):
        raise ValueError("vLLM's auto (the longest context that fits the KV cache) is not modelled: give a number "
                         "of tokens, or leave max_model_len unset for the model's max_position_embeddings")
    return parse_token_count(value)


Tokens = Annotated[int, BeforeValidator(parse_token_count), Field(gt=0)]
"""A positive count of tokens that also accepts vLLM's `32k`/`32K` forms (`parse_token_count`)."""

MaxModelLen = Annotated[int, BeforeValidator(parse_max_model_len), Field(gt=0)]
"""`Tokens` for `max_model_len`: `auto` and `-1` refused with what to give instead (`parse_max_model_len`)."""

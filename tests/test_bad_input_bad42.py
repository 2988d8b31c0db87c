"""Bad input found by the bad42 sweep (the Python API the shipped notebooks and docs name, then scenario files, over
malformed arguments: wrong types, out-of-range and non-finite numbers, contradicting values). Each is refused before any
work with one `KvsimError` line naming the argument or field and its value; each test says what it was before.
"""

from __future__ import annotations

import math

import pytest

from kvsim.model.errors import KvsimError


def _refused(call, *named: str) -> str:
    """The one-line `KvsimError` `call()` raises, checked to name each of `named` (the argument and its value)."""
    with pytest.raises(KvsimError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message
    for text in named:
        assert text in message, (text, message)
    return message


@pytest.mark.parametrize(("slo", "named"), [({"ttft_s.p90": -1}, "ttft_s.p90=-1"), ({"ttft_s.p90": math.nan}, "=nan"),
                                            ({"ttft_s.p91": 1.0}, "'ttft_s.p91'"), ({"ttft_s.p90@x": 1.0}, "'x'")])
def test_a_bad_slo_is_kvsims_error(slo, named):
    """The rule asks for kvsim's error type from the API (a bare ValueError is not one; `KvsimError` still is a
    ValueError, so a pydantic validator that calls `check_slo` words it as before)."""
    from kvsim.planning.slo import probe_passes

    _refused(lambda: probe_passes({"verdict": "stable"}, slo), named)

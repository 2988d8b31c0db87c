"""Bad input found by the twenty-fourth sweep. Each is refused (the CLI: exit 2, one line naming the field and the
value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: an SLO class of more digits than `int()` converts said Python's conversion-limit message (`parse_slo_key`).
"""

from __future__ import annotations

import pytest
from conftest import one_line_exit_2  # tests/ is on sys.path


def test_an_slo_class_of_more_digits_than_int_converts_is_refused_as_any_other_class(tmp_path):
    """`int()` refuses text of more than 4,300 digits (`sys.get_int_max_str_digits()`) with its own advice to raise
    the limit: the key's line said that, not what a class is. 4,301 ones is no priority vLLM takes (an int64)."""
    from kvsim.planning.slo import parse_slo_key

    key = "ttft_s.p90@" + "1" * 4301
    with pytest.raises(ValueError, match=r"the class after '@' must be an integer request priority, got '1+'$"):
        parse_slo_key(key)
    out = tmp_path / "plan"
    line = one_line_exit_2(["plan", "--gpu", "h100-80gb", "--workers", "1", "--slo", f"{key}=2", "-o", str(out)])
    assert "the class after '@' must be an integer request priority" in line and "limit" not in line
    assert not out.exists()
    assert parse_slo_key("ttft_s.p90@-" + "9" * 18)[2] == -(10**18 - 1)  # a long class within the limit is read

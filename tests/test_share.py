"""`kvsim.model.units.share`: a refused share that rounds to 0.0 % keeps two significant digits (the plan of the
Azure hour printed "0.0% of the requests can never be served" for 1 of 19,366)."""

import pytest

from kvsim.model.units import share


@pytest.mark.parametrize(("fraction", "text"), [
    (0.0, "0.0%"),            # none: as before
    (0.052, "5.2%"),          # one decimal, as `:.1%` gave
    (1.0, "100.0%"),
    (0.0005, "0.1%"),         # 0.05 % rounds up to 0.1 %: not below the line
    (0.0004, "0.04%"),        # would have read 0.0 %
    (1 / 19_366, "0.0052%"),  # 5.16e-05: one request of the Azure hour
])
def test_a_share_reads_zero_only_when_it_is(fraction, text):
    assert share(fraction) == text


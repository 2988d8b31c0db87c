"""Bad input found by the thirtieth sweep (`kvsim plan` spec files). Each is refused (the CLI:
exit 2, one line naming the field and the value, nothing written; the Python API: a `KvsimError`).

Found: `probe_requests` in a replica search's spec was dropped without a word (the README: "a replica search's
probes start at the scenario's `workload.num_requests`, a rate search's at `probe_requests`"), where `capacity_headroom`
and `rel_tol` were refused.
"""

from __future__ import annotations

import pytest

from kvsim.model.errors import KvsimError
from kvsim.planning.spec import make_plan_spec

SLO = {"ttft_s.p90": 2.0}


def test_probe_requests_in_a_replica_search_is_refused_as_unread():
    with pytest.raises(KvsimError) as error:
        make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "probe_requests": 100})
    assert str(error.value) == "plan: probe_requests=100: search=replicas does not read it (only search=rate)"
    make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "probe_requests": 100, "search": "rate"})  # read there
    make_plan_spec({"slo": SLO, "gpus": ["h100-80gb"], "probe_requests": 2000})  # the default passes

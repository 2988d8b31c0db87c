"""Every column of a run's requests table and step rows is documented in docs/metrics.md's output tables.

Until December 2026 the page documented the summary's keys only: `requests.csv`'s columns (`prompt_tokens`,
`status`, `reject_reason`, ...) and the step rows' (`held_slots`, `shared_slots`, `num_decode_seqs`, ...) were
named nowhere a user reads."""

import kvsim
from tests.test_summary_keys import FLEET_RUNS, documented_names

OTHER_RUNS = {  # runs that add an optional column, beside the fleets and groups that add `replica`, `dp_rank`
    "one engine": {},
    "priority classes": {"workload__priority": {"classes": [{"name": "a", "priority": 0, "weight": 1},
                                                             {"name": "b", "priority": 1, "weight": 1}]}},
    "closed loop": {"workload__max_concurrency": 2},
    "length capped": {"engine__max_model_len": 1024, "engine__max_num_batched_tokens": 1024},
    "speculative": {"engine__speculative_config": {"method": "ngram", "num_speculative_tokens": 2,
                                                  "acceptance_rates": 0.5}},
}


DOCUMENTED_ABOVE = ("replicas", "pools")  # the summary's per_replica rows and disaggregation.pools, as CSVs


def test_every_requests_and_step_column_is_documented():
    """And every column of a fleet's other tables (routes.csv, transfers.csv, scaling.csv, slo.csv: named
    nowhere before docs34)."""
    documented = documented_names(output_tables=True)
    seen: set[str] = set()
    for kind, overrides in {**OTHER_RUNS, **FLEET_RUNS}.items():
        result = kvsim.simulate(None, workload__num_requests=6, **overrides)
        tables = [table for name, table in result.tables.items() if name not in DOCUMENTED_ABOVE]
        columns = set(result.requests.columns) | set(result.steps.columns)
        columns |= {column for table in tables for column in table.columns}
        assert columns - documented == set(), kind
        seen |= columns
    # each optional column was written by some run above, so the check covered it
    assert {"priority", "client_queue_s", "length_capped_tokens", "replica", "dp_rank", "draft_rejected", "pool",
            "handoff_s", "num_draining", "slo_attainment"} <= seen
    assert documented - seen == set()  # nothing documented that no run writes (a renamed column's old name)

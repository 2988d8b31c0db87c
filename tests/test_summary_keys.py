"""Every key of a run's summary is documented in docs/metrics.md (beside vLLM's name) and follows its one style."""

import re
from pathlib import Path

import kvsim
from kvsim.workload.fleet_layout import AutoscalerConfig

DOC = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"
OUTPUT_TABLES = "## Output tables"  # the page's last section: the requests' and steps' columns, not summary keys


def documented_names(output_tables: bool = False) -> set[str]:
    """The names in the first cell of each table row of docs/metrics.md: the summary's keys (the page before its
    output tables), or with `output_tables` the requests' and steps' columns (that last section)."""
    names: set[str] = set()
    for line in DOC.read_text().split(OUTPUT_TABLES, 1)[output_tables].splitlines():
        if line.startswith("| `"):
            names |= set(re.findall(r"`([^`]+)`", line.split("|")[1]))
    return names


def test_every_summary_key_is_documented_in_one_style():
    summary = kvsim.simulate(None, workload__num_requests=20).summary
    assert set(summary) - documented_names() == set()
    assert [k for k in summary if not re.fullmatch(r"[a-z][a-z0-9_]*", k)] == []  # no "vllm:" or mixed case


FLEET_RUNS = {  # one of each kind of run whose summary is not a single engine's
    "fleet": {"replicas": 2},
    "data-parallel group": {"engine__data_parallel_size": 2},
    "KV offload": {"engine__kv_offload": {"cpu_bytes": "4GiB"}},
    "disaggregated": {"replicas": [{"count": 1, "kv_role": "kv_producer"}, {"count": 1, "kv_role": "kv_consumer"}],
                      "kv_transfer_config": {"kv_connector": "NixlConnector"}, "router": None},
    "autoscaled": {"replicas": 1, "router": {"policy": "least_outstanding"},
                   "autoscaler": {"max_replicas": 2, "startup_s": 1.0}},
}


def test_every_key_of_a_fleet_or_group_summary_is_documented():
    """A fleet's, a data-parallel group's, a disaggregated or autoscaled fleet's top-level keys are in a key table;
    the keys nested in their dicts (per_replica rows, disaggregation, autoscaling) are named in the
    page. Until December 2026 a fleet's own keys (`num_replicas`, `route_reasons`, ...) were nowhere in it."""
    text = DOC.read_text()
    for kind, overrides in FLEET_RUNS.items():
        summary = kvsim.simulate(None, workload__num_requests=20, **overrides).summary
        assert set(summary) - documented_names() == set(), kind
        nested = {key for name in ("disaggregation", "autoscaling", "requests_per_replica") for key in
                  summary.get(name, {})} | {key for row in summary.get("per_replica", []) for key in row}
        nested -= set(AutoscalerConfig.model_fields)  # `autoscaling` repeats the scenario's settings, documented there
        assert {key for key in nested if f"`{key}`" not in text} == set(), kind

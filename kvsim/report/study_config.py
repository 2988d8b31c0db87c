"""The report's knobs (`StudyConfig`): run lengths, load grids, SLO and alert thresholds, workers.

Validated when made, as every user-set section is (`kvsim.model.spec.Settings`: immutable, unknown keys refused,
`true` and inf refused where a number is expected): a bad value is one `KvsimError` line naming the field and the
value. It was a plain dataclass: `StudyConfig(num_requests='x')` was accepted and failed deep in a run, and
`load_fractions=()` or `preemption_window_s=0` failed with an IndexError or a ZeroDivisionError mid-report.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any

from pydantic import Field, field_validator

from kvsim.model.errors import first_repeat
from kvsim.model.spec import WholeSettings

Count = Annotated[int, Field(ge=1)]  # requests, replicas, sequences: at least one
Share = Annotated[float, Field(gt=0)]  # a multiple of a rate: positive


class StudyConfig(WholeSettings):
    """Knobs of the report; `quick` shrinks every sweep for smoke runs and tests. Every field is checked when the
    config is made (and in `model_copy(update=...)`); a bad one is a `KvsimError` naming it and its value."""

    error_name = "cfg"

    num_requests: Count = 200
    # load grid, as fractions of paged KV's sustainable rate: light load to past the knee
    load_fractions: tuple[Share, ...] = Field(default=(0.125, 0.25, 0.5, 0.75, 0.9, 1.0, 1.25, 1.5), min_length=1)
    ttft_slo_s: float = Field(default=2.0, gt=0)
    usage_alert: float = Field(default=0.9, ge=0, le=1)  # a fraction of the KV pool (vllm:kv_cache_usage_perc)
    alert_for_s: float = Field(default=30.0, ge=0)  # Prometheus `for:` (0: at once)
    preemption_rate_alert: float = Field(default=0.1, ge=0)  # preemptions per second over `preemption_window_s`
    preemption_window_s: float = Field(default=60.0, gt=0)
    shared_prefix_counts: tuple[Count, ...] = Field(default=(4, 16, 64), min_length=1)
    workers: Count | None = None  # local processes; None: one per CPU
    dask_address: str | None = Field(default=None, min_length=1)
    gpu_hourly_cost: float | None = Field(default=None, gt=0)  # USD per GPU-hour; None: the GPU's list price
    fleet_requests: Count = 300  # leading requests of the shipped trace the fleet section replays
    fleet_max_replicas: Count = 64  # the fleet section's replica search stops here
    fleet_max_probe_requests: Count = 32_000  # ... its probes, too short to judge, double up to this many requests
    fleet_verify_factor: int = Field(default=10, ge=0)  # ... its answer re-run this many times longer (0: not)
    rate_requests: Count = 400  # the steady-state rate search's first run length (it doubles until converged)
    rate_max_requests: Count = 12_800  # ... up to this many requests per probe (the cap is reported when hit)
    rate_verify_factor: int = Field(default=10, ge=0)  # the answer re-run this many times longer (0: not re-run)
    rate_max_verify_requests: Count = 128_000  # ... with at most this many (10 x rate_max_requests)
    saturate_max_requests: Count = 20_000  # a request-bound saturated run is re-run with more, up to this
    offload_requests: Count = 600  # leading requests of the Mooncake slice the offload section replays
    offload_loads: tuple[Share, ...] = Field(default=(0.5, 1.0, 2.0), min_length=1)  # × the trace's arrival rate
    # batch-size limits (max_num_seqs) the speculative-decoding section runs with and without drafts
    speculation_batch_sizes: tuple[Count, ...] = Field(default=(1, 4, 16, 32, 64, 128, 256), min_length=1)

    @field_validator("load_fractions", "shared_prefix_counts", "offload_loads", "speculation_batch_sizes")
    @classmethod
    def _each_once(cls, values: tuple[float, ...]) -> tuple[float, ...]:
        """A grid point given twice was run twice, a table's row and a figure's point drawn beside themselves."""
        twice = first_repeat(list(values))
        if twice is not None:
            raise ValueError(f"{twice!r} is given twice")
        return values

    def refuse_count_override(self, overrides: Sequence[str]) -> None:
        """Refuse a `--set` of `workload.num_requests` (itself or in a `workload` section): every study runs request
        counts of its own (`num_requests`, `rate_requests`, ...; `Study` sets the base's), so `kvsim report --set
        workload.num_requests=1000` reached no run without a word."""
        from kvsim.model.errors import KvsimError
        from kvsim.workload.overrides import override_items

        for key, value, label in override_items(overrides):
            fields = key.strip().split(".")
            if fields == ["workload", "num_requests"] or \
                    (fields == ["workload"] and isinstance(value, dict) and "num_requests" in value):
                raise KvsimError(f"{label}: kvsim report runs each study with request counts of its own "
                                 f"({self.num_requests} a run at each load here, longer for its rate searches), so "
                                 "it would reach no run; drop it")

    @classmethod
    def quick(cls, **overrides: Any) -> StudyConfig:
        """A smoke run's knobs, `overrides` (fields, as `StudyConfig(...)` takes them) over them and checked as
        theirs: `quick(workers=2)`; an unknown or bad one is the `KvsimError` line `StudyConfig(...)` gives
        (`quick(x=1)` was Python's unexpected-keyword TypeError). Its fleet search probes only the section's 60
        requests and re-runs nothing (the section says so): with the full report's cap and verify factor it doubled
        them to 1,920 on the default scenario (Azure's; shorter windows too short to judge) and verified on 19,200,
        32 of `--quick`'s 46 CPU s."""
        smoke: dict[str, Any] = dict(
            num_requests=60, load_fractions=(0.25, 0.75, 1.0, 1.5), shared_prefix_counts=(4, 16),
            fleet_requests=60, fleet_max_probe_requests=60, fleet_verify_factor=0,  # the fleet: a smoke run
            fleet_max_replicas=8, rate_requests=200, rate_max_requests=800, rate_max_verify_requests=1600,
            saturate_max_requests=3000, offload_requests=60, offload_loads=(1.0,),
            speculation_batch_sizes=(1, 16, 128))
        return cls(**{**smoke, **overrides})

"""How the capacity report's studies run: variants of the base scenario, and the runner they share.

Every study (`kvsim.report.capacity_study`, `paging_study`, `fleet_study`, `offload_study`,
`speculation_study`) takes a `Study` (the base scenario, its `StudyConfig` and the runner) and returns a
`Section` (`kvsim.report.section`; `paging_and_load` three): DataFrames (the CSVs behind the tables and
figures) and facts quoted in the text. `kvsim.report.build` renders them. Runs go through `sweep.run_many`;
each is an ordinary `kvsim run` of a variant of the base scenario (`variant`: so any row can be reproduced
with `kvsim run` and `--set`), and a run asked twice is simulated once (`Study.run`).

"Saturating" runs send three times the workload at once (rate 10^5 req/s), so the engine
holds as many sequences as KV memory allows: their `max_running` is the simulated concurrency
(unless `max_num_seqs` or the request count binds first; the tables show both limits).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import numpy as np

from kvsim.engine.builder import build_engine, make_latency
from kvsim.model.capacity import paged_max_seqs
from kvsim.model.errors import KvsimError, shown
from kvsim.planning.sweep import SweepResult, run_evidence, run_many
from kvsim.report.study_config import StudyConfig
from kvsim.workload.generate import build_requests
from kvsim.workload.overrides import apply_overrides
from kvsim.workload.scenario import Scenario, expect_scenario, make_scenario

SATURATE = 100_000.0  # req/s: far above any GPU's throughput, so the queue never empties (a choice, not a fit)


def variant(base: Scenario, *overrides: str) -> Scenario:
    """`base` with `--set`-style overrides. A slab variant stores every layer's full KV: the Orca
    baselines know no sliding windows, as vLLM with its hybrid KV cache manager disabled. A `base` that is not a
    Scenario (a notebook's path or dict) is refused naming it (it was an AttributeError)."""
    raw = apply_overrides(expect_scenario(base, "base").model_dump(mode="json"), list(overrides))
    if raw["engine"]["allocator"] != "paged":
        raw["engine"]["disable_hybrid_kv_cache_manager"] = True
    return make_scenario(raw, base.base_dir)


def saturated(base: Scenario, num_requests: int, *overrides: str) -> Scenario:
    """A variant of `base` whose 3 × `num_requests` requests all arrive at once; `num_requests` a positive int,
    else a `KvsimError` naming it (a str repeated itself: "5" asked for 555 requests)."""
    if isinstance(num_requests, bool) or not isinstance(num_requests, numbers.Integral) or num_requests < 1:
        raise KvsimError(f"num_requests={shown(num_requests)}: expected a positive int")
    return variant(base, f"workload.num_requests={3 * num_requests}", poisson(SATURATE), *overrides)


def poisson(rate: float) -> str:
    """Override for Poisson arrivals at `rate` req/s, a positive finite number, else a `KvsimError` naming it (a
    trace scenario keeps its lengths, not its timestamps)."""
    if isinstance(rate, bool) or not isinstance(rate, numbers.Real) or not 0 < rate < math.inf:
        raise KvsimError(f"rate={shown(rate)}: expected a positive finite number of requests per second")
    return f"workload.arrival={{process: poisson, rate: {rate}}}"


def sustained(summary: Mapping[str, Any], key: str = "mean_running", digits: int | None = 2) -> float | None:
    """A figure of the run's saturated steady state (`summary["saturated"][key]`: duration_s, mean_running or
    preemptions_per_s), rounded to `digits` (None: as it is); None, shown as missing, when the run never saturated
    (a missing value is never 0). Any other argument is a `KvsimError` naming it (it was a KeyError or TypeError)."""
    if key not in ("duration_s", "mean_running", "preemptions_per_s"):
        raise KvsimError(f"key={shown(key)}: expected duration_s, mean_running or preemptions_per_s")
    figures = summary.get("saturated") if isinstance(summary, Mapping) else None
    if not isinstance(figures, Mapping) or key not in figures:
        raise KvsimError(f"summary={shown(summary)}: expected a run's summary (RunResult.summary)")
    if digits is not None and (isinstance(digits, bool) or not isinstance(digits, numbers.Integral)):
        raise KvsimError(f"digits={shown(digits)}: expected an int or None")
    return figures[key] if figures[key] is None or digits is None else round(figures[key], digits)


class Study:
    """Shared facts about the base scenario and a runner that fixes the request count."""

    def __init__(self, base: Scenario, cfg: StudyConfig) -> None:
        base = expect_scenario(base, "base")
        if not isinstance(cfg, StudyConfig):
            raise KvsimError(f"cfg={shown(cfg)}: expected a StudyConfig (StudyConfig() or StudyConfig.quick())")
        if base.is_fleet:  # each section varies one engine; the fleet section sizes its own replicas
            groups = len(base.replicas) if isinstance(base.replicas, list) else 0
            given = base.replicas if isinstance(base.replicas, int) else f"[{groups} group{'s' * (groups != 1)}]"
            raise KvsimError(f"replicas={given}: kvsim report studies one engine; report on one "
                             "replica with --set replicas=null (dropping any router, autoscaler or "
                             "kv_transfer_config), or size a fleet with kvsim plan")
        if base.workload.max_concurrency is not None:  # its load curves and sustained rates vary the arrival rate
            raise KvsimError(f"workload.max_concurrency={base.workload.max_concurrency}: kvsim report studies "
                             "open-loop traffic at several rates; run it with --set workload.max_concurrency=null")
        multi_turn = base.workload.multi_turn
        if multi_turn is not None and multi_turn.timing == "after_reply":  # follow-ups wait for replies: a closed loop
            raise KvsimError("workload.multi_turn.timing=after_reply: kvsim report studies open-loop traffic at "
                             "several rates; run it with --set workload.multi_turn.timing=open")
        self.base = variant(base, f"workload.num_requests={cfg.num_requests}")
        self.cfg = cfg
        spec = build_engine(self.base, np.random.default_rng(0)).spec  # run's refusals first, in run's words
        self.model, self.gpu, self.max_model_len, self.num_blocks = (spec.model, spec.gpu, spec.max_model_len,
                                                                      spec.num_gpu_blocks)
        self.kv_layout, self.max_num_batched_tokens = spec.kv_layout, spec.limits.max_num_batched_tokens
        requests = build_requests(self.base, self.max_model_len, np.random.default_rng(self.base.seed))
        # the blocks no sequence holds in the paged variants the capacity sections run (vLLM v1's null block; v0: none)
        self.paged_null_blocks = self.base.engine.model_copy(update={"allocator": "paged"}).num_null_blocks
        # sequences of `context_len` tokens a paged pool of `num_blocks` holds, every KV group counted, as
        # `kvsim capacity` counts them (`paged_max_seqs`; `paged_seqs` before rounding down)
        self.paged_fit = partial(paged_max_seqs, self.kv_layout, max_num_batched_tokens=self.max_num_batched_tokens,
                                 num_null_blocks=self.paged_null_blocks)
        # as the scheduler refuses them (`kvsim.sched.admission.Admission.reject_reason`'s first test)
        servable = [r.kv_len for r in requests if r.prompt_len < self.max_model_len]
        self.unservable_fraction = (len(requests) - len(servable)) / len(requests) if requests else 0.0
        if self.unservable_fraction == 1.0:  # every figure would be empty, and the sections' text expects some
            raise KvsimError(f"engine.max_model_len={self.max_model_len}: every request's prompt reaches it "
                             "(prompt_len >= max_model_len), so the engine rejects them all and the report has nothing "
                             "to measure; raise max_model_len or shorten the requests")
        # the mean length the served requests reach (a refused one holds no KV: its output asked, kept since
        # 2f1f57d, and its prompt past max_model_len counted in no sequence the figures describe)
        self.mean_kv_len = float(np.mean(servable)) if servable else 0.0
        self.latency_name = make_latency(spec).name
        self.runs_submitted = self.runs_done = 0  # counted for progress only (`on_runs`)
        self.on_runs: Callable[[], None] | None = None
        self._runs: dict[tuple[str, bool], SweepResult] = {}  # every run so far, by (scenario JSON, keep_steps)

    def saturated(self, *overrides: str, num_requests: int | None = None) -> Scenario:
        """A saturating variant: 3 × `num_requests` (default the report's) requests at once."""
        return saturated(self.base, num_requests or self.cfg.num_requests, *overrides)

    def run_saturated(self, overrides: list[tuple[str, ...]]) -> tuple[list[SweepResult], list[int]]:
        """Saturated runs of each override set, a run re-done with 4× the requests while the request count
        is what capped it (up to `saturate_max_requests`), so that KV memory or max_num_seqs caps it: a
        study that ended request-bound would measure the workload's size, not the engine. Returns the
        runs and the request counts (÷ 3) they used."""
        counts = [self.cfg.num_requests] * len(overrides)
        runs = self.run([self.saturated(*o) for o in overrides])
        while todo := [i for i, r in enumerate(runs) if self.limited_by(r.summary) == "requests"
                       and 3 * 4 * counts[i] <= self.cfg.saturate_max_requests]:
            for i in todo:
                counts[i] *= 4
            for i, run in zip(todo, self.run([self.saturated(*overrides[i], num_requests=counts[i]) for i in todo]),
                              strict=True):
                runs[i] = run
        return runs, counts

    def limited_by(self, summary: dict[str, Any]) -> str:
        """What capped a saturated run's concurrency: KV memory (it preempted, or neither other limit was
        reached), the request count, or max_num_seqs."""
        if summary["num_preemptions"]:
            return "kv"
        if summary["max_running"] >= summary["num_requests"] - summary["num_rejected"]:
            return "requests"
        if summary["max_running"] >= self.base.engine.resolved_max_num_seqs(self.gpu):
            return "max_num_seqs"
        return "kv"

    def count_runs(self, submitted: int, done: int) -> None:
        """Progress only: add to the runs submitted and done, and tell `on_runs`."""
        self.runs_submitted += submitted
        self.runs_done += done
        if self.on_runs is not None:
            self.on_runs()

    def run(self, scenarios: list[Scenario], keep_steps: bool = False) -> list[SweepResult]:
        """`run_many` with the report's workers, counted (`count_runs`). A scenario this report has run already
        (with `keep_steps` the same) is not simulated again: a run is a function of its scenario (seeded), and
        sections ask for the same one (the saturated base engine: the context study's row at the base
        max_model_len, the fp8 study's `auto` row, the paging study's `paged` row). It still counts as a run."""
        keys = [(scenario.model_dump_json(), keep_steps) for scenario in scenarios]
        new = {key: scenario for key, scenario in zip(keys, scenarios, strict=True) if key not in self._runs}
        self.count_runs(len(scenarios), 0)
        ran = run_many(list(new.values()), keep_steps=keep_steps, workers=self.cfg.workers,
                       dask_address=self.cfg.dask_address, on_done=lambda: self.count_runs(0, 1)) if new else []
        self._runs.update(zip(new, ran, strict=True))
        if len(new) < len(scenarios):  # the ones run before are done too
            self.count_runs(0, len(scenarios) - len(new))
        return [self._runs[key] for key in keys]

    def evidence(self, scenarios: list[Any]) -> list[dict[str, Any]]:
        """Each run's steady-state window evidence (`kvsim.planning.steady_state.window_evidence`)."""
        return run_evidence(scenarios, workers=self.cfg.workers, dask_address=self.cfg.dask_address)

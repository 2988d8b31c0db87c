"""The capacity report's experiments: which runs answer each question, reduced to tables.

Every study takes a `Study` (the base scenario, its `StudyConfig` and the runner) and returns a
`Section` (`paging_and_load` three): DataFrames (the CSVs behind the tables and figures) and facts
quoted in the text. `kvsim.report.build` renders them. Runs go through `sweep.run_many`; each is an
ordinary `kvsim run` of a variant of the base scenario (so any row can be reproduced with `kvsim run`
and `--set`).

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
import pandas as pd

from kvsim.engine.builder import build_engine, make_latency
from kvsim.kv import fig2_shares
from kvsim.model.capacity import (
    model_kv_layout,
    model_max_concurrency,
    num_gpu_blocks,
    paged_max_seqs,
    paged_seqs,
    slab_max_seqs,
)
from kvsim.model.errors import KvsimError, shown
from kvsim.planning.cost import cost_per_million_output_tokens, cost_per_user_hour, engine_gpus, gpu_price, usd_rounded
from kvsim.planning.slo import probe_passes, why_failed
from kvsim.planning.steady_state import failing_evidence, search_rates
from kvsim.planning.sweep import SweepResult, run_evidence, run_many
from kvsim.report.alerts import alert_firings
from kvsim.report.applicable import inapplicable, refusal, refused_settings, skipped
from kvsim.report.by_priority import latency_by_priority
from kvsim.report.no_preemption import largest_seqs_without_preemption
from kvsim.report.section import Section
from kvsim.report.study_config import StudyConfig
from kvsim.workload.generate import build_requests
from kvsim.workload.overrides import apply_overrides
from kvsim.workload.scenario import Scenario, expect_scenario, make_scenario

SATURATE = 100_000.0  # req/s: far above any GPU's throughput, so the queue never empties (a choice, not a fit)
ALLOCATORS = ("slab-max", "slab-pow2", "slab-oracle", "paged")


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


CONTEXT_TITLE = "Context ↔ concurrency"


def context_lengths(st: Study) -> tuple[list[int], dict[str, str]]:
    """The context section's max_model_len grid (1,024 to 16,384 tokens, within the model's context) that this
    engine takes, and those it refuses (`engine.max_model_len=N` → the refusal: its pool cannot hold one request
    of N tokens, as vLLM refuses to start). The user's own max_model_len fits (`Study` checks it); a grid length
    above it may not, and with a max_model_len under 1,024 none may."""
    lengths = {f"engine.max_model_len={n}": n for n in (1024, 2048, 4096, 8192, 16384)
               if n <= st.model.max_position_embeddings}
    refused = refused_settings({setting: partial(st.saturated, setting) for setting in lengths})
    return [n for setting, n in lengths.items() if setting not in refused], refused


def context_concurrency(st: Study) -> Section:
    """Max concurrent sequences vs max_model_len: closed form and simulated, paged and slab-max (its columns
    left out, with the refusal in `left_out`, when this engine cannot take slab-max). A max_model_len of the grid
    this engine refuses is left out the same way (`context_lengths`): a pool that holds the user's max_model_len
    need not hold 16,384 tokens, and that refusal ended the report."""
    lens, refused = context_lengths(st)
    if not lens:
        return inapplicable("context", CONTEXT_TITLE, f"this engine's pool cannot hold one request of any "
                            f"max_model_len of the section's grid ({', '.join(n.split('=')[1] for n in refused)} "
                            f"tokens; kvsim refuses the shortest with \"{next(iter(refused.values()))}\").")
    slab_setting = "engine.allocator=slab-max"
    refused |= refused_settings({slab_setting: lambda: st.saturated(f"engine.max_model_len={lens[0]}", slab_setting)})
    allocators = ("paged",) if slab_setting in refused else ("paged", "slab-max")
    runs, _ = st.run_saturated([(f"engine.max_model_len={n}", f"engine.allocator={a}")
                                for n in lens for a in allocators])
    bs, rows = st.base.engine.block_size, []
    for i, n in enumerate(lens):
        paged = runs[len(allocators) * i].summary
        rows.append({
            "max_model_len": n,
            "closed_form_paged_at_mean_len": st.paged_fit(st.num_blocks, round(st.mean_kv_len)),
            "closed_form_slab_max": slab_max_seqs(st.num_blocks * bs, n),  # slab pools have no null block
            "vllm_max_concurrency": round(model_max_concurrency(st.model, st.gpu, st.base.engine, st.num_blocks, n), 2),
            "simulated_paged_sustained": sustained(paged),
            "simulated_slab_sustained": sustained(runs[2 * i + 1].summary) if len(allocators) == 2 else None,
            "paged_peak_transient": paged["max_running"],
            "paged_kv_usage_max": round(paged["kv_cache_usage_perc"]["max"], 3),
            "paged_limited_by": st.limited_by(paged),
            "num_rejected": paged["num_rejected"],
        })
    table = pd.DataFrame(rows)
    if len(allocators) == 1:  # no slab-max engine to compare with: its closed form goes with its runs
        table = table.drop(columns=["closed_form_slab_max", "simulated_slab_sustained"])
    return Section("context", CONTEXT_TITLE, {"context_concurrency": table},
                   {"mean_kv_len": st.mean_kv_len, "num_gpu_blocks": st.num_blocks, "left_out": refused})


def kv_quantization(st: Study) -> Section:
    """fp8 vs auto KV: blocks, concurrency, and TPOT saturated and at the base rate."""
    dtypes = ("auto", "fp8")
    sat, _ = st.run_saturated([(f"engine.kv_cache_dtype={d}",) for d in dtypes])
    base = st.run([variant(st.base, f"engine.kv_cache_dtype={d}") for d in dtypes])
    rows = []
    for d, s, b in zip(dtypes, sat, base, strict=True):
        engine = st.base.engine.model_copy(update={"kv_cache_dtype": d})
        blocks = num_gpu_blocks(st.model, st.gpu, engine)
        rows.append({
            "kv_cache_dtype": d, "bytes_per_block": model_kv_layout(st.model, engine).bytes_per_block,
            "num_gpu_blocks": blocks, "closed_form_paged_at_mean_len": st.paged_fit(
                blocks, round(st.mean_kv_len), num_null_blocks=engine.num_null_blocks),
            "simulated_sustained_running": sustained(s.summary),
            "peak_running_transient": s.summary["max_running"],
            "tpot_mean_s_saturated": s.summary["tpot_s"]["mean"],
            "tpot_mean_s_at_base_rate": b.summary["tpot_s"]["mean"],
            "ttft_p90_s_at_base_rate": b.summary["ttft_s"]["p90"],
            "limited_by": st.limited_by(s.summary),
        })
    return Section("fp8", "KV quantization (fp8)", {"kv_quantization": pd.DataFrame(rows)})


PREFIX_TITLE = "Prefix sharing"


def prefix_sharing(st: Study) -> Section:
    """KV usage and TTFT vs the number of requests sharing one system prompt, caching off and on (the off
    rows left out, with the refusal in `left_out`, when this engine cannot turn caching off). When the system
    prompt takes every one of the largest count's prompts to max_model_len, the section is `inapplicable`:
    its runs would serve no request (its text read a None TTFT: a TypeError traceback)."""
    prefix = min(2000, st.max_model_len // 2)

    def shared(n: int, caching: bool) -> Scenario:
        return variant(st.base, f"workload.num_requests={n}", f"workload.shared_prefix.tokens={prefix}",
                       "workload.shared_prefix.fraction=1.0", f"engine.enable_prefix_caching={str(caching).lower()}")

    biggest = max(st.cfg.shared_prefix_counts)
    probe = shared(biggest, True)
    if all(r.prompt_len >= st.max_model_len for r in build_requests(probe, st.max_model_len,
                                                                    np.random.default_rng(probe.seed))):
        return inapplicable("prefix", PREFIX_TITLE, f"with the section's {prefix:,}-token system prompt before each "
                            f"prompt, every one of its {biggest} requests has a prompt of max_model_len "
                            f"({st.max_model_len:,} tokens) or more, which this engine refuses (as vLLM does): no "
                            "request would be served, with prefix caching or without.")
    off = "engine.enable_prefix_caching=false"
    refused = refused_settings({off: lambda: shared(st.cfg.shared_prefix_counts[0], False)})
    jobs = [(n, c) for n in st.cfg.shared_prefix_counts for c in (False, True) if c or not refused]
    runs = st.run([shared(n, c) for n, c in jobs])
    rows = [{"num_requests": n, "prefix_caching": c, "shared_prefix_tokens": prefix,
             "kv_usage_max": r.summary["kv_cache_usage_perc"]["max"], "ttft_mean_s": r.summary["ttft_s"]["mean"],
             "prefix_cache_hit_rate": r.summary["prefix_cache_hit_rate"],
             "sharing_saving": round(r.summary["sharing_saving"], 4)} for (n, c), r in zip(jobs, runs, strict=True)]
    return Section("prefix", PREFIX_TITLE, {"prefix_sharing": pd.DataFrame(rows)},
                   {"prefix_tokens": prefix, "left_out": refused})


FORMULA_TITLE = "The capacity formula"
FORMULA_SETTING = "prefix caching off (`engine.enable_prefix_caching=false`), which every run of this section uses"


def capacity_formula(st: Study) -> Section:
    """Fit sustained seqs ≈ k · closed form to saturated paged runs, the closed form being `paged_seqs` (what
    `kvsim capacity` counts, before rounding down): pool_blocks / blocks_per_seq with full attention only; a
    sliding-window or chunked group counts the blocks its window holds, and the last sequence admitted its
    prompt's chunk (`blocks_per_seq` is what one holds decoding, `KVLayout.decode_blocks`).

    Rows: fixed lengths (prompt c/2 + output c/2) at several context lengths c, and the
    scenario's own length mix (c = its mean prompt + output). Each row reports the three
    concurrency figures of a saturated run: the *sustained* concurrency (time-averaged
    running while requests queue) with its preemption rate, the largest `max_num_seqs` that
    ran with no preemption (bisection), and the peak (an admission transient, when every
    sequence holds only its prompt). k is fitted on the sustained figure of KV-bound rows.

    Every run turns prefix caching off (a sequence's blocks are its own); an engine that cannot turn it
    off gets the section skipped with its refusal (`kvsim.report.applicable`).
    """
    contexts = [c for c in (256, 512, 1024, 2048, 4096) if c <= st.max_model_len]
    fixed = [(f"prompt {c // 2} + output {c - c // 2}", c,
              ("workload.trace=null", "workload.shared_prefix=null",
               f"workload.prompt_len={{dist: fixed, value: {c // 2}}}",
               f"workload.output_len={{dist: fixed, value: {c - c // 2}}}")) for c in contexts]
    rows_spec = [*fixed, ("scenario length mix", round(st.mean_kv_len), ())]
    common = ("engine.allocator=paged", "engine.enable_prefix_caching=false")
    reason = refusal(lambda: st.saturated(*common, *rows_spec[0][2]))
    if reason is not None:
        return skipped("formula", FORMULA_TITLE, FORMULA_SETTING, reason)
    rows = [(*common, *extra) for _, _, extra in rows_spec]
    runs, counts = st.run_saturated(rows)
    no_preemption = largest_seqs_without_preemption(
        lambda i, seqs: st.saturated(*rows[i], f"engine.max_num_seqs={seqs}", num_requests=counts[i]), st.run, runs)
    usable = st.num_blocks - st.paged_null_blocks
    lens = [c for _, c, _ in rows_spec]
    closed = np.array([float(paged_seqs(st.kv_layout, st.num_blocks, c, st.max_num_batched_tokens,
                                        num_null_blocks=st.paged_null_blocks)) for c in lens])
    running = np.array([sustained(r.summary, digits=None) for r in runs], dtype=float)  # None → NaN
    limits = [st.limited_by(r.summary) for r in runs]
    kv_bound = np.array([lim == "kv" for lim in limits]) & ~np.isnan(running)  # a run never saturated says nothing
    # Fit only where KV memory was the limit; elsewhere the count says nothing about the formula.
    k = k_fixed = float("nan")
    if kv_bound.any():
        k = float((running * closed)[kv_bound].sum() / (closed**2)[kv_bound].sum())
    fixed_bound = kv_bound[: len(fixed)]
    if fixed_bound.any():
        c_f, s_f = closed[: len(fixed)][fixed_bound], running[: len(fixed)][fixed_bound]
        k_fixed = float((s_f * c_f).sum() / (c_f**2).sum())
    table = pd.DataFrame({
        "lengths": [name for name, _, _ in rows_spec], "context_len": lens,
        "blocks_per_seq": [st.kv_layout.decode_blocks(c) for c in lens], "closed_form_seqs": closed.round(2),
        "sustained_running": running.round(2),
        "preemptions_per_s": [sustained(r.summary, "preemptions_per_s", 3) for r in runs],
        "max_seqs_without_preemption": no_preemption,
        "peak_running_transient": [r.summary["max_running"] for r in runs],
        "sustained_over_closed_form": (running / closed).round(3),
        "fitted_seqs": (k * closed).round(2), "limited_by": limits})
    return Section("formula", FORMULA_TITLE, {"capacity_formula": table},
                   {"fitted_constant": k, "fitted_constant_fixed": k_fixed, "pool_blocks": usable,
                    "num_kv_bound": int(kv_bound.sum()), "other_limits": sorted(set(limits) - {"kv"}),
                    "vllm_max_concurrency": model_max_concurrency(st.model, st.gpu, st.base.engine, st.num_blocks,
                                                                   st.max_model_len)})


def paging_and_load(st: Study) -> tuple[Section, Section, Section]:
    """Waste per allocator, sustainable rate under the TTFT SLO, load curves and alerts (paged).

    A slab allocator this engine cannot take has no rows (its refusal in the paging section's `left_out`);
    the load runs are paged (`load_and_alerts`).
    """
    refused = refused_settings({f"engine.allocator={a}": partial(st.saturated, f"engine.allocator={a}")
                                for a in ALLOCATORS if a != "paged"})
    allocators = tuple(a for a in ALLOCATORS if f"engine.allocator={a}" not in refused)
    sat, _ = st.run_saturated([(f"engine.allocator={a}",) for a in allocators])
    rates_df = sustained_rates(st, allocators)
    load_section, alerts = load_and_alerts(st, rates_df)
    waste_rows = []
    for a, result in zip(allocators, sat, strict=True):
        shares = fig2_shares(result.summary["saturated"]["waste"])  # whole pool, while requests queue
        waste_rows.append({"allocator": a, **{k: round(v, 4) for k, v in shares.items()},
                           "sustained_running": sustained(result.summary),
                           "max_running": result.summary["max_running"],
                           "kv_usage_max": round(result.summary["kv_cache_usage_perc"]["max"], 4),
                           "limited_by": st.limited_by(result.summary)})
    paging = Section("paging", "Paging multiplier", {"waste_breakdown": pd.DataFrame(waste_rows),
                                                   "sustained_rate": rates_df}, {"left_out": refused})
    return paging, load_section, alerts


def load_and_alerts(st: Study, rates_df: pd.DataFrame) -> tuple[Section, Section]:
    """Load curves (per priority class too, when the workload has classes) and alerts, paged, from the paged
    row of `rates_df` (`sustained_rates`; the paged rate searched alone is the one searched beside the slab
    allocators: each search asks for its own runs, and a run is a function of its scenario).

    The load grid is `load_fractions` of paged KV's sustainable rate (the SLO's knee sits inside it);
    when nothing is sustainable it falls back to 1 req/s times the fractions.
    """
    cfg = st.cfg
    knee = rates_df.loc[rates_df.allocator == "paged", "max_rate_meeting_slo"].item()
    grid = [round((knee or 1.0) * f, 4) for f in cfg.load_fractions]
    paged_row = rates_df[rates_df.allocator == "paged"].iloc[0]
    # As long as the rate search's converged probes (at least 3 × num_requests, so that saturation lasts past
    # the alerts' `for:`), judged over the same window.
    num_load = max(3 * cfg.num_requests, int(paged_row.requests_per_probe or 0))
    load = run_many([variant(st.base, "engine.allocator=paged", poisson(r), f"workload.num_requests={num_load}")
                     for r in grid], keep_steps=True, workers=cfg.workers, dask_address=cfg.dask_address,
                    evidence=True)
    slo = {"ttft_s.p90": cfg.ttft_slo_s}
    load_rows = []
    for rate, r in zip(grid, load, strict=True):
        ev = r.evidence
        assert ev is not None
        load_rows.append({"rate": rate, "fraction_of_sustainable": rate / knee if knee else None,
                          "num_requests": num_load, "verdict": ev["verdict"],
                          **{f"{m}_{p}_s": ev[f"{m}_s"][p] for m in ("ttft", "tpot") for p in ("p50", "p90", "p99")},
                          "meets_slo": probe_passes(ev, slo), "num_preemptions": r.summary["num_preemptions"],
                          "served_per_s": ev["served_per_s"], "served_over_offered": ev["served_over_offered"]})
    paged_runs = list(zip(grid, load, strict=True))
    top_rate, top = paged_runs[-1]
    assert top.steps is not None, "load runs keep their steps"
    series = top.steps[["time_s", "vllm:num_requests_running", "vllm:num_requests_waiting",
                        "vllm:kv_cache_usage_perc", "vllm:num_preemptions_total"]].copy()
    load_tables = {"load_curves": pd.DataFrame(load_rows)}
    by_class = latency_by_priority(grid, load)
    if by_class["priority"].nunique() > 1:  # a workload with priority classes: each class's latency per load
        load_tables["load_by_priority"] = by_class
    load_section = Section("load", "Load", {**load_tables, "time_series": series},
                           {"time_series_rate": top_rate, "sustainable_rate": knee, "ttft_slo_s": cfg.ttft_slo_s})
    alerts = Section("alerts", "Alerts", {"alert_firings": alert_firings(paged_runs, cfg)})
    return load_section, alerts


def sustained_rates(st: Study, allocators: tuple[str, ...] = ALLOCATORS) -> pd.DataFrame:
    """Per allocator of `allocators`, the highest Poisson rate that is sustainable under the TTFT SLO
    (`kvsim.planning.steady_state`: stable over a measurement window, p90 TTFT over the requests that
    arrived in it), the run length grown until the rate moves < 2 % when it doubles; then that answer is
    run `rate_verify_factor` (10) × longer, backed off (3 %, doubling) while those long runs fail and raised
    while they hold, then bisected between them to within 3 %, so the rate printed is one that held in the
    long run with a failed long run at most 3 % above (`search_rate` is the answer before verification).
    The rates (`max_rate_meeting_slo`, `first_failing_rate`, `search_rate`) are the Poisson rates asked of the
    arrival generator, the search's variable; `offered_rate_in_window` is the rate the answer's measurement
    window actually got (one seed's Poisson draw: a few % off either way). `capacity --sustained` shows the
    window's served rate, which a stable window keeps within noise of its offered one.

    Throughput, concurrency and cost are the window's at that rate (the drain left out), so the $/M
    tokens and $/user-hour price a steady state, not a burst.
    """
    slo = {"ttft_s.p90": st.cfg.ttft_slo_s}
    searches = search_rates(
        lambda i, rate, n: variant(st.base, f"engine.allocator={allocators[i]}", poisson(rate),
                                   f"workload.num_requests={n}", "steps=none"),
        len(allocators), slo, st.evidence, num_requests=st.cfg.rate_requests, max_requests=st.cfg.rate_max_requests,
        verify_factor=st.cfg.rate_verify_factor, max_verify_requests=st.cfg.rate_max_verify_requests)
    rows = []
    for a, s in zip(allocators, searches, strict=True):
        ev, failed = s.evidence, failing_evidence(s)
        level = s.answer_level()
        ci = ev["ttft_s"]["p90_ci"] if ev else (None, None)
        rows.append({"allocator": a, "max_rate_meeting_slo": round(s.rate, 4) if s.rate else None,
                     "offered_rate_in_window": round(ev["offered_per_s"], 4) if ev else None,
                     "first_failing_rate": round(s.failed_rate, 4) if s.failed_rate else None,
                     "fails_by": why_failed(failed, slo), "requests_per_probe": level.num_requests if level else None,
                     "converged": s.converged, "capped": s.capped, "num_probes": s.summary()["num_probes"],
                     "search_rate": round(s.search_rate, 4) if s.search_rate else None, "verified": s.verified,
                     "verify_num_requests": ev["num_requests"] if ev and s.long_runs else None,
                     "num_long_runs": len(s.long_runs),
                     "verdict": ev["verdict"] if ev else None,
                     "window_s": round(ev["window_s"], 1) if ev else None,
                     "num_in_window": ev["num_in_window"] if ev else None,
                     "served_over_offered": _round(ev["served_over_offered"]) if ev else None,
                     "backlog_trend": _round(ev["backlog_trend"]) if ev else None,
                     "ttft_p90_s": _round(ev["ttft_s"]["p90"]) if ev else None,
                     "ttft_p90_ci_low_s": _round(ci[0]), "ttft_p90_ci_high_s": _round(ci[1]),
                     "rejected_fraction": _round(ev["rejected_fraction"]) if ev else None,
                     "output_tokens_per_s": round(ev["output_tokens_per_s"], 1) if ev else None,
                     "mean_running": round(ev["mean_running"], 2) if ev else None})
    df = pd.DataFrame(rows)
    price = gpu_price(st.gpu.name, st.cfg.gpu_hourly_cost)
    num_gpus = engine_gpus(st.base.engine)  # every DP engine serves the rate whose tokens are priced
    df["usd_per_concurrent_user_hour"] = [usd_rounded(cost_per_user_hour(price, num_gpus, c)) if c else None
                                          for c in df.mean_running]
    df["usd_per_million_output_tokens"] = [usd_rounded(cost_per_million_output_tokens(price, num_gpus, t or 0.0))
                                           for t in df.output_tokens_per_s]
    df["price_source"] = price.source
    paged = df.loc[df.allocator == "paged", "max_rate_meeting_slo"].item()
    df["paging_multiplier"] = [round(paged / r, 2) if r and paged else None for r in df.max_rate_meeting_slo]
    return df


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)

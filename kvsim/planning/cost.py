"""What a GPU-hour buys: cost per concurrent user-hour and per million output tokens.

    cost per concurrent user-hour   = usd_per_gpu_hour · num_gpus / concurrent sequences
    cost per million output tokens  = usd_per_gpu_hour · num_gpus / (output tokens/s · 3600) · 10^6

`num_gpus` is what the figure's throughput ran on: the tensor-parallel size for one engine's closed form,
`engine_gpus` (TP × DP) for a simulated replica, whose `data_parallel_size` engines all serve its traffic.
`kvsim capacity` prices the closed-form
concurrency and the roofline's closed-form cohort rate (`add_capacity_costs`); `kvsim report`
prices the concurrency and output rate simulated at the sustained request rate. Defaults come from
`kvsim/model/presets/gpu_prices.yaml`: list on-demand cloud prices of one provider as of a date,
stated beside every figure; a planner's own price (`--gpu-hourly-cost`) replaces them.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import yaml

from kvsim.model.errors import KvsimError, cut
from kvsim.model.yaml_io import TEXT_ENCODING

PRICES = Path(__file__).parents[1] / "model" / "presets" / "gpu_prices.yaml"


@dataclass(frozen=True, slots=True)
class GpuPrice:
    usd_per_gpu_hour: float | None
    source: str


@cache
def _price_table() -> dict:
    return yaml.safe_load(PRICES.read_text(encoding=TEXT_ENCODING))


def gpu_price(gpu_name: str, usd_per_gpu_hour: float | None = None) -> GpuPrice:
    """The user's price when given (must be > 0), else the preset's list on-demand price, else none."""
    if usd_per_gpu_hour is not None:
        if not 0 < usd_per_gpu_hour < math.inf:
            raise KvsimError(f"gpu_hourly_cost={usd_per_gpu_hour}: must be a positive, finite price in USD per "
                             "GPU-hour")
        return GpuPrice(float(usd_per_gpu_hour), "given (--gpu-hourly-cost)")
    table = _price_table()
    price = table["usd_per_gpu_hour"].get(gpu_name)
    if price is None:
        return GpuPrice(None, f"no default price for {gpu_name}: pass --gpu-hourly-cost")
    return GpuPrice(float(price), f"list on-demand price as of {table['as_of']}: {table['source']}")


def engine_gpus(engine: Any) -> int:
    """The GPUs one simulated replica runs on (`engine`: an `EngineConfig`): `data_parallel_size` engines
    of `tensor_parallel_size` GPUs each, all serving the traffic its output rate is measured on."""
    return int(engine.tensor_parallel_size * engine.data_parallel_size)


def cost_per_user_hour(price: GpuPrice, num_gpus: int, concurrency: float) -> float | None:
    """USD per concurrent user (sequence) per hour; None without a price or a positive concurrency."""
    if price.usd_per_gpu_hour is None or concurrency <= 0:
        return None
    return _finite(price.usd_per_gpu_hour * num_gpus / concurrency, price, num_gpus,
                   f"a concurrent user-hour at {concurrency:g} sequences")


def cost_per_million_output_tokens(price: GpuPrice, num_gpus: int, output_tokens_per_s: float) -> float | None:
    """USD per million generated tokens at a throughput; None without a price or a positive throughput. The hourly
    price is scaled by the hours a million tokens take, in one product: divided by the tokens an hour first, a
    price of $1e-320 an hour fell below the smallest float and read $0 per million tokens."""
    if price.usd_per_gpu_hour is None or output_tokens_per_s <= 0:
        return None
    return _finite(price.usd_per_gpu_hour * num_gpus * (1e6 / (output_tokens_per_s * 3600)), price, num_gpus,
                   f"a million output tokens at {output_tokens_per_s:g} tokens/s")


def _finite(usd: float, price: GpuPrice, num_gpus: int, what: str) -> float:
    """`usd`, a figure priced at `price` on `num_gpus` GPUs, or a `KvsimError` naming the price when it overflowed a
    float: `kvsim capacity --gpu-hourly-cost 1e308 -tp 8` printed inf per user-hour and per million tokens, exit 0
    (a price is checked positive and finite, `gpu_price`, but not its products)."""
    if not math.isfinite(usd):
        raise KvsimError(f"gpu_hourly_cost={price.usd_per_gpu_hour:g}: the USD for {what} on {num_gpus} GPU"
                         f"{'s' if num_gpus != 1 else ''} overflows a float (past {sys.float_info.max:.4g})")
    return usd


def window_output_tokens_per_s(metrics: dict[str, Any]) -> float:
    """The output tokens a second a run serves in steady state: those of the requests finishing inside its
    measurement window, over the window's length (`kvsim.planning.window.window_evidence`). A run's whole-run
    `output_tokens_per_s` (summary) divides by first arrival → last finish, warm-up and drain included, so
    it understates the rate the traffic is served at, the more the shorter the run; every USD per million
    tokens is priced at this one."""
    return float(metrics["evidence"]["output_tokens_per_s"])


def closed_form_output_rate(model: Any, gpu: Any, engine: Any) -> Callable[[int, int], float]:
    """`kvsim capacity`'s closed-form output rate, (sequences, context length) → output tokens/s: the roofline's
    cohort rate (`kvsim.latency.roofline.cohort_output_tokens_per_s`) on `engine`, and under speculative decoding
    its verify steps with the drafter's passes priced on top (`kvsim.latency.speculative`) emitting the
    acceptance model's mean acceptance length a step (`kvsim.sched.speculative.acceptance_model`). Its steps are
    CUDA-graph padded as a simulated run's of `engine` are (`kvsim.latency.cudagraph.engine_padding`, at the
    engine's resolved limits)."""
    from functools import partial

    from kvsim.latency.cudagraph import engine_padding
    from kvsim.latency.roofline import RooflineLatency, cohort_output_tokens_per_s
    from kvsim.latency.speculative import speculative_latency
    from kvsim.sched.speculative import acceptance_model

    max_num_batched_tokens = engine.resolved_max_num_batched_tokens(engine.resolved_max_model_len(model), gpu)
    target = RooflineLatency(model, gpu, engine,
                             padding=engine_padding(engine, engine.resolved_max_num_seqs(gpu), max_num_batched_tokens))
    spec = engine.speculative_config
    if spec is None:
        return partial(cohort_output_tokens_per_s, target)
    return partial(cohort_output_tokens_per_s, speculative_latency(target, model, gpu, engine),
                   num_speculative_tokens=spec.num_speculative_tokens,
                   acceptance_length=acceptance_model(spec).mean_acceptance_length)


def add_capacity_costs(plan: dict, price: GpuPrice, num_gpus: int, max_num_seqs: int,
                       output_tokens_per_s: Callable[[int, int], float]) -> dict:
    """`kvsim capacity`'s plan with the price and, per row, the sequences that run at once (the row's
    closed-form paged concurrency, every sequence at that context length, capped by `max_num_seqs`; under
    speculative decoding each holds its drafts and lookahead too: `paged_max_seqs_with_drafts`),
    USD per concurrent user-hour at that concurrency, and USD per million output tokens at
    `output_tokens_per_s(sequences, context_len)` (the CLI passes `closed_form_output_rate`: the roofline's
    closed-form cohort rate, prompt c/2 + output c/2, no queueing, with speculative decoding's acceptance
    length and drafter cost when the engine speculates).

    Both are planning estimates; `kvsim report` gives both at a simulated sustained rate.
    """
    rows = []
    for row in plan["rows"]:
        with_drafts = row.get("paged_max_seqs_with_drafts")  # set when the engine speculates
        seqs = min(row["paged_max_seqs"] if with_drafts is None else with_drafts, max_num_seqs)
        rate = output_tokens_per_s(seqs, row["context_len"]) if seqs > 0 else 0.0
        rows.append({**row, "concurrent_sequences": seqs,
                     "usd_per_concurrent_user_hour": usd_rounded(cost_per_user_hour(price, num_gpus, seqs)),
                     "output_tokens_per_s_closed_form": round(rate, 1),
                     "usd_per_million_output_tokens": usd_rounded(
                         cost_per_million_output_tokens(price, num_gpus, rate))})
    return {**plan, "gpu_price_usd_per_gpu_hour": price.usd_per_gpu_hour, "gpu_price_source": price.source,
            "rows": rows}


USD_SIGNIFICANT_DIGITS = 4


def usd_rounded(value: float | None) -> float | None:
    """A price as printed, to `USD_SIGNIFICANT_DIGITS` significant digits (None stays None), so it scales with the
    hourly price whatever its size. To 4 decimals, a cheap GPU-hour's prices lost their digits: $2 an hour over 434
    sequences, $0.004608 per user-hour, printed 0.0046; at $0.10 an hour 0.0002, not 0.0002304.

    One amount summed two ways prints (and `kvsim.planning.plan.rank` compares) alike: its float noise is dropped
    at 12 digits first. Rounded at once, 3 GPUs at $33.35 (100.05000000000001) read 100.1 and 15 at $6.67
    (100.05) 100.0, where the noise straddles the 4th digit's half-way point."""
    if value is None:
        return None
    return float(f"{float(f'{value:.12g}'):.{USD_SIGNIFICANT_DIGITS}g}")


def add_sustained_costs(plan: dict, price: GpuPrice, num_gpus: int, scenario_for: Callable[[int], Any],
                        num_requests: int = 200, max_requests: int = 3200,
                        warn: Callable[[str], None] = lambda text: None) -> dict:
    """`kvsim capacity --sustained`: per row within max_model_len, the rate one replica sustains
    (`kvsim.planning.steady_state`, stability alone: no latency SLO, so this is its capacity) on
    `scenario_for(context_len)`'s fixed lengths, and USD per million output tokens at the output rate
    measured over that probe's window (warm-up and drain left out), beside the closed-form figure.

    The rate is the requests per second the highest stable probe served over its window, not the Poisson
    rate that probe asked for: a short run's arrivals offer that rate only up to sampling noise, and the
    same in every probe of a run length (one seed, arrivals scaled by 1 / rate), which the doubling of the
    run length does not wash out because each run repeats the shorter one's requests first. With 400
    requests a probe asked for 28.8 req/s offered 25.9 over its window and served 25.0, the exact
    capacity of that engine (`tests/test_cli_capacity.py`). The context lengths no probe can run at are said
    in one line to `warn` (their sustained cells are empty: with none left, `--sustained` added nothing, and the
    CSV and the table left its columns out without a word)."""
    from functools import partial

    from kvsim.planning.steady_state import search_rates
    from kvsim.planning.sweep import run_evidence
    from kvsim.workload.scenario import make_scenario

    rows = [r for r in plan["rows"] if r.get("paged_max_seqs", 0) > 0 and r["context_len"] >= 2]  # prompt + output
    skipped = [str(r["context_len"]) for r in plan["rows"] if r not in rows]
    if skipped:
        lengths = "context length" if len(skipped) == 1 else "context lengths"
        warn(f"--sustained: no probe at {lengths} {cut(', '.join(skipped))}: a probe needs 2 tokens or more (a "
             f"prompt and an output), at most max_model_len={plan['max_model_len']}, and a KV cache that holds one")
    bases = [scenario_for(r["context_len"]) for r in rows]

    def make(i: int, rate: float, n: int) -> Any:
        raw = bases[i].model_dump(mode="json")
        raw["workload"].update(arrival={"process": "poisson", "rate": rate}, num_requests=n)
        return make_scenario(raw, bases[i].base_dir)

    searches = search_rates(make, len(rows), {}, partial(run_evidence, workers=1), num_requests=num_requests,
                            max_requests=max_requests)
    found = {r["context_len"]: s for r, s in zip(rows, searches, strict=True)}
    out = []
    for row in plan["rows"]:
        s = found.get(row["context_len"])
        ev = s.evidence if s is not None else None
        tokens = ev["output_tokens_per_s"] if ev else 0.0
        out.append({**row, "sustained_rate_per_s": round(ev["served_per_s"], 3) if ev else None,
                    "sustained_requests_per_probe": (lv.num_requests if s is not None and (lv := s.answer_level())
                                                     else None),
                    "sustained_converged": s.converged if s is not None else None,
                    "output_tokens_per_s_sustained": round(tokens, 1) if ev else None,
                    "usd_per_million_output_tokens_sustained":
                        usd_rounded(cost_per_million_output_tokens(price, num_gpus, tokens)) if ev else None})
    return {**plan, "rows": out}

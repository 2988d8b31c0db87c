"""The capacity report's capacity sections: how many sequences KV memory holds as one setting varies.

`context_concurrency` (max_model_len), `kv_quantization` (the KV cache dtype), `prefix_sharing` (requests sharing
one system prompt, prefix caching off and on) and `capacity_formula` (the closed form, `kvsim capacity`'s count,
fitted to the saturated runs). Each takes a `Study` (`kvsim.report.studies`) and returns its `Section`; a
setting this engine refuses is left out or the section skipped, with the refusal (`kvsim.report.applicable`).
"""

from __future__ import annotations

from functools import partial

import numpy as np
import pandas as pd

from kvsim.model.capacity import (
    model_kv_layout,
    model_max_concurrency,
    num_gpu_blocks,
    paged_seqs,
    slab_max_seqs,
)
from kvsim.report.applicable import inapplicable, refusal, refused_settings, skipped
from kvsim.report.no_preemption import largest_seqs_without_preemption
from kvsim.report.section import Section
from kvsim.report.studies import Study, sustained, variant
from kvsim.workload.generate import build_requests
from kvsim.workload.scenario import Scenario

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


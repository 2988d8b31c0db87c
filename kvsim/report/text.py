"""The report's sentences, each computed from the runs it describes (no fixed conclusions).

Every function takes a section's tables and facts and says what they show: which limit
capped the runs, how far the simulation sits from the closed forms, what sharing and fp8
buy, and what a user-hour and a million tokens cost at the sustained rate.
"""

from __future__ import annotations

import pandas as pd

from kvsim.model.units import dollars, share
from kvsim.report import studies
from kvsim.report.applicable import left_out_text, skipped_text
from kvsim.report.fleet_text import fleet_text
from kvsim.report.section import Section
from kvsim.report.speculation_study import speculation_text


def introduction(st: studies.Study) -> str:
    """What was simulated, from the resolved configuration (not the scenario's free-text description)."""
    e = st.base.engine
    tp = f"{e.tensor_parallel_size}× " if e.tensor_parallel_size > 1 else "one "
    refused = ""
    if st.unservable_fraction > 0.5:
        refused = (f" **Most of this traffic cannot be served: {st.unservable_fraction:.0%} of the requests have "
                   f"prompts of max_model_len ({st.max_model_len:,} tokens) or more and are refused, as vLLM "
                   "refuses them; every figure below describes the rest.**")
    elif st.unservable_fraction > 0:
        refused = (f" {st.unservable_fraction:.1%} of the requests have prompts of max_model_len tokens or more and "
                   "are refused (counted apart from every SLO).")
    return (f"Scenario `{st.base.name}`: {st.model.name} on {tp}{st.gpu.name}, {st.num_blocks:,} KV blocks of "
            f"{e.block_size} tokens{' (vLLM keeps one as its null block)' if e.num_null_blocks else ''}, "
            f"max_model_len {st.max_model_len:,}, "
            f"requests of {st.mean_kv_len:.0f} tokens on average (prompt + output), scheduler {e.scheduler}."
            f"{refused}")


def _limits_phrase(limits: list[str]) -> str:
    """Which limit capped the saturated runs, in words."""
    words = {"kv": "KV memory", "max_num_seqs": "max_num_seqs", "requests": "the number of requests sent"}
    counts = {lim: limits.count(lim) for lim in dict.fromkeys(limits)}
    if len(counts) == 1:
        return f"every run was capped by {words[limits[0]]}"
    return "the runs were capped by " + ", ".join(f"{words[k]} ({n} of {len(limits)})" for k, n in counts.items())


def _count(value: float | None) -> str:
    """A simulated figure, or "not saturated" where the run never queued long enough to have one."""
    return "not saturated" if value is None or pd.isna(value) else f"{value:g}"


def _change(before: float | None, after: float | None, digits: int, falling: bool = False) -> str:
    """'R× (before → after)' with R = after ÷ before (before ÷ after when `falling`), or just the two
    figures when either is missing."""
    pair = f"({_count(before)} → {_count(after)})"
    if before is None or after is None or pd.isna(before) or pd.isna(after) or not before or not after:
        return pair
    return f"{(before / after if falling else after / before):.{digits}f}× {pair}"


def context_text(sec: Section, cfg: studies.StudyConfig) -> str:
    f, df = sec.facts, sec.tables["context_concurrency"]
    first, last = df.iloc[0], df.iloc[-1]
    paged = _change(first.simulated_paged_sustained, last.simulated_paged_sustained, 2, falling=True)
    if "simulated_slab_sustained" in df:
        slab = _change(first.simulated_slab_sustained, last.simulated_slab_sustained, 1, falling=True)
        trend = (f"sustained slab concurrency falls by {slab} because each sequence reserves max_model_len, while "
                 f"paged concurrency changes by {paged}")
    else:  # this engine cannot take slab-max (`left_out`, said after)
        trend = f"sustained paged concurrency changes by {paged}"
    return (f"Each row simulates {3 * cfg.num_requests} requests arriving at once (4× more, again, while that many "
            f"did not fill the engine), on {f['num_gpu_blocks']:,} KV "
            f"blocks; {_limits_phrase(list(df.paged_limited_by))} (paged). From max_model_len "
            f"{first.max_model_len:,} to {last.max_model_len:,}, {trend}: it "
            f"follows the actual lengths (mean {f['mean_kv_len']:.0f} tokens).")


def fp8_text(sec: Section) -> str:
    df = sec.tables["kv_quantization"].set_index("kv_cache_dtype")
    auto, fp8 = df.loc["auto"], df.loc["fp8"]
    tpot = ""
    if pd.notna(fp8.tpot_mean_s_at_base_rate) and pd.notna(auto.tpot_mean_s_at_base_rate):
        tpot = f" Mean TPOT at the base rate is {fp8.tpot_mean_s_at_base_rate / auto.tpot_mean_s_at_base_rate:.2f}×" \
               " the 16-bit one."
    capped = sorted({lim for lim in df.limited_by if lim != "kv"})
    fixed = int(fp8.num_gpu_blocks) == int(auto.num_gpu_blocks)  # a fixed block count: fp8 frees memory, no block
    caveat = ""
    if capped and not fixed:  # with as many blocks, fp8 buys a KV-bound engine no sequence either
        words = {"requests": "the number of requests sent", "max_num_seqs": "max_num_seqs"}
        caveat = (f" These saturated runs were capped by {' and '.join(words[c] for c in capped)}, not by KV memory, "
                  "so the simulated change understates what fp8 buys a KV-bound engine (the closed form: "
                  f"{fp8.closed_form_paged_at_mean_len / auto.closed_form_paged_at_mean_len:.2f}× the sequences).")
    fewer = f"fp8 KV stores {auto.bytes_per_block / fp8.bytes_per_block:.1f}× fewer bytes per block"
    if fixed:
        blocks = (f"{fewer}, but the pool has {int(fp8.num_gpu_blocks):,} blocks either way (a fixed block count, "
                  "`engine.num_gpu_blocks_override`: fp8 leaves memory unused rather than adding blocks)")
    else:
        blocks = f"{fewer}: {int(fp8.num_gpu_blocks):,} blocks instead of {int(auto.num_gpu_blocks):,}"
    change = _change(auto.simulated_sustained_running, fp8.simulated_sustained_running, 2)
    return f"{blocks}, and sustained concurrency changes by {change} from 16-bit to fp8.{caveat}{tpot}"


def prefix_text(sec: Section) -> str:
    f, df = sec.facts, sec.tables["prefix_sharing"]
    biggest = df.num_requests.max()
    on = df[(df.num_requests == biggest) & df.prefix_caching].iloc[0]
    offs = df[(df.num_requests == biggest) & ~df.prefix_caching]
    if offs.empty:  # this engine cannot turn prefix caching off (`left_out`, said after)
        return (f"Every request starts with the same {f['prefix_tokens']:,}-token system prompt. With {biggest} "
                f"requests and prefix caching, peak KV usage is {on.kv_usage_max:.1%} and mean TTFT "
                f"{on.ttft_mean_s:.2f} s, with a hit rate of {on.prefix_cache_hit_rate:.1%}; sharing saves "
                f"{on.sharing_saving:.1%} of the KV the requests map.")
    off = offs.iloc[0]
    if round(off.kv_usage_max, 3) == round(on.kv_usage_max, 3):
        usage = (f"peak KV usage is {on.kv_usage_max:.1%} with and without prefix caching (the pool fills either "
                 "way, so the peak hides what sharing saves; see the saving below)")
    else:
        usage = f"prefix caching takes peak KV usage from {off.kv_usage_max:.1%} to {on.kv_usage_max:.1%}"
    return (f"Every request starts with the same {f['prefix_tokens']:,}-token system prompt. With {biggest} "
            f"requests, {usage}, "
            f"mean TTFT from {off.ttft_mean_s:.2f} s to {on.ttft_mean_s:.2f} s, with a hit rate of "
            f"{on.prefix_cache_hit_rate:.1%}; sharing saves {on.sharing_saving:.1%} of the KV the requests map.")


def _is(value: object, flag: bool) -> bool:
    """A table's boolean cell (numpy bool, or NaN/None where missing) equals `flag`."""
    return value is not None and bool(pd.notna(value)) and bool(value) is flag


def _rate_evidence(row: pd.Series, cfg: studies.StudyConfig) -> str:
    """How a sustainable rate was established: run length, window, served/offered, percentile CI."""
    length = (f"capped at {int(row.requests_per_probe):,} requests a probe before two run lengths agreed within 2 %"
              if row.capped else f"stable to within 2 % from {int(row.requests_per_probe) // 2:,} to "
              f"{int(row.requests_per_probe):,} requests a probe")
    if _is(row.get("verified"), True):
        backed = ("" if row.num_long_runs <= 1 else
                  f", after the search's {row.search_rate:g} req/s held there and long runs went higher (to the "
                  "search's lowest failing rate, then steps of 3 % and more, then bisected to within 3 %)"
                  if row.max_rate_meeting_slo > row.search_rate else
                  f", after the search's {row.search_rate:g} req/s failed there and was backed off (3 %, then "
                  "doubling steps, then bisected to within 3 %)")
        length += (f"; then held in one run {int(row.verify_num_requests):,} requests long{backed}, the run "
                   "the figures below come from")
    ci = ""
    if pd.notna(row.ttft_p90_ci_low_s) and pd.notna(row.ttft_p90_ci_high_s):
        ci = f", 95 % interval {row.ttft_p90_ci_low_s:.2f}–{row.ttft_p90_ci_high_s:.2f} s"
    return (f"{length}; over its measurement window ({row.num_in_window:,} requests in {row.window_s:,.0f} s, "
            f"an offered {row.offered_rate_in_window:.4g} req/s, warm-up and drain left out) it served"
            f" {row.served_over_offered:.3f}× the offered rate with a backlog "
            f"trend of {row.backlog_trend:+.3f} and p90 TTFT {row.ttft_p90_s:.2f} s{ci}")


def paging_text(sec: Section, st: studies.Study, cfg: studies.StudyConfig) -> str:
    waste = sec.tables["waste_breakdown"].set_index("allocator")
    rates = sec.tables["sustained_rate"].set_index("allocator")
    saturated = [a for a in waste.index if waste.loc[a, "limited_by"] == "kv"]
    shares = ", ".join(f"{a} {waste.loc[a, 'token_state']:.1%}" for a in waste.index)
    if len(saturated) == len(waste):
        intro = ("Shares of the whole KV pool holding token states, time-averaged while requests queue (the view of "
                 f"the PagedAttention paper's Fig. 2; slack, gaps and free space are its \"external fragmentation & "
                 f"others\"): {shares} (paper: Orca Max 20.4 %, Pow2 26.8 %, Oracle 38.2 %, vLLM 96.3 %).")
    else:
        free = [a for a in waste.index if a not in saturated]
        intro = (f"Token-state shares of the KV pool (the paper's Fig. 2 view): {shares}; but the {', '.join(free)} "
                 "run(s) never filled the pool (capped by " + ", ".join(sorted({waste.loc[a, 'limited_by']
                                                                              for a in free}))
                 + " instead), so their shares describe a pool with room to spare, not the paper's KV-bound case.")
    mult = ", ".join(f"{rates.loc[a, 'paging_multiplier']:.2f}× over {a}" for a in rates.index if a != "paged"
                     and pd.notna(rates.loc[a, "paging_multiplier"]))
    if len(rates) == 1:  # every slab allocator refused (`left_out`, said after): nothing to divide by
        mult = ("cannot be shown for this engine: it is paged KV's sustainable rate over a slab allocator's, and "
                "this engine takes no slab allocator")
    paged = rates.loc["paged"]
    if pd.isna(paged.max_rate_meeting_slo):
        if _is(paged.get("verified"), False):
            return (f"{intro} No Poisson rate is sustainable with paging under p90 TTFT ≤ {cfg.ttft_slo_s} s in a "
                    f"long run: the search's {paged.search_rate:g} req/s and {int(paged.num_long_runs) - 1} lower "
                    f"rates each failed when run 10× longer (the lowest {paged.fails_by}).")
        return (f"{intro} No Poisson rate is sustainable with paging under p90 TTFT ≤ {cfg.ttft_slo_s} s: even "
                f"at the lowest probed rate the probe {paged.fails_by}.")
    cost = ""
    if pd.notna(paged.usd_per_concurrent_user_hour):
        cost = (f" At that rate, over the window, paged KV runs {paged.mean_running:g} requests at once (Little's "
                f"law) and serves {paged.output_tokens_per_s:,.0f} output tokens/s: "
                f"{dollars(paged.usd_per_concurrent_user_hour, 4, widen=False)} per concurrent user-hour and "
                f"{dollars(paged.usd_per_million_output_tokens, 2, widen=False)} per million output tokens "
                f"({paged.price_source}).")
    rejected = ""
    if paged.rejected_fraction and paged.rejected_fraction > 0:
        rejected = (f" {share(paged.rejected_fraction)} of the requests can never be served (over max_model_len or "
                    "the pool) and are counted apart, not as SLO misses.")
    failer = "long run" if paged.num_long_runs > 1 else "probe"
    above = (f" Above it, at {paged.first_failing_rate:g} req/s, the {failer} {paged.fails_by}."
             if pd.notna(paged.fails_by) else "")
    return (f"{intro} The highest sustainable Poisson rate (as asked of the arrival generator) with p90 "
            f"TTFT ≤ {cfg.ttft_slo_s} s is "
            f"{paged.max_rate_meeting_slo:g} req/s with paging ({_rate_evidence(paged, cfg)}).{above} "
            f"Paging multiplier: {mult or 'no other allocator sustains any rate'}.{rejected}{cost}")


def load_text(sec: Section, cfg: studies.StudyConfig) -> str:
    df, f = sec.tables["load_curves"], sec.facts
    ok = df[df.meets_slo]
    knee = f"the p90 TTFT meets the {cfg.ttft_slo_s} s SLO, stably, up to {ok.rate.max():g} req/s" if len(ok) else \
        f"no rate of the grid meets the {cfg.ttft_slo_s} s SLO stably"
    verdicts = ", ".join(f"{r.rate:g}: {r.verdict}" for r in df.itertuples())
    around = (f" (the grid spans {df.fraction_of_sustainable.min():.3g}× to {df.fraction_of_sustainable.max():.3g}× "
              f"the sustainable rate {f['sustainable_rate']:g} req/s)" if f["sustainable_rate"] else "")
    return (f"TTFT and TPOT percentiles of the paged engine from {df.rate.min():g} to {df.rate.max():g} req/s"
            f"{around}, {int(df.num_requests.iloc[0]):,} requests a run, over each run's measurement window: {knee}. "
            f"Verdicts per rate: {verdicts}. The time series shows the run at {f['time_series_rate']:g} req/s with "
            f"preemptions marked.{_by_priority_text(sec)}")


def _by_priority_text(sec: Section) -> str:
    """With priority classes: each class's p90 TTFT at the highest rate of the grid."""
    df = sec.tables.get("load_by_priority")
    if df is None:
        return ""
    top = df[df.rate == df.rate.max()]
    each = ", ".join(f"priority {r.priority}: {r.ttft_p90_s:.3g} s over {r.num_in_window:,} requests"
                     for r in top.itertuples())
    return (f" Per priority class (`load_by_priority`; smaller is served first), p90 TTFT at {top.rate.iloc[0]:g} "
            f"req/s: {each}.")


def alerts_text(sec: Section, cfg: studies.StudyConfig) -> str:
    df = sec.tables["alert_firings"]
    fired = df[df.times_fired > 0]
    when = ("none fired" if fired.empty else "; ".join(
        f"{r.alert} fired at {r.rate:g} req/s (first at {r.first_fired_s:g} s)" for r in fired.itertuples()))
    return (f"Rules on kv_cache_usage_perc (> {cfg.usage_alert} for {int(cfg.alert_for_s)} s) and on the preemption "
            f"rate (> {cfg.preemption_rate_alert}/s over {int(cfg.preemption_window_s)} s), evaluated on the load "
            f"runs with Prometheus `for:` semantics: {when}. `alerts.yaml` holds them as a Prometheus rule file.")


def section_text(sec: Section, st: studies.Study, cfg: studies.StudyConfig) -> str:
    """The section's words; then, where it left out variants this engine refuses, a sentence quoting why."""
    if sec.skipped is not None:
        return skipped_text(sec)
    text = _section_body(sec, st, cfg)
    left_out = sec.facts.get("left_out")
    return f"{text} {left_out_text(left_out)}" if left_out else text


def _section_body(sec: Section, st: studies.Study, cfg: studies.StudyConfig) -> str:
    f = sec.facts
    if sec.key == "context":
        return context_text(sec, cfg)
    if sec.key == "fp8":
        return fp8_text(sec)
    if sec.key == "prefix":
        return prefix_text(sec)
    if sec.key == "formula" and not f["num_kv_bound"]:
        return (f"No saturated run was KV-bound here (concurrency was capped by {', '.join(f['other_limits'])}), so "
                f"the formula seqs ≈ {closed_form(st)} cannot be fitted: this pool ({f['pool_blocks']:,} "
                f"blocks) holds more than the workload or max_num_seqs ever asks for. vLLM's startup line would "
                f"report \"maximum concurrency\" {f['vllm_max_concurrency']:.2f}x for max_model_len "
                f"{st.max_model_len:,}.")
    if sec.key == "formula":
        return formula_text(sec, st)
    if sec.key == "paging":
        return paging_text(sec, st, cfg)
    if sec.key == "load":
        return load_text(sec, cfg)
    if sec.key == "fleet":
        return fleet_text(sec, st)
    if sec.key == "offload":
        return offload_text(sec)
    if sec.key == "speculation":
        return speculation_text(sec)
    return alerts_text(sec, cfg)


def closed_form(st: studies.Study) -> str:
    """The formula section's closed form in words (`kvsim.model.capacity.paged_seqs`): with full attention only,
    pool_blocks ÷ blocks_per_seq; with sliding-window or chunked groups, the last sequence admitted holding its
    prompt's chunk (prefill blocks) beside the others decoding, every group's blocks counted."""
    if any(g.window_tokens is not None for g in st.kv_layout.groups):
        return ("(1 + (pool_blocks − prefill_blocks) ÷ blocks_per_seq) (every KV group counted, the last "
                "sequence admitted holding its prompt's chunk: kvsim capacity's count)")
    return "pool_blocks ÷ blocks_per_seq"


def formula_text(sec: Section, st: studies.Study) -> str:
    """Three concurrency figures beside vLLM's, with the fitted constant, all from the table; where no prompt c/2 +
    output c/2 row was KV-bound (only the scenario's own mix filled the pool), no constant of those rows alone."""
    f, df = sec.facts, sec.tables["capacity_formula"]
    k_fixed = f["fitted_constant_fixed"]
    fixed = ("none of the prompt c/2 + output c/2 rows was KV-bound, so they fit no k of their own" if pd.isna(k_fixed)
             else f"k = {k_fixed:.2f} on the prompt c/2 + output c/2 rows alone")
    kv = df[df.limited_by == "kv"]
    peak_k = float((kv.peak_running_transient / kv.closed_form_seqs).mean())
    calm_k = float((kv.max_seqs_without_preemption / kv.closed_form_seqs).mean())
    thrash = kv.preemptions_per_s.max()
    return (f"Three concurrency figures per row, for {st.model.name} on {st.gpu.name} (pool {f['pool_blocks']:,} "
            "blocks): the *sustained* concurrency (running requests averaged over the time requests queued; "
            "ramp-up and drain excluded), the largest max_num_seqs that ran with no preemption, and the peak, an "
            "admission transient when every sequence holds only its prompt. Fitting sustained seqs ≈ k · "
            f"{closed_form(st)} gives k = {f['fitted_constant']:.2f} over the {f['num_kv_bound']} "
            f"KV-bound rows ({fixed}). "
            f"On those rows the peak averages {peak_k:.2f}× the closed form and the preemption-free concurrency "
            f"{calm_k:.2f}×; the sustained level is held with up to {thrash:.2f} preemptions per second, so plan on "
            "the preemption-free figure for a quiet engine and on the sustained one only if recomputation is "
            f"acceptable, never on the peak. vLLM's startup line would report \"maximum concurrency\" "
            f"{f['vllm_max_concurrency']:.2f}x for max_model_len {st.max_model_len:,}: a worst case that assumes "
            "every request reaches max_model_len.")


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:,.1f} GiB"


def _needs(num_bytes: int | None, caching: bool = True) -> str:
    """What a target needs: a CPU tier of some size, none (the GPU's prefix cache, where the engine has one), or
    more than the sizes tried give."""
    if num_bytes is None:
        return "is not reached with any tier size tried"
    if not num_bytes:
        return "needs no CPU tier (the GPU's prefix cache reaches it)" if caching else "needs no CPU tier"
    return f"needs a CPU tier of {_gib(num_bytes)} per replica"


def offload_text(sec: Section) -> str:
    """The offload section's words, every number from its tables and facts; with prefix caching off (no hit-rate
    target: `kvsim.report.offload_study`) why the tier is sized by TTFT alone."""
    f, pays, hurts = sec.facts, sec.tables["offload_pays"], sec.tables["offload_hurts"]
    target = f["target_hit_rate"]
    if target is None:
        hit = (f"This engine has prefix caching off: it counts no prefix-cache query (as vLLM counts none), so no "
               f"hit rate is measured and no hit-rate target applies (an unbounded cache would hit "
               f"{f['unbounded_hit_rate']:.0%} of these {f['num_requests']} requests' prompt tokens); the tier, "
               "which still loads the prefixes it holds, is sized by TTFT alone.")
    else:
        hit = (f"A prefix hit rate of {target:.0%} (GPU and CPU tier together; 90 % of the "
               f"{f['unbounded_hit_rate']:.0%} an unbounded cache would hit on these {f['num_requests']} requests) "
               f"{_needs(f['size_for_hit_rate_bytes'])}.")
    slo = (f" TTFT p90 ≤ {f['ttft_slo_s']:g} s at the trace's rate "
           f"{_needs(f['size_for_ttft_bytes'], caching=target is not None)}.")
    if len(pays):
        paying = [f"×{load:g}" for load, ok in zip(pays["load"], pays["pays"], strict=True) if ok]
        pay = (f" The largest tier ({_gib(f['largest_bytes'])}) cuts TTFT p90 by at least {f['pays_margin']:.0%} at "
               f"load{'s' if len(paying) > 1 else ''} {', '.join(paying)} of the trace's rate" if paying else
               f" The largest tier ({_gib(f['largest_bytes'])}) cuts TTFT p90 by less than {f['pays_margin']:.0%} at "
               "every load tried") + " (table `offload_pays`)."
    else:
        pay = ""
    slow = hurts[~hurts["load_is_faster"]]
    if len(slow):
        row = slow.sort_values("prefix_tokens").iloc[0]
        hurt = (f" Where it hurts: loading a {int(row.prefix_tokens):,}-token prefix at "
                f"{row.bandwidth_bytes_per_s / 1e9:g} GB/s per GPU takes {row.load_s * 1e3:.1f} ms, its recompute "
                f"{row.recompute_s * 1e3:.1f} ms; below about {row.break_even_bandwidth_bytes_per_s / 1e9:.1f} GB/s "
                "per GPU a load is slower than recomputing, and vLLM loads whatever the tier holds (table "
                "`offload_hurts`).")
    else:
        hurt = (" At every bandwidth tried, loading a prefix is faster than recomputing it (table "
                "`offload_hurts`).")
    return hit + slo + pay + hurt

"""The fleet section's words (`kvsim.report.fleet_study`), every number from its table and facts: the traffic
and why that trace, the floor, the replicas per router, and what affinity changed and why (or, on a trace
without prompt content, that it has nothing to follow)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from kvsim.model.units import counted, dollars
from kvsim.report import studies
from kvsim.report.section import Section
from kvsim.report.study_config import StudyConfig

ROUTER_NAMES = {"round_robin": "round robin", "least_outstanding": "least outstanding", "affinity": "affinity"}


def _relative(new: float, old: float) -> str:
    """'lower', 'higher' or 'about the same' (within 5 %)."""
    ratio = new / old if old else float("inf")
    return "lower" if ratio < 0.95 else "higher" if ratio > 1.05 else "about the same"


def too_long(passed_over: Sequence[dict[str, Any]], num_requests: int) -> str:
    """"236 of the first 300 Mooncake requests (79%) and ...": each trace's requests at max_model_len or over."""
    return " and ".join(f"{p['num_too_long']} of the first {num_requests} {p['name']} requests "
                        f"({p['num_too_long'] / num_requests:.0%})" for p in passed_over)


def fleet_text(sec: Section, st: studies.Study) -> str:
    """The fleet section: the traffic and why that trace, the floor, replicas per router, and what affinity
    changed and why."""
    f = sec.facts
    if f.get("unservable"):
        many = len(f["passed_over"]) > 1
        return (f"{too_long(f['passed_over'], f['num_requests'])} have prompts of max_model_len "
                f"({f['max_model_len']:,} tokens) or more: this engine cannot serve "
                f"{'these traces' if many else 'this trace'}, so no fleet is sized for {'them' if many else 'it'}.")
    df = sec.tables["fleet_routing"].set_index("router")
    e = st.base.engine
    tp = f"{e.tensor_parallel_size}× " if e.tensor_parallel_size > 1 else ""
    refused = ("" if not f["num_too_long"] else
               f"; its one prompt of {f['max_model_len']:,} tokens or more is refused, as vLLM refuses it"
               if f["num_too_long"] == 1 else
               f"; the {f['num_too_long']} prompts of {f['max_model_len']:,} tokens or more are refused, as vLLM "
               "refuses them")
    trace = f["trace"]
    traffic = (f"The first {f['num_requests']} requests of {trace.label} ({trace.source}: real arrivals over "
               f"{f['span_s']:.0f} s, prompts of {f['mean_prompt_tokens']:,.0f} tokens on average, "
               f"{trace.attribution}) on replicas of "
               f"{st.model.name} on {tp}{st.gpu.name} with prefix caching, max_model_len {f['max_model_len']:,}"
               f"{refused}.")
    if f["passed_over"]:
        traffic += (f" It is served because this engine refuses most of the trace tried first: "
                    f"{too_long(f['passed_over'], f['num_requests'])} have prompts of max_model_len or more, and "
                    "sizing a fleet for the rest would answer another question.")
    if not trace.has_prefixes:
        traffic += (" This trace gives lengths, not prompt content: no prefix is known to be shared, so the prefix "
                    "cache has no reuse to find and affinity routing nothing to follow; affinity is not run, and "
                    "round robin and least outstanding are compared on load alone.")
    floor = (f"Served one at a time on one replica, the p90 TTFT is {f['floor_ttft_p90_s']:.2f} s (prefill alone, "
             f"queue p99 {f['floor_queue_p99_s']:.2f} s): more replicas only remove queueing, so no fleet goes far "
             "below it" + (f" (other cache hits aside: at most {f['unbounded_hit_rate']:.1%} of the prompt tokens "
                           "here)." if trace.has_prefixes else "."))
    short = _too_short(df)
    judged = df[~short]
    needs = []
    for router, row in judged.iterrows():
        if pd.isna(row.replicas_for_slo):
            needs.append(f"more than {counted(f['max_replicas'], 'replica')} (the search's limit) with "
                         f"{ROUTER_NAMES[router]}")
            continue
        cost = f" ({dollars(row.cost_per_hour_for_slo, 2, widen=False)}/h)" if pd.notna(row.cost_per_hour_for_slo) \
            else ""
        needs.append(f"{counted(int(row.replicas_for_slo), 'replica')} with {ROUTER_NAMES[router]}{cost}")
    if not short.any() and df.replicas_for_slo.isna().all():
        needs = [f"more than {counted(f['max_replicas'], 'replica')} (the search's limit) with every router"]
    answer = f"{_target(f, sized=True)} {'; '.join(needs)}." if needs else _target(f, sized=False)
    if short.any():
        answer += _unjudged(f, df[short], every=not needs)
    answer += _unverified(f, judged[judged.replicas_for_slo.notna()])
    prices = f" Prices: {f['price_source']}." if df.cost_per_hour_for_slo.notna().any() else ""
    lo_row = df.loc["least_outstanding"]
    if "floor_replicas" in df.columns and pd.notna(lo_row.floor_replicas):
        prices += (f" From first principles no engine could serve this traffic on fewer than "
                   f"{counted(int(lo_row.floor_replicas), 'replica')} ({lo_row.floor_binds} binds: "
                   + ("the prompt and output tokens at one replica's best-batch step cost" if lo_row.floor_binds
                      == "compute" else "the KV the requests hold, by Little's law, against one pool") + ")"
                   + (f"; least outstanding needs {lo_row.replicas_over_floor:g}× that"
                      + (f", made of (from that fleet's own run, in replicas over it, at the rate it served) "
                         f"{lo_row.gap_breakdown}: batching is steps below the best batch, preemption the "
                         "recomputed tokens, idle the capacity the SLO keeps free"
                         if "gap_breakdown" in df.columns and pd.notna(lo_row.gap_breakdown) else "")
                      if pd.notna(lo_row.replicas_over_floor) else "") + ".")
    size = int(df.replicas.iloc[0])
    lo, rr = df.loc["least_outstanding"], df.loc["round_robin"]
    which = ("the fewest least-outstanding routing needs" if pd.notna(lo.replicas_for_slo)
             else "the search's limit")
    sized = " ".join([traffic, floor, f"{answer}{prices}"])
    if size == 1:
        hits = (f"prefix-cache hit rate {lo.prefix_cache_hit_rate:.1%} (an unbounded cache would serve "
                f"{f['unbounded_hit_rate']:.1%}), " if trace.has_prefixes else "")
        return (f"{sized} With one replica every router sends it everything: {hits}TTFT p50 / p90 "
                f"{lo.ttft_p50_s:.2f} / {lo.ttft_p90_s:.2f} s: at this traffic there is no routing to compare.")
    if not trace.has_prefixes:
        return (f"{sized} At {size} replicas ({which}), TTFT p50 / p90: {rr.ttft_p50_s:.2f} / {rr.ttft_p90_s:.2f} s "
                f"with round robin and {lo.ttft_p50_s:.2f} / {lo.ttft_p90_s:.2f} s with least outstanding; queue "
                f"p90 {rr.queue_p90_s:.2f} s and {lo.queue_p90_s:.2f} s; the busiest replica got "
                f"{int(rr.requests_per_replica_max)} and {int(lo.requests_per_replica_max)} requests.")
    aff = df.loc["affinity"]
    compare = (f"At {size} replicas ({which}), the prefix-cache hit rate is {rr.prefix_cache_hit_rate:.1%} with "
               f"round robin, {lo.prefix_cache_hit_rate:.1%} with least outstanding and {aff.prefix_cache_hit_rate:.1%}"
               f" with affinity (an unbounded cache shared by the fleet would serve {f['unbounded_hit_rate']:.1%} of "
               f"these prompts); TTFT p50 / p90: {rr.ttft_p50_s:.2f} / {rr.ttft_p90_s:.2f} s, {lo.ttft_p50_s:.2f} / "
               f"{lo.ttft_p90_s:.2f} s and {aff.ttft_p50_s:.2f} / {aff.ttft_p90_s:.2f} s.")
    return " ".join([sized, compare, _affinity_verdict(f, lo, aff)])


def _too_short(df: pd.DataFrame) -> pd.Series:
    """Per router, whether its search judged no count: its probes, doubled up to the cap, stayed too short."""
    if "probes_too_short" not in df.columns:
        return pd.Series(False, index=df.index)
    return df.probes_too_short.fillna(False).astype(bool)


def _target(f: dict, sized: bool) -> str:
    """The target sentence up to what follows it: the routers' needs where some router's search judged a count
    (`sized`), else their reasons. The target is the report's TTFT SLO, or the floor plus it where the floor alone
    exceeds it (then no fleet of this GPU meets the SLO)."""
    slo = f"{f['slo_s']:g} s"
    if f["ttft_target_s"] == f["slo_s"]:
        return f"TTFT p90 ≤ {slo} needs" if sized else f"No fleet is sized for TTFT p90 ≤ {slo}"
    target = f"TTFT p90 ≤ {f['ttft_target_s']:.2f} s (the floor plus {slo} of waiting)"
    return (f"That is above the report's {slo} TTFT SLO, so no fleet of this GPU meets it; "
            + (f"sized instead for {target}, it needs" if sized else f"nor is one sized for {target}"))


def _unjudged(f: dict, short: pd.DataFrame, every: bool) -> str:
    """Why the routers in `short` have no answer: their probes were too short to judge any count, and whether this
    report's probe cap (`fleet_max_probe_requests`, below a full report's) stopped them growing. `every`: no
    router has an answer (the sentence follows `_target`'s, unsized)."""
    num_requests = int(short.requests_per_probe.max())
    cap = f.get("max_probe_requests")
    full = StudyConfig.model_fields["fleet_max_probe_requests"].default
    capped = (f" (this report caps them at {cap:,} requests, its fleet_max_probe_requests"
              + (f"; kvsim report without --quick doubles them up to {full:,}" if cap < full else "") + ")"
              if cap is not None and 2 * num_requests > cap else "")
    why = (f"the {num_requests:,}-request probes were too short to judge any fleet of up to "
           f"{counted(f['max_replicas'], 'replica')}{capped}")
    if every:
        return f": with every router {why}."
    return f" With {' and '.join(ROUTER_NAMES[r] for r in short.index)}, no count is judged: {why}."


def _unverified(f: dict, sized: pd.DataFrame) -> str:
    """Words for the answers in `sized` that no long run verified (`verified_10x` not True): long runs not asked
    for (`fleet_verify_factor` 0, as `--quick` sets it), or one not made (the memory limit); empty when every answer
    held in its long run (or the table predates the column). An unverified answer is never worded as verified."""
    if "verified_10x" not in sized.columns:
        return ""
    unverified = sized[~sized.verified_10x.map(lambda held: bool(pd.notna(held) and held))]
    if unverified.empty:
        return ""
    if f.get("verify_factor") == 0:
        full = StudyConfig.model_fields["fleet_verify_factor"].default
        num_requests = int(unverified.requests_per_probe.max())
        return (f" {'This answer rests' if len(unverified) == 1 else 'These answers rest'} on {num_requests:,}-request "
                f"probes alone, not verified by a longer run (this report's fleet_verify_factor is 0; kvsim report "
                f"without --quick re-runs each {full}× as long).")
    names = " and ".join(ROUTER_NAMES[r] for r in unverified.index)
    return f" Not verified by a run {f['verify_factor']}× as long with {names}: that long run was not made."


def _affinity_verdict(f: dict, lo: pd.Series, aff: pd.Series) -> str:
    """Affinity against least outstanding: hits, TTFT, and the reasons the runs show."""
    before, after = lo.prefix_cache_hit_rate, aff.prefix_cache_hit_rate
    gain = after - before
    p50, p90 = _relative(aff.ttft_p50_s, lo.ttft_p50_s), _relative(aff.ttft_p90_s, lo.ttft_p90_s)
    if gain > 0:
        hits = f"Affinity raises the hit rate from {before:.1%} to {after:.1%} ({100 * gain:.1f} points)"
    else:
        hits = f"Affinity does not raise the hit rate ({before:.1%} → {after:.1%})"
    bound = f["unbounded_hit_rate"]
    if after < 0.75 * bound and f["floor_hit_rate"] < 0.75 * bound:
        hits += (f"; the fleet stays far below the {bound:.1%} an unbounded cache would serve, and one replica "
                 f"serving the requests one at a time keeps only {f['floor_hit_rate']:.1%}: a pool of "
                 f"{f['pool_tokens']:,} tokens ({f['pool_tokens'] / f['mean_prompt_tokens']:.1f} mean prompts) "
                 "evicts a conversation's blocks before its next turn")
    ttft = (f". Its TTFT p50 is {p50} ({lo.ttft_p50_s:.2f} → {aff.ttft_p50_s:.2f} s) and its p90 {p90} "
            f"({lo.ttft_p90_s:.2f} → {aff.ttft_p90_s:.2f} s)")
    if p50 == p90 == "lower":
        return hits + ttft + "."
    why = []
    saved = 1 - aff.prompt_tokens_computed / lo.prompt_tokens_computed if lo.prompt_tokens_computed else 0.0
    why.append(f"affinity's hits spared {saved:.1%} of the prompt tokens computed" if saved > 0
               else "affinity computed no fewer prompt tokens")
    if aff.queue_p90_s > 1.05 * lo.queue_p90_s:
        why.append(f"its queue time p90 is {aff.queue_p90_s:.2f} s against {lo.queue_p90_s:.2f} s (it keeps a "
                   "conversation on its replica while that replica is within the load bound, even when another "
                   "is idle)")
    if aff.requests_per_replica_max > lo.requests_per_replica_max:
        why.append(f"its busiest replica got {int(aff.requests_per_replica_max)} requests against "
                   f"{int(lo.requests_per_replica_max)}")
    return hits + ttft + ". Against least outstanding, the runs show that " + "; ".join(why) + "."

"""The report's speculative-decoding section: what drafts buy at each batch size, and where they stop.

Each verify step computes K + 1 tokens per sequence and emits L of them on average (the mean
acceptance length, the bonus token included). While a step is memory-bound (small batches:
weights and KV read once whatever the token count) K + 1 tokens cost about what one does, so TPOT
falls by about L; as the batch grows the linear layers turn compute-bound and each step costs up
to K + 1 times as much, while the KV the drafts hold (K lookahead slots per sequence for EAGLE and
draft models) leaves room for fewer sequences. Past some batch size speculation no longer pays.

For each batch-size limit B in `StudyConfig.speculation_batch_sizes` (vLLM's `max_num_seqs`), two
saturated runs of the report's scenario (`SPEC_REQUESTS_PER_SEQ` × B requests, at least
`SPEC_MIN_REQUESTS`, arriving at once, so B sequences run while the queue lasts): without speculation
and with the scenario's own `speculative_config`, or `DEFAULT_SPECULATION` when it has none. The
table gives TPOT (mean, p50), output throughput, mean running, preemptions and the acceptance length
measured; `tpot_speedup` = TPOT without ÷ TPOT with, `throughput_ratio` = with ÷ without.
The crossover is the smallest B of the grid at which `tpot_speedup` ≤ 1 (per-user latency no
longer improves); `last_paying_batch_size` is the largest B below it at which it did.

An engine that cannot speculate (kvsim, as vLLM, drafts only in the v1 engine on the paged allocator over
full attention) gets the section skipped with its refusal (`kvsim.report.applicable`), not run.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from kvsim.model.errors import KvsimError, shown
from kvsim.report.applicable import refusal, skipped
from kvsim.report.section import Section
from kvsim.report.studies import SATURATE, Study, poisson, variant
from kvsim.workload.scenario import Scenario

# EAGLE-3 for Llama-3.1-8B-Instruct: mean acceptance length 2.77 at K = 7 on MT-bench, temperature 1
# (the public yuhuili/EAGLE3-LLaMA3.1-Instruct-8B head; docs/policies.md, "Speculative decoding")
DEFAULT_SPECULATION: dict[str, Any] = {"method": "eagle3", "num_speculative_tokens": 7, "acceptance_length": 2.77}
SPEC_REQUESTS_PER_SEQ = 3  # requests per batch slot: the batch stays full for most of the run
SPEC_MIN_REQUESTS = 12
TITLE = "Speculative decoding: where drafts stop paying"
SETTING = "speculative decoding (`engine.speculative_config`)"


def speculation_config(st: Study) -> dict[str, Any]:
    """The scenario's `speculative_config` (as given), or `DEFAULT_SPECULATION`."""
    given = st.base.engine.speculative_config
    return given.model_dump(mode="json", exclude_none=True) if given is not None else dict(DEFAULT_SPECULATION)


def _row(summary: dict[str, Any], batch_size: int, speculative: bool) -> dict[str, Any]:
    spec = summary.get("spec_decode") or {}
    return {"max_num_seqs": batch_size, "speculative": speculative, "mean_running": round(summary["mean_running"], 2),
            "tpot_mean_s": summary["tpot_s"]["mean"], "tpot_p50_s": summary["tpot_s"]["p50"],
            "output_tokens_per_s": summary["output_tokens_per_s"], "num_preemptions": summary["num_preemptions"],
            "mean_acceptance_length": spec.get("mean_acceptance_length"),
            "draft_rejected_share": spec.get("draft_rejected_share")}


def crossover(speedup: pd.DataFrame) -> tuple[int | None, int | None]:
    """(the smallest batch size with `tpot_speedup` ≤ 1, the largest one below it with a speedup > 1);
    None where the grid has none."""
    ordered = speedup.sort_values("max_num_seqs")
    stops = ordered[ordered.tpot_speedup <= 1.0]
    first_stop = int(stops.max_num_seqs.iloc[0]) if len(stops) else None
    before = ordered if first_stop is None else ordered[ordered.max_num_seqs < first_stop]
    paying = before[before.tpot_speedup > 1.0]
    return first_stop, int(paying.max_num_seqs.iloc[-1]) if len(paying) else None


def _saturated(st: Study, batch_size: int, config: dict[str, Any] | None) -> Scenario:
    """The saturated run at one batch-size limit, speculating with `config` (None: without speculation)."""
    count = max(SPEC_REQUESTS_PER_SEQ * batch_size, SPEC_MIN_REQUESTS)
    return variant(st.base, f"engine.max_num_seqs={batch_size}", f"workload.num_requests={count}", poisson(SATURATE),
                   f"engine.speculative_config={json.dumps(config)}")


def speculation(st: Study) -> Section:
    """TPOT and throughput with and without speculative decoding per batch-size limit; the crossover. An `st` that is
    no Study (a notebook's Scenario) is a `KvsimError` naming it (it was an AttributeError)."""
    if not isinstance(st, Study):
        raise KvsimError(f"st={shown(st)}: expected a Study (kvsim.report.studies.Study(scenario, StudyConfig()))")
    config = speculation_config(st)
    sizes = sorted(set(st.cfg.speculation_batch_sizes))
    reason = refusal(lambda: _saturated(st, sizes[0], config))
    if reason is not None:
        return skipped("speculation", TITLE, SETTING, reason)
    runs = st.run([_saturated(st, b, c) for b in sizes for c in (None, config)])
    rows = [_row(run.summary, sizes[i // 2], speculative=i % 2 == 1) for i, run in enumerate(runs)]
    table = pd.DataFrame(rows)
    off, on = table[~table.speculative].reset_index(drop=True), table[table.speculative].reset_index(drop=True)
    speedup = pd.DataFrame({"max_num_seqs": off.max_num_seqs, "tpot_speedup": off.tpot_mean_s / on.tpot_mean_s,
                            "throughput_ratio": on.output_tokens_per_s / off.output_tokens_per_s})
    stop, last = crossover(speedup)
    facts = {"config": config, "crossover_batch_size": stop, "last_paying_batch_size": last,
             "largest_batch_size": sizes[-1], "smallest_batch_size": sizes[0],
             "tpot_speedup_smallest": float(speedup.tpot_speedup.iloc[0]),
             "tpot_speedup_largest": float(speedup.tpot_speedup.iloc[-1]),
             "mean_acceptance_length": float(on.mean_acceptance_length.dropna().mean()),
             "more_preemptions_with": bool((on.num_preemptions > off.num_preemptions).any())}
    return Section("speculation", TITLE, {"speculation": table, "speculation_speedup": speedup}, facts)


def speculation_text(sec: Section) -> str:
    """The crossover in words, from the section's facts."""
    f = sec.facts
    c = f["config"]
    what = (f"{c['method']} with K = {c['num_speculative_tokens']} drafts per step (measured mean acceptance "
            f"length {f['mean_acceptance_length']:.2f} tokens per verify step)")
    head = (f"Each batch-size limit (`max_num_seqs`) is run saturated without and with speculative decoding, "
            f"{what}. With a batch of {f['smallest_batch_size']} speculation cuts TPOT by "
            f"{f['tpot_speedup_smallest']:.2f}×; at {f['largest_batch_size']} the ratio is "
            f"{f['tpot_speedup_largest']:.2f}×. ")
    kv = (" The drafts' lookahead KV also made some runs preempt more than without speculation."
          if f["more_preemptions_with"] else "")
    if f["crossover_batch_size"] is None:
        return head + (f"It still pays at the largest batch size tried ({f['largest_batch_size']}): the verify "
                       "steps stay memory-bound there, or KV memory caps the batch first." + kv)
    last = (f"; the largest batch size at which it still paid was {f['last_paying_batch_size']}"
            if f["last_paying_batch_size"] is not None else "")
    return head + (f"**Speculation stops paying at {f['crossover_batch_size']} sequences** (TPOT no better than "
                   f"without){last}. A verify step computes K + 1 tokens per sequence: free while a step is "
                   "memory-bound (weights and KV are read once whatever the token count), but once the batch's "
                   "tokens make the linear layers compute-bound a step costs more than the acceptance length "
                   "it emits." + kv)

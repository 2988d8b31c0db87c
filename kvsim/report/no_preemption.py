"""The capacity formula's largest `max_num_seqs` whose saturated run never preempts: a bisection over
saturated runs (`largest_seqs_without_preemption`) that does not simulate a probe whose answer the pool
already gives (`never_preempts`), so its answer is the plain bisection's, found with fewer runs."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvsim.engine.builder import resolve_engine
from kvsim.planning.sweep import SweepResult
from kvsim.workload.draws import Fixed
from kvsim.workload.scenario import Scenario


def never_preempts(scenario: Scenario) -> bool:
    """Whether a run of `scenario` can never preempt, known without running it: at most `max_num_seqs`
    sequences hold KV blocks at once (`num_running_seqs`, which counts async scheduling's finishing ones),
    each at most its live blocks at prompt + output tokens (`KVLayout.decode_blocks`: a sequence allocates
    slots for its computed and scheduled tokens, fewer than those) and, with drafts, K more for a verify
    step's drafts and vLLM's lookahead (`num_lookahead_tokens`) more again (`kvsim.sched.v1`'s
    `hold_slots`), so when `max_num_seqs` × those fit the pool's usable blocks every allocation finds room,
    and a preemption, which only a failed allocation makes (`allocate_or_preempt`), never happens.

    With sliding-window groups a sequence holds more while a prompt chunk is computed than while it decodes:
    the window − 1 tokens before the chunk and the whole chunk, up to `max_num_batched_tokens`, the blocks that
    slid out freed only before its next allocation (`kvsim.kv.hybrid`'s `remove_skipped_blocks`), so its most
    is the larger of that (`KVLayout.prefill_blocks` at prompt + output tokens, every group's worst case) and
    its decoding blocks; with full attention only the two are its live blocks.

    True only where that per-sequence maximum is known and holds: fixed prompt and output lengths (no trace,
    no shared prefix, no multi-turn history), one sequence per request (n = 1, no beams), prefix caching off
    (nothing cached beyond the sequences' own blocks), no chunked-local attention groups (not checked against
    runs here), no separate draft model (`method: draft_model`, not checked against runs here; n-gram and EAGLE
    drafts are). The pool is the scenario's own: `max_num_seqs` changes the
    activation memory and so the block count (`kvsim.model.capacity.num_gpu_blocks`)."""
    workload, engine = scenario.workload, scenario.engine
    prompt, output = workload.prompt_len, workload.output_len
    if (not isinstance(prompt, Fixed) or not isinstance(output, Fixed) or workload.trace is not None
            or workload.shared_prefix is not None or workload.multi_turn is not None or workload.n > 1
            or workload.beam_width is not None or engine.enable_prefix_caching):
        return False
    spec = resolve_engine(scenario)
    layout = spec.kv_layout
    if any(g.kind == "chunked_local" for g in layout.groups) or layout.draft_num_layers:
        return False
    drafts = engine.speculative_config
    extra = 0 if drafts is None else drafts.num_speculative_tokens + drafts.num_lookahead_tokens
    num_tokens = prompt.value + output.value + extra
    per_seq = max(layout.decode_blocks(num_tokens),  # the most blocks it holds decoding, or prefilling
                  layout.prefill_blocks(num_tokens, spec.limits.max_num_batched_tokens))
    usable = spec.num_gpu_blocks - engine.num_null_blocks
    # v0 also preempts at a decode that finds no free block (`V0Scheduler.try_allocate`): one must stay free
    return spec.limits.max_num_seqs * per_seq <= usable - (engine.scheduler == "v0")


def largest_seqs_without_preemption(probe: Callable[[int, int], Scenario],
                                    run: Callable[[list[Scenario]], list[SweepResult]],
                                    runs: Sequence[SweepResult]) -> list[int]:
    """Per row, the largest `max_num_seqs` whose saturated run never preempts (bisection, all rows at once).

    Bounds: 0 (nothing runs, nothing is preempted) and the row's peak running in its saturated run
    `runs[i]` (a run that preempted at its own peak); a row whose run never preempted is its peak. Stops
    within 5 %. `probe(i, max_num_seqs)` is row i's saturated scenario with that limit; `run` simulates a
    list of them. A probe `never_preempts` says is calm is not run: its outcome is known, so every row takes
    the same steps as a bisection that ran it."""
    calm = [r.summary["num_preemptions"] == 0 for r in runs]
    lo = [r.summary["max_running"] if ok else 0 for r, ok in zip(runs, calm, strict=True)]
    hi = [r.summary["max_running"] + ok for r, ok in zip(runs, calm, strict=True)]
    while True:
        todo = [i for i in range(len(runs)) if hi[i] - lo[i] > max(1, lo[i] // 20)]
        if not todo:
            return lo
        mids = {i: (lo[i] + hi[i]) // 2 for i in todo}
        probes = {i: probe(i, mids[i]) for i in todo}
        to_run = [i for i in todo if not never_preempts(probes[i])]
        ran = run([probes[i] for i in to_run]) if to_run else []
        preempted = {i: result.summary["num_preemptions"] > 0 for i, result in zip(to_run, ran, strict=True)}
        for i in todo:
            if preempted.get(i, False):
                hi[i] = mids[i]
            else:
                lo[i] = mids[i]

"""Admission: whether and how a request joins the running batch. Pure Python.

* on arrival, `accept` refuses (and records, with `reject_reason`'s reason) a request that can never be
  served, as vLLM refuses it, and caps its output at `max_model_len`;
* for the waiting head, `lookup` is its prefix-cache hit (or the KV a prefill instance handed over),
  `can_admit` whether its prompt fits beside the watermark, and `admit` moves it from `waiting` to
  `running` holding that hit, stamping `first_scheduled_s` and counting the prefix-cache query.

The policy (`select` of v1, v0, static) decides when to call them; v0 refuses inside the watermark and asks
for every prompt block (`watermark_refuses`, `admits_all_prompt_blocks`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.kv import NO_HIT, PrefixHit
from kvsim.workload.request import RequestStatus

if TYPE_CHECKING:
    from kvsim.kv import KVAllocator, PrefixCacheStats
    from kvsim.latency.step_plan import StepPlan
    from kvsim.results.records import RequestRecords
    from kvsim.sched.limits import SchedulerLimits
    from kvsim.sched.request_queue import RequestQueue
    from kvsim.sched.speculative import Speculation
    from kvsim.workload.request import Request


class Admission:
    """Mixed into `kvsim.sched.base.Scheduler`, whose state it uses (`alloc`, `limits`, `waiting`, `running`,
    `records`, `prefix_stats`, `held_kv_tokens`, the admission order)."""

    alloc: KVAllocator
    limits: SchedulerLimits
    waiting: RequestQueue
    running: list[Request]
    records: RequestRecords
    speculation: Speculation | None
    planned_s: float
    prefix_stats: PrefixCacheStats
    held_kv_tokens: dict[int, int]
    admission_order: dict[int, int]
    _num_admissions: int

    def accept(self, req: Request) -> bool:
        """False, with the request rejected and recorded, if it can never be served (vLLM refuses it on arrival);
        True if it can (`add` queues it; with async scheduling the engine queues it when the step that can first
        see it is planned, `kvsim.engine.runtime.Engine.deliver`), its output capped (`Request.cap_output`)."""
        req.cap_output(self.limits.max_model_len)
        reason = self.reject_reason(req)
        if reason:
            req.status, req.reject_reason = RequestStatus.REJECTED, reason
            req.content = None
            self.records.add(req)
            return False
        return True

    def reject_reason(self, req: Request) -> str | None:
        """Why `req` (its output capped to max_model_len: `Request.cap_output`) can never be served, or None. A
        reason names the limit, not the request's own numbers (its row carries prompt_tokens, output_tokens and
        num_samples), so that the summary's `reject_reasons` counts requests per reason."""
        limits = self.limits
        if req.prompt_len >= limits.max_model_len:  # no room for one output token: vLLM's OpenAI server refuses the
            # prompt alone (`_validate_input`: "you requested N tokens in the messages"), whatever the output asked
            return f"prompt_len >= max_model_len {limits.max_model_len}"
        assert req.prompt_len + req.output_len <= limits.max_model_len, "an output is capped first (cap_output)"
        if req.num_samples > limits.max_num_seqs:
            return f"num_samples > max_num_seqs {limits.max_num_seqs}"
        reason = self.alloc.never_fits_reason(req.kv_len, req.prompt_len)
        if reason:
            return reason
        needed = self.refusal_slots(req)
        # v0 refuses what cannot fit beside the watermark (AllocStatus.NEVER in vllm/core/block_manager.py);
        # v1 has no watermark in vLLM, so kvsim's optional one only delays admission, never refuses.
        watermark = limits.watermark_slots if self.watermark_refuses else 0
        if needed > self.alloc.num_total_slots:
            return f"needs more KV slots than the pool's {self.alloc.num_total_slots}"
        if needed > self.alloc.num_total_slots - watermark:  # it fits the pool, not beside the watermark
            return (f"needs more KV slots than the pool's {self.alloc.num_total_slots} less the watermark's "
                    f"{watermark}")
        return None

    watermark_refuses = False  # v0: a request that only fits inside the watermark is rejected

    def request_slots(self, req: Request) -> int:
        """KV slots a request holds at its largest, all samples together."""
        return self.alloc.request_slots(req.prompt_len, req.kv_len, req.num_samples)

    def refusal_slots(self, req: Request) -> int:
        """KV slots whose absence refuses `req` on arrival: by default all it will hold (`request_slots`); v0 asks
        its prompt's only, as vLLM v0's `can_allocate` does (`V0Scheduler.refusal_slots`)."""
        return self.request_slots(req)

    def admit(self, req: Request, num_new: int, hit: PrefixHit, plan: StepPlan, now: float) -> None:
        """Move the head of `waiting` to `running`, sharing `hit`'s blocks, `num_new` tokens after its computed ones.

        The caller has checked `can_allocate`; slab allocators also reserve each sample's region.
        """
        assert self.waiting.peek() is req
        for seq_id in req.seq_ids + req.child_seq_ids():  # slabs: each sample's region, sized from prompt and output
            reserved = self.alloc.reserve(seq_id, req.kv_len, req.prompt_len)
            assert reserved, "admit after a successful can_allocate"
        num_computed = hit.num_computed_tokens  # a hit's uncomputed tokens (v0, `PrefixHit`) are among the `num_new`
        result = self.alloc.allocate(req.seq_ids[0], num_computed + num_new, req.kv_len, req.content, hit)
        assert result is not None, "admit after a successful can_allocate"
        plan.num_copied_blocks += result.num_copied_blocks
        self.waiting.pop()
        self._num_admissions += 1
        self.admission_order[req.request_id] = self._num_admissions
        if req.first_scheduled_s is None:
            req.first_scheduled_s = self.planned_s
            req.num_prefix_hit_tokens = num_computed
        # KV loaded from a prefill instance is no prefix-cache query: its lookup was counted when the load
        # was reserved. A re-admission re-hits its own blocks: counted apart (`preempted`), as vLLM does.
        # Without prefix caching nothing is looked up or counted (vLLM's KVCacheManager records no query).
        loaded = self.held_kv_tokens.pop(req.request_id, None) if self.held_kv_tokens else None
        if loaded is None and self.alloc.enable_caching:
            self.prefix_stats.record(req.num_tokens, num_computed, preempted=bool(req.num_preemptions))
        req.num_computed_tokens = num_computed
        # its steps here so far: none (a step of another engine's, or before a preemption, is no step before this one)
        req.sampled_step = req.in_flight_decode_step = -1
        req.num_accepted_drafts = 0
        req.status = RequestStatus.RUNNING
        self.running.append(req)
        plan.scheduled.append((req, num_new))

    def can_admit(self, req: Request, hit: PrefixHit, num_new: int | None = None) -> bool:
        """The whole prompt (all samples' regions, for slabs) fits, leaving the watermark free; for a prompt
        longer than the allocator's `admits_by_chunk_above_tokens` (the shortest sliding window or attention
        chunk of hybrid KV groups, `kvsim.kv.hybrid`), the `num_new` tokens to be scheduled after the hit, as
        vLLM v1 (default: the whole prompt).

        With nothing running the watermark is not applied: it keeps room for running requests
        to grow, and a request that `add` accepted must be able to run alone. A policy that
        `admits_all_prompt_blocks` asks for every block of the prompt as if nothing were cached.
        """
        reserve = self.limits.watermark_slots if self.running else 0
        above = self.alloc.admits_by_chunk_above_tokens
        by_chunk = above is not None and req.num_tokens > above
        tokens = hit.num_tokens + num_new if num_new is not None and by_chunk else req.num_tokens
        return self.alloc.can_allocate(req.seq_ids[0], tokens, req.kv_len, NO_HIT if self.admits_all_prompt_blocks
                                       else hit, reserve, req.num_samples, req.prompt_len)

    # v0: admission needs free blocks for the whole prompt, prefix-cache hits included (vLLM v0's
    # `SelfAttnBlockSpaceManager.can_allocate` counts `get_num_required_blocks(seq.get_token_ids())`);
    # v1 counts only the blocks the hit does not cover (`get_num_blocks_to_allocate`)
    admits_all_prompt_blocks = False

    def lookup(self, req: Request) -> PrefixHit:
        """The prefix cache's hit; for KV loaded from a prefill instance, every prompt token but the last
        (vLLM recomputes it to sample the first token; the sequence already holds its blocks).

        With EAGLE a hit gives back its last block, which is recomputed (`Speculation.drops_last_hit_block`;
        speculative decoding runs on the paged allocator only, whose hits are whole blocks)."""
        if self.held_kv_tokens:
            held = self.held_kv_tokens.get(req.request_id)
            if held is not None:
                return PrefixHit(held, ())
        hit = self.alloc.lookup_prefix(req.content, req.num_tokens)
        if hit.block_ids and self.speculation is not None and self.speculation.drops_last_hit_block:
            block_tokens = hit.num_tokens // len(hit.block_ids)
            return PrefixHit(hit.num_tokens - block_tokens, hit.block_ids[:-1])
        return hit

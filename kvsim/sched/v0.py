"""vLLM v0's scheduler, the engine the PagedAttention paper describes.

Per step, in this order:

1. If nothing is swapped out, admit WAITING requests FCFS as one prefill-only batch
   (whole prompts, no chunking) while the token budget, `max_num_seqs` and the free-block
   watermark (1 % by default) allow; the free blocks must hold every block of the prompt, even those
   a prefix-cache hit shares (vLLM v0's `can_allocate`). If any were admitted, the step is that batch.
   A hit shares every cached full block of the prompt but skips only those computed in earlier steps,
   and never the last token: a prompt admitted after an identical one in the same step shares its
   blocks but computes every token itself (vLLM v0's `PrefixCachingBlockAllocator` marks blocks computed
   only once the batch is built); a prompt wholly cached earlier computes its last token alone.
2. Otherwise decode every RUNNING request (1 token per sequence). While fewer blocks are free than a request's
   sequences (vLLM v0 counts each next token as needing one), preempt from the back (most recently admitted): by
   recompute for single-sequence requests, by swap for groups with several sequences (`preemption_mode` overrides).
3. If nothing was preempted, swap SWAPPED requests back in (FCFS) while they fit; they
   decode in the same step. Swapped requests resume before any waiting request is admitted.

Not modelled: vLLM v0's chunked prefill (`Scheduler._schedule_chunked_prefill`), which `EngineArgs._set_default_args_v0`
turns on by default for a max_model_len over 32,768 (here every v0 step is `_schedule_default`'s); and from vLLM
0.6.4 on, v0 runs n > 1 samples as n sequence groups (`ParallelSampleSequenceGroup`), where kvsim forks them
as the paper and earlier v0 do (`kvsim.sched.forks`). A swap moves a forked group's shared blocks once, as
`BlockSpaceManagerV1` did (the paper's); v0's later `SelfAttnBlockSpaceManager` swaps each sequence's `Block`
objects apart (`NaiveBlockAllocator.swap_out`/`swap_in`), so the group returns unshared. Nor v0's evictor order
across sequences (`kvsim.kv.paged`).
"""

from __future__ import annotations

from kvsim.kv import PagedAllocator, PrefixHit
from kvsim.latency.step_plan import StepPlan
from kvsim.sched.base import Scheduler
from kvsim.workload.request import Request, RequestStatus


class V0Scheduler(Scheduler):
    name = "v0"
    watermark_refuses = True
    admits_all_prompt_blocks = True

    def admit(self, req: Request, num_new: int, hit: PrefixHit, plan: StepPlan, now: float) -> None:
        """`Scheduler.admit`, and with prefix caching vLLM v0's block counts too (`PrefixCacheStats.record_blocks`):
        v0 allocates every token an admission computes or hits (the prompt, after a recompute the output so
        far too: `req.num_tokens`), each full block a query, each cached one (`hit`'s, computed yet or not) a
        hit. v0 loads no KV from elsewhere (kv_offload and disaggregation need v1), and caches only in paged
        pools."""
        super().admit(req, num_new, hit, plan, now)
        if self.alloc.enable_caching:
            assert isinstance(self.alloc, PagedAllocator)
            self.prefix_stats.record_blocks(req.num_tokens // self.alloc.block_size, len(hit.block_ids))

    def use_swap(self, req: Request) -> bool:
        """Swap where the engine can (`SchedulerLimits.can_swap`, from `EngineConfig.can_swap`): every preemption
        under preemption_mode=swap; unset, a request of several sequences only (vLLM v0's `_preempt`: recompute
        when `get_max_num_running_seqs() == 1`)."""
        return self.limits.can_swap and (self.limits.preemption_mode == "swap" or len(self.active_seq_ids(req)) > 1)

    def select(self, now: float) -> StepPlan:
        plan = StepPlan()
        if not self.swapped and self.waiting:
            self._admit_prefills(plan, now)
            self.alloc.mark_blocks_as_computed()  # as vLLM v0's `schedule` once the batch is built
            if plan.scheduled:
                return plan
        self._decode_running(plan)
        if not plan.preempted and self.swapped:
            self._swap_in(plan)
        return plan

    def try_allocate(self, req: Request, num_tokens_total: int | None, plan: StepPlan, hold_slots: int = 0) -> bool:
        """`Scheduler.try_allocate`, only while the free blocks are at least the request's sequences: vLLM v0's
        `can_append_slots` counts each sequence's next token as touching a block, room in its partial last block
        or not (`BlockTable.get_num_blocks_touched_by_append_slots`: 1), and `_schedule_running` preempts until it
        holds. Paged pools only (a slab's region holds every token)."""
        alloc = self.alloc
        if isinstance(alloc, PagedAllocator) and alloc.pool.num_free_blocks < len(self.active_seq_ids(req)):
            return False
        return super().try_allocate(req, num_tokens_total, plan, hold_slots)

    def burst_fits(self, seq_ids: list[int], num_steps: int) -> bool:
        """Each step of a burst appends with a free block left before every sequence's token (`try_allocate`):
        in a paged pool, its new blocks leave one free."""
        alloc = self.alloc
        if isinstance(alloc, PagedAllocator):
            return alloc.burst_slots_needed(seq_ids, num_steps) < alloc.num_free_slots
        return alloc.burst_fits(seq_ids, num_steps)

    def _admit_prefills(self, plan: StepPlan, now: float) -> None:
        budget = self.limits.max_num_batched_tokens
        num_seqs, waiting = self.num_running_seqs(), self.waiting
        while waiting:
            req = waiting.peek()
            if num_seqs + req.num_samples > self.limits.max_num_seqs:
                break
            hit = self.lookup(req)
            num_new = req.num_tokens - hit.num_computed_tokens  # v0's budget counts the uncached tokens
            if num_new > budget or not self.can_admit(req, hit):
                break
            self.admit(req, num_new, hit, plan, now)
            budget -= num_new
            num_seqs += req.num_samples

    def _decode_running(self, plan: StepPlan) -> None:
        running = self.running
        i = 0
        while i < len(running):
            req = running[i]
            if not self.allocate_or_preempt(req, req.num_computed_tokens + 1, plan):
                break
            plan.scheduled.append((req, 1))
            i += 1

    def _swap_in(self, plan: StepPlan) -> None:
        alloc = self.alloc
        while self.swapped and self.num_running_seqs() + self.swapped[0].num_samples <= self.limits.max_num_seqs:
            req = self.swapped[0]
            seq_ids = self.active_seq_ids(req)
            # room for the swapped blocks, the watermark, and each sequence's next token
            headroom = self.limits.watermark_slots + alloc.swap_in_growth_slots(seq_ids)
            if not alloc.can_swap_in(seq_ids, headroom):
                break
            result = alloc.swap_in(seq_ids)
            assert result is not None
            plan.swap_in_bytes += result.num_bytes
            self.swapped.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            # `_schedule_swapped` appends without `can_append_slots`: `_can_swap` counted each next token
            grown = super().try_allocate(req, req.num_computed_tokens + 1, plan)
            assert grown
            plan.scheduled.append((req, 1))

    def waiting_blocked(self) -> bool:
        req = self.waiting.peek()
        hit = self.lookup(req)
        return (self.num_running_seqs() + req.num_samples > self.limits.max_num_seqs
                or req.num_tokens - hit.num_computed_tokens > self.limits.max_num_batched_tokens
                or not self.can_admit(req, hit))

"""vLLM v0's scheduler, the engine the PagedAttention paper describes.

Per step, in this order:

1. If nothing is swapped out, admit WAITING requests FCFS as one prefill-only batch
   (whole prompts, no chunking) while the token budget, `max_num_seqs` and the free-block
   watermark (1 % by default) allow; the free blocks must hold every block of the prompt, even those
   a prefix-cache hit shares (vLLM v0's `can_allocate`). If any were admitted, the step is that batch.
   A hit shares every cached full block of the prompt but skips only those computed in earlier steps,
   and never the last token: a prompt admitted after an identical one in the same step shares its
   blocks but computes every token itself (vLLM v0's `PrefixCachingBlockAllocator` marks blocks computed
   only once the batch is built); a prompt wholly cached earlier computes its last token alone. A waiting
   prompt's computed part is the one found the first time the queue's head was counted, kept until it is
   admitted (`V0Scheduler.lookup`: vLLM v0's `ComputedBlocksTracker`).
2. Otherwise decode every RUNNING request (1 token per sequence). While fewer blocks are free than a request's
   sequences (vLLM v0 counts each next token as needing one), preempt from the back (most recently admitted): by
   recompute for single-sequence requests, by swap for groups with several sequences (`preemption_mode` overrides).
3. If nothing was preempted, swap SWAPPED requests back in (FCFS) while they fit; they
   decode in the same step. Swapped requests resume before any waiting request is admitted.

Refusal (paged pools), as vLLM v0, which cannot know an output's length: a request is refused on arrival only when
its prompt's blocks exceed the pool less the watermark (`refusal_slots`; `can_allocate` NEVER). One whose output
then outgrows that runs until no block is left for it, is preempted, and is let go when it cannot come back: its
whole sequence's blocks exceed the pool less the watermark (recompute, `_schedule_prefills`) or the blocks
`_can_swap` counts to swap it in, each sequence's full blocks and next token (`_swap_in_touched_blocks`), the pool
(`_schedule_swapped`'s infeasible groups). vLLM marks it FINISHED_IGNORED and returns the tokens it generated,
finish reason "length": kvsim ends it so, the rest of its output length-capped (`_let_go`), with the outputs of the
step letting it go. A swapped one whose count fits the pool but not beside the watermark is never let go nor
swapped in (`_can_swap` LATER) and no one is admitted meanwhile: vLLM v0 waits forever, kvsim says so
(`held_kv_stall`).
Outputs stop at max_model_len (`Request.cap_output`), as the OpenAI server's default max_tokens stops them; v0's own
stop check (`StopChecker.maybe_stop_sequence`: `seq.get_len() > max_model_len`) lets an offline `LLM` request
asking more run one token further.

Not modelled: vLLM v0's chunked prefill (`Scheduler._schedule_chunked_prefill`), which `EngineArgs._set_default_args_v0`
turns on by default for a max_model_len over 32,768 (here every v0 step is `_schedule_default`'s); and from vLLM
0.6.4 on, v0 runs n > 1 samples as n sequence groups (`ParallelSampleSequenceGroup`), where kvsim forks them
as the paper and earlier v0 do (`kvsim.sched.forks`). A swap moves a forked group's shared blocks once, as
`BlockSpaceManagerV1` did (the paper's); v0's later `SelfAttnBlockSpaceManager` swaps each sequence's `Block`
objects apart (`NaiveBlockAllocator.swap_out`/`swap_in`), so the group returns unshared. Whether and when a
swapped group comes back follows that manager's count (`_can_swap`: each sequence's full blocks apart), which
kvsim's swap-in of the shared blocks never exceeds. Nor v0's evictor order across sequences (`kvsim.kv.paged`).
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from kvsim.kv import KVAllocator, PagedAllocator, PrefixHit
from kvsim.latency.step_plan import StepPlan
from kvsim.sched.base import Scheduler
from kvsim.sched.fanout import request_label
from kvsim.sched.limits import SchedulerLimits
from kvsim.sched.request_queue import RequestQueue
from kvsim.workload.request import Request, RequestStatus


class V0Scheduler(Scheduler):
    name = "v0"
    watermark_refuses = True
    admits_all_prompt_blocks = True

    def __init__(self, allocator: KVAllocator, limits: SchedulerLimits, rng: np.random.Generator | None = None,
                 waiting: RequestQueue | None = None) -> None:
        super().__init__(allocator, limits, rng, waiting)
        # request id -> the computed tokens of its hit when first looked up while waiting (`lookup`)
        self.first_look_computed_tokens: dict[int, int] = {}

    def lookup(self, req: Request) -> PrefixHit:
        """`Scheduler.lookup`, its computed part frozen while `req` waits, as vLLM v0's `ComputedBlocksTracker.
        get_num_cached_tokens` does: the first time `_schedule_prefills` counts a waiting sequence's tokens
        (the queue's head, before any budget, seats or blocks check) it records the computed blocks then, and
        for a sequence still in prefill returns that record ever after, until the sequence is freed
        (`remove_seq`: a recompute preemption, so a re-admission counts anew). A prefix that becomes computed
        while it waits (a request admitted with it in one step, or ahead of it) is shared but computed again:
        the budget and the model runner (`get_common_computed_block_ids`) both read the record. Where the record
        exceeds what is computed now (its blocks evicted meanwhile, which would have vLLM skip tokens whose KV
        is gone) kvsim computes them: the smaller count."""
        hit = super().lookup(req)
        if not self.alloc.enable_caching:
            return hit
        first = self.first_look_computed_tokens.setdefault(req.request_id, hit.num_computed_tokens)
        if first >= hit.num_computed_tokens:
            return hit
        return PrefixHit(hit.num_tokens, hit.block_ids, hit.num_tokens - first)

    def admit(self, req: Request, num_new: int, hit: PrefixHit, plan: StepPlan, now: float) -> None:
        """`Scheduler.admit`, and with prefix caching vLLM v0's block counts too (`PrefixCacheStats.record_blocks`):
        v0 allocates every token an admission computes or hits (the prompt, after a recompute the output so
        far too: `req.num_tokens`), each full block a query, each cached one (`hit`'s, computed yet or not) a
        hit. v0 loads no KV from elsewhere (kv_offload and disaggregation need v1), and caches only in paged
        pools."""
        super().admit(req, num_new, hit, plan, now)
        self.first_look_computed_tokens.pop(req.request_id, None)  # running now: `lookup`'s record is done
        if self.alloc.enable_caching:
            assert isinstance(self.alloc, PagedAllocator)
            self.prefix_stats.record_blocks(req.num_tokens // self.alloc.block_size, len(hit.block_ids))

    def use_swap(self, req: Request) -> bool:
        """Swap where the engine can (`SchedulerLimits.can_swap`, from `EngineConfig.can_swap`): every preemption
        under preemption_mode=swap; unset, a request of several sequences only (vLLM v0's `_preempt`: recompute
        when `get_max_num_running_seqs() == 1`)."""
        return self.limits.can_swap and (self.limits.preemption_mode == "swap" or len(self.active_seq_ids(req)) > 1)

    def refusal_slots(self, req: Request) -> int:
        """In a paged pool, its prompt's blocks, one sequence: vLLM v0's `SelfAttnBlockSpaceManager.can_allocate`
        counts `get_num_required_blocks(seq.get_token_ids())` of the group's one WAITING sequence (samples fork
        after the prefill), never the output, which v0 cannot know. A slab reserves its whole region at admission:
        there all the request will hold (`request_slots`). (Grouped, hybrid pools need v1: `kvsim.engine.builder`.)"""
        if isinstance(self.alloc, PagedAllocator):
            return self.alloc.region_slots(req.prompt_len)
        return super().refusal_slots(req)

    def select(self, now: float) -> StepPlan:
        plan = StepPlan()
        if not self.swapped and self.waiting:
            self._admit_prefills(plan, now)
            self.alloc.mark_blocks_as_computed()  # as vLLM v0's `schedule` once the batch is built
        if not plan.scheduled:
            self._decode_running(plan)
            if not plan.preempted and self.swapped:
                self._swap_in(plan)
        if plan.ignored and plan.is_empty:  # no step runs: `LLMEngine.step` returns them at once
            self.finish(plan.ignored, now)
        return plan

    def complete(self, plan: StepPlan, now: float) -> list[Request]:
        """`Scheduler.complete`, then the requests the step let go end (`_let_go`), after those it finished: vLLM
        v0's `_process_model_outputs` returns the ignored groups after the scheduled ones, once the step ran."""
        done = super().complete(plan, now)
        if plan.ignored and not plan.is_empty:  # an empty plan's ended when planned (`select`)
            done += self.finish(plan.ignored, now)
        return done

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
            if self._never_fits(req):  # checked before the budget, as `_schedule_prefills` does
                waiting.pop()
                self._let_go(req, plan)
                continue
            hit = self.lookup(req)  # before the seats check: v0 counts the tokens first (`lookup`)
            if num_seqs + req.num_samples > self.limits.max_num_seqs:
                break
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
            status = self._can_swap(req, seq_ids)
            if status == "never":  # `_schedule_swapped`'s infeasible groups
                self.swapped.popleft()
                self._let_go(req, plan)
                continue
            if status == "later":
                break
            result = alloc.swap_in(seq_ids)
            assert result is not None, "kvsim's swap-in takes no more blocks than `_can_swap` counts"
            plan.swap_in_bytes += result.num_bytes
            self.swapped.popleft()
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            # `_schedule_swapped` appends without `can_append_slots`: `_can_swap` counted each next token
            grown = super().try_allocate(req, req.num_computed_tokens + 1, plan)
            assert grown
            plan.scheduled.append((req, 1))

    def _can_swap(self, req: Request, seq_ids: list[int]) -> Literal["ok", "later", "never"]:
        """Whether the swapped `req` comes back now ("ok"), not yet ("later") or never ("never", let go), as
        vLLM v0's `SelfAttnBlockSpaceManager._can_swap` (`can_swap_in`) answers: in a paged pool, "never" where
        the blocks it counts (`_swap_in_touched_blocks`) exceed the pool, "ok" where the free blocks less them
        leave the watermark. kvsim's swap-in and next tokens then fit: they take at most that count (a shared
        block moves once, a shared partial last block is copied for all but one sequence). A slab (no v0 pool)
        comes back when its region and next tokens fit beside the watermark."""
        alloc, watermark_slots = self.alloc, self.limits.watermark_slots
        if not isinstance(alloc, PagedAllocator):
            fits = alloc.can_swap_in(seq_ids, watermark_slots + alloc.swap_in_growth_slots(seq_ids))
            return "ok" if fits else "later"
        touched, block = self._swap_in_touched_blocks(req, seq_ids), alloc.block_size
        if touched * block > alloc.num_total_slots:
            return "never"
        if alloc.pool.num_free_blocks - touched < watermark_slots // block:
            return "later"
        assert alloc.can_swap_in(seq_ids, alloc.swap_in_growth_slots(seq_ids)), "kvsim's swap-in fits vLLM's count"
        return "ok"

    def _swap_in_touched_blocks(self, req: Request, seq_ids: list[int]) -> int:
        """vLLM v0's count of the blocks that swapping `req`'s group back in touches (`SelfAttnBlockSpaceManager.
        _can_swap`), paged pools: each sequence's full blocks, and one for its next token
        (`get_num_blocks_touched_by_append_slots`: 1 a sequence, room in its last block or not). vLLM keeps a
        block table per sequence, a fork's `Block` objects new ones, which `NaiveBlockAllocator.
        get_num_full_blocks_touched` counts apart (a set of `Block` objects): a full block the samples share
        counts once for each, though kvsim's swap moves it once (module docstring). With prefix caching
        (`PrefixCachingBlockAllocator`, whose `fork` makes new `Block` objects too) each sequence's full blocks
        count one by one as well, but for a full block whose content a GPU block in use holds (a prefix a running
        request shares: `get_num_full_blocks_touched` counts a cached block only when it sits in the evictor),
        which its swap-in takes by reference, as kvsim's does (`PagedAllocator.swapped_held_references`). For one
        sequence it is exactly the blocks kvsim's swap-in and its next token take. Every sequence of a group holds
        `num_computed_tokens` (samples and beams decode in step)."""
        assert isinstance(self.alloc, PagedAllocator)
        touched = (len(seq_ids) * (req.num_computed_tokens // self.alloc.block_size + 1)
                   - self.alloc.swapped_held_references(seq_ids))
        assert len(seq_ids) > 1 or touched * self.alloc.block_size == (
            self.alloc.swapped_slots(seq_ids) + self.alloc.swap_in_growth_slots(seq_ids)), "one sequence: kvsim's"
        return touched

    def _never_fits(self, req: Request) -> bool:
        """vLLM v0's `can_allocate` NEVER for a waiting request in a paged pool: its whole sequence's blocks (a
        recomputed one's prompt and output so far) exceed the pool less the watermark. Only a request preempted
        by recompute can come to that (arrival refused the others: `refusal_slots`). `_schedule_prefills`' other
        reason to ignore one, more tokens than the prompt limit (min(max_model_len, max_num_batched_tokens)), never
        holds here: without chunked prefill v0 needs max_num_batched_tokens ≥ max_model_len (`EngineConfig`),
        and an unfinished request holds fewer than max_model_len tokens (`Request.cap_output`)."""
        alloc = self.alloc  # one with no output yet holds its prompt, which arrival found fitting (hot: each step)
        return (req.num_output_tokens > 0 and isinstance(alloc, PagedAllocator)
                and alloc.region_slots(req.num_tokens) > alloc.num_total_slots - self.limits.watermark_slots)

    def _let_go(self, req: Request, plan: StepPlan) -> None:
        """Let go `req`, taken out of its queue, which can never run again: vLLM v0 marks it FINISHED_IGNORED and
        returns the tokens it generated with finish reason "length" (`SequenceStatus.get_finished_reason`), so
        the rest of its output is length-capped (`num_length_capped_tokens`). It ends, its KV (a swapped one's
        CPU blocks) freed, with the outputs of the step letting it go (`LLMEngine._process_model_outputs` adds
        the ignored groups' after the scheduled ones'): when that step ends (`complete`), at once if it runs
        nothing (`select`)."""
        assert req.num_output_tokens > 0, "only a request preempted while decoding outgrows the pool"
        self.first_look_computed_tokens.pop(req.request_id, None)
        req.num_length_capped_tokens += req.output_len - req.num_output_tokens
        req.output_len = req.num_output_tokens
        plan.ignored.append(req)

    def held_kv_stall(self) -> str | None:
        """`Scheduler.held_kv_stall`, and vLLM v0's own stall: nothing runs and the blocks `_can_swap` counts to
        bring the swapped head back (`_swap_in_touched_blocks`) fit the whole pool (not NEVER, so it is not let go)
        but not beside the watermark, so `_can_swap` answers LATER however many blocks are free, and
        `_schedule_default` admits nobody while a group is swapped out: nothing ever runs again. A request
        preempted by swap with its last block partial and the pool full comes to it alone (5 blocks, a 1-block
        watermark: 4 full blocks and the append's 1 fit the 5); a group of several sequences where vLLM counts
        each one's full blocks apart. kvsim swaps in by the same count (`_can_swap`), so it cannot either."""
        alloc = self.alloc
        if self.running or not self.swapped or not isinstance(alloc, PagedAllocator):
            return super().held_kv_stall()
        req = self.swapped[0]
        seq_ids = self.active_seq_ids(req)
        assert self._can_swap(req, seq_ids) == "later", "nothing runs: it swaps in or is let go"
        block = alloc.block_size
        watermark_blocks = self.limits.watermark_slots // block
        return (f"engine.watermark: request {request_label(req.request_id)} is swapped out and vLLM v0 counts "
                f"{self._swap_in_touched_blocks(req, seq_ids)} KV blocks to bring it back (its full blocks and "
                f"next tokens), which fit the pool's {alloc.num_total_slots // block} but never beside the "
                f"watermark's {watermark_blocks}, and nothing runs: vLLM v0's scheduler waits forever there (its "
                "`_can_swap` answers LATER, and nothing is admitted while a request is swapped out); lower "
                "engine.watermark or give the KV cache more blocks (engine.num_gpu_blocks_override, "
                "engine.gpu_memory_utilization)")

    def waiting_blocked(self) -> bool:
        req = self.waiting.peek()
        if self._never_fits(req):
            return False  # the next step lets it go
        hit = self.lookup(req)
        return (self.num_running_seqs() + req.num_samples > self.limits.max_num_seqs
                or req.num_tokens - hit.num_computed_tokens > self.limits.max_num_batched_tokens
                or not self.can_admit(req, hit))

"""The scheduler's half of vLLM's async scheduling (`engine.async_scheduling`): a finished request's KV
and its `max_num_seqs` slot are released one decision late. Pure Python.

vLLM's `AsyncScheduler` (on by default since vLLM PR #27614, late 2025) plans step k + 1 while step k
runs on the GPU, right after processing step k − 1's output (vllm/v1/engine/core.py,
`step_with_batch_queue`; vllm/v1/core/sched/async_scheduler.py):

    time ──────────────▶  t_k              t_k+1            t_k+2
    GPU                   │ step k         │ step k+1       │
    CPU                   ▲ output of k−1, then plan k+1
                                           ▲ output of k, then plan k+2

kvsim's step loop plans each step when it starts, so it reproduces that schedule by planning step k + 1
at t_k+1 with what vLLM knew at t_k:

* a request that finished in step k (its last token came out at t_k+1) is not scheduled again, but
  still holds its KV blocks and its `max_num_seqs` slot when step k + 1 is planned: both are released
  right after that plan (`finish` defers, `release_finished` releases). vLLM skips it only when it is
  sure: `Scheduler.schedule`'s running loop passes over a request with output placeholders when
  `num_computed_tokens + 2 − num_output_placeholders ≥ num_prompt_tokens + max_tokens`, i.e. when the one
  token step k surely samples reaches `max_tokens`. Otherwise vLLM plans step k + 1 for it and discards that
  output: (1) with speculative decoding, when step k's accepted drafts end it, step k + 1 carries its verify
  of 1 + `num_speculative_tokens` placeholder tokens, its slots allocated, counted in that step's batch and
  time: the policy plans it (`kvsim.sched.v1.V1Scheduler._wasted_verifies`), and its KV is released with the
  rest after that plan; (2) a request that ends before `max_tokens` (EOS, a stop string), which vLLM cannot
  foresee, would get one more decode token, but kvsim ends every request at its `output_len` as if it were
  `max_tokens` (as `vllm bench serve` replays set `max_tokens` to it), so (2) never arises. A running
  request's verify is sized as vLLM sizes it, still counting the drafts the verify in flight rejects
  (`kvsim.sched.v1`);
* a request that arrived while step k ran is seen when step k + 2 is planned, not k + 1 (unless k + 1 is
  empty: the next plan is then made once step k's output is processed, and sees it); that part is timing and
  lives with the engine (`kvsim.engine.runtime.Engine.deliver`, `Engine.ran_empty_step`);
* vLLM's `running` still lists a request whose last token is in flight (it leaves it when that output is
  processed), so a preemption may pick it: FCFS takes `running.pop()`, the most recently admitted, finishing
  or not. Such a victim's KV is freed at once and it counts as a preemption; it loses nothing, and finishes
  when its output comes (vLLM's `stopped_preempted_reqs`). `finishing_victim` finds it, `preempt_finishing`
  takes it.

Everything else (a decode's next token, a prefill's next chunk) is planned as the synchronous scheduler
plans it: vLLM's placeholders make the in-flight step's tokens count as computed. They are not known tokens,
though, and vLLM caches a full block only once its tokens are: a block that a decode of the token in flight
completes is cached one plan late, which a preemption in that plan shows (`forget_in_flight_hash`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.workload.request import RequestStatus

if TYPE_CHECKING:
    from collections.abc import Sequence

    from kvsim.kv import KVAllocator
    from kvsim.latency.step_plan import StepPlan
    from kvsim.results.records import RequestRecords
    from kvsim.sched.request_queue import RequestQueue
    from kvsim.sched.speculative import Speculation
    from kvsim.workload.request import Request


class AsyncSteps:
    """Mixed into `kvsim.sched.base.Scheduler`: finished requests whose KV waits for the next decision.

    `async_scheduling` is set by the builder (`engine.async_scheduling` resolved); False is the
    synchronous scheduler: every request's KV is freed when it finishes, arrivals are seen at once."""

    async_scheduling: bool = False
    num_steps_planned: int
    alloc: KVAllocator
    speculation: Speculation | None
    finishing: list[Request]
    running: list[Request]
    waiting: RequestQueue
    num_preemptions: int
    records: RequestRecords
    admission_order: dict[int, int]  # request id -> when it was (last) admitted, counting admissions

    if TYPE_CHECKING:
        def free_request(self, req: Request) -> None: ...

    def release_finished(self) -> None:
        """After a step is planned: free the KV of the requests that finished before it, which that plan
        still saw holding it (a decode burst is never planned while any does). A no-op when none wait."""
        if self.finishing:
            for req in self.finishing:
                self._free_finished(req)
            self.finishing = []

    def _end_kv(self, req: Request) -> None:
        """`req` finished now: free its KV at once (synchronous), or after the next decision (async)."""
        if self.async_scheduling:
            self.finishing.append(req)
        else:
            self._free_finished(req)

    def _free_finished(self, req: Request) -> None:
        self.free_request(req)
        req.content = None  # its block-hash memo is not needed again: memory stays bounded in long runs

    def finishing_victim(self) -> Request | None:
        """The finishing request vLLM would preempt next, or None if its victim is a running one: the policy's
        victim (`RequestQueue.victim_index`) over `running` and `finishing` merged in admission order, as
        vLLM's `running` lists them."""
        order = self.admission_order
        merged = sorted([*self.running, *self.finishing], key=lambda r: order[r.request_id])
        victim = merged[self.waiting.victim_index(merged)]
        return victim if victim.status is RequestStatus.FINISHED else None

    def preempt_finishing(self, req: Request, plan: StepPlan) -> None:
        """Preempt a finished request whose KV waits for the next decision: freed now, counted as a
        preemption (vLLM's `_preempt_request`), in the run's total and in its row, written when it finished
        (a v1 child's parent row: `row_id`); it stays finished (its last token was already computed)."""
        self.finishing.remove(req)
        self.num_preemptions += 1
        req.num_preemptions += 1
        row = self.row_id(req)
        if row is not None:
            counted = any(records.add_preemption(row) for records in self.row_records())
            assert counted, f"request {row} has no row"
        plan.preempted.append(req)
        self.forget_in_flight_hash(req, plan)
        self._free_finished(req)

    def forget_in_flight_hash(self, req: Request, plan: StepPlan) -> None:
        """Before a preemption frees `req`'s KV: uncache the block vLLM has not cached yet.

        vLLM caches a request's full blocks up to `request.num_tokens` (`KVCacheManager.allocate_slots`), which
        the token a step in flight samples is not in (an output placeholder) until that output is processed,
        after the next plan (`AsyncScheduler._update_request_with_output` then caches up to `num_computed_tokens
        - num_output_placeholders`, for a request still running). So a decode of a token still in flight when
        its step was planned leaves the block that token fills uncached for one more plan: the step in flight's
        decode, if the step before it sampled that token, or this plan's (a priority victim it already
        scheduled), if the step in flight samples it. Preempted in this plan, vLLM frees that block uncached
        (`BlockPool.free_blocks`: to the free queue's head) and the re-admission misses it; kvsim caches a block
        when it is written, so it takes that one back here (tests/test_vllm_cache_lag.py). Not modelled with
        speculative decoding, whose drafts are placeholders too."""
        if not self.async_scheduling or self.speculation is not None:
            return
        step = self.num_steps_planned
        if any(r is req for r, _ in plan.scheduled):
            in_flight = req.sampled_step == step - 1
        else:
            in_flight = req.in_flight_decode_step == step - 1
        if in_flight:
            for seq_id in req.seq_ids:
                self.alloc.forget_newest_hashes(seq_id, 1)

    def row_records(self) -> Sequence[RequestRecords]:
        """The records a row of `row_id` may be in: this engine's (the v1 policy's are those of every
        data-parallel rank sharing its `SampleGroups`, in rank order: the rank whose child ends last writes the
        row)."""
        return (self.records,)

    def row_id(self, req: Request) -> int | None:
        """The request id of the row that counts `req`'s preemptions now (the v1 policy overrides it for
        the children it fans a request out into: `kvsim.sched.fanout.SampleGroups.row_id`)."""
        return req.request_id

    def num_finishing_seqs(self) -> int:
        """Sequences of finished requests still holding their `max_num_seqs` slot (async only)."""
        return sum(r.num_samples for r in self.finishing) if self.finishing else 0

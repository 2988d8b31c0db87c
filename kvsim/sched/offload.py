"""The scheduler's half of KV offload (`engine.kv_offload`, `kvsim.kv.offload_connector`), as vLLM's
scheduler drives its OffloadingConnector: a waiting request whose prefix the offload tiers hold past its
GPU prefix-cache hit (with prefix caching off there is none: the tiers are asked from its first block) leaves
the queue while those blocks load (vLLM's WAITING_FOR_REMOTE_KVS) and rejoins it at the front, holding them,
once they have (one whose hit another request is loading, or whose hit meets a block still being stored, waits
in the queue for that transfer instead: `waits_for_a_transfer`); after every step, the full blocks computed in
it (by default only the prompt's: vLLM's `offload_prompt_only`) are offered to the tiers (write-through,
vLLM's `_build_store_jobs`, formerly `_get_reqs_to_store`). A request considered for admission has its blocks
in the tiers touched (LRU), as vLLM's lookup does. Pure Python.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvsim.sched.fanout import request_label
from kvsim.workload.request import Request, RequestStatus

if TYPE_CHECKING:
    from kvsim.kv import KVAllocator, PrefixCacheStats, PrefixHit
    from kvsim.kv.offload_connector import OffloadConnector
    from kvsim.latency.step_plan import StepPlan
    from kvsim.sched.request_queue import RequestQueue
    from kvsim.sched.speculative import Speculation


class OffloadScheduling:
    """Mixed into `kvsim.sched.base.Scheduler`, whose state it uses (`offload`, `loading`, `waiting`, ...)."""

    alloc: KVAllocator
    waiting: RequestQueue
    running: list[Request]
    prefix_stats: PrefixCacheStats
    held_kv_tokens: dict[int, int]
    speculation: Speculation | None
    # waiting requests skipped for a transfer of their hit (`waits_for_a_transfer`), in vLLM's skipped queue
    # (`skipped_waiting`) until admitted or loading: `loaded_first` keeps them ahead of later victims (replaced,
    # never changed in place: the class's empty set is every scheduler's until its first)
    load_waiters: frozenset[int] = frozenset()
    offload: OffloadConnector | None
    loading: dict[int, tuple[Request, int]]
    # a disaggregated decode instance's requests whose KV is still on a prefill instance: handed to it and
    # waiting for their blocks, or in transfer (`kvsim.fleet.disagg` counts them)
    num_remote_waiting: int = 0
    # where the KV of `held_kv_tokens`' requests came from, as `held_kv_stall` names it (a disaggregated decode
    # instance's: `kvsim.fleet.disagg` sets it)
    held_kv_source: str = "engine.kv_offload's tiers"
    _next_stored_block: dict[int, int]

    @property
    def num_waiting(self) -> int:
        """`vllm:num_requests_waiting`: the queue, the requests loading their prefix from the tiers and (a decode
        instance's) those whose KV a prefill instance still holds. vLLM keeps a request in its waiting queue from
        the moment it is added, through WAITING_FOR_REMOTE_KVS (`Scheduler.schedule` puts it back with the
        skipped ones), until it is admitted, and reports `len(self.waiting)` (`make_stats`, `get_request_counts`)."""
        return len(self.waiting) + len(self.loading) + self.num_remote_waiting

    @property
    def awaits_transfers(self) -> bool:
        """Whether a request waits for an offload transfer in flight, whose end wakes the engine: its own load,
        or a store its hit meets (`waits_for_a_transfer`, `OffloadConnector.await_stores`)."""
        return bool(self.loading) or (self.offload is not None and self.offload.awaiting_stores)

    def start_load(self, req: Request, hit: PrefixHit, now: float) -> bool:
        """For the waiting head `req` (whose whole prompt fits after `hit`): if the offload tiers hold its
        prefix past the GPU hit, take the GPU blocks of its whole prompt, start loading those blocks and
        move it from `waiting` to `loading` (True); False, changing nothing, when they hold none of it.

        The tiers are asked for every full block of the request, its last one included, as vLLM's
        `OffloadingConnectorScheduler.get_num_new_matched_tokens` does (`num_tokens // block_size` blocks);
        a load that covers every token leaves the last one to recompute (its logits sample the next token),
        as vLLM's `Scheduler._update_waiting_for_remote_kv` does (`num_computed_tokens == num_tokens` → − 1).
        The prefix-cache query is counted now (the GPU hit; with prefix caching off the hit is empty and vLLM
        counts no query, so the load fills fresh blocks from block 0); once loaded, the request is admitted with
        the GPU hit and the loaded tokens computed (`finish_loads`, `lookup`). Taking the whole prompt's
        blocks now (vLLM takes the loaded prefix's, then the rest when it schedules the request) makes a
        loaded request admissible at once: it can never wait for blocks while holding others.
        """
        offload = self.offload
        assert offload is not None and self.waiting.peek() is req
        num_full = self._blocks_asked(req)
        if not num_full:
            return False
        assert req.content is not None
        bs, first = offload.block_size, len(hit.block_ids)
        num_blocks = offload.lookup(req.content, first, num_full)
        if not num_blocks:
            return False
        seq_id = req.seq_ids[0]
        allocated = self.alloc.allocate(seq_id, hit.num_tokens, req.kv_len, req.content, hit)
        held = self.alloc.hold(seq_id, req.num_tokens)
        assert allocated is not None and held, "start_load after a successful can_admit"
        self.waiting.pop()
        if self.load_waiters:
            self.load_waiters -= {req.request_id}
        if self.alloc.enable_caching:
            self.prefix_stats.record(req.num_tokens, hit.num_tokens, preempted=bool(req.num_preemptions))
        self.loading[req.request_id] = (req, min((first + num_blocks) * bs, req.num_tokens - 1))
        self._next_stored_block[req.request_id] = first + num_blocks  # the tiers hold those blocks already
        offload.start_load(req.request_id, req.content, first, num_blocks, now)
        return True

    def waits_for_a_transfer(self, req: Request, hit: PrefixHit) -> bool:
        """Whether the waiting head `req` must sit this step out for a transfer of its offload hit past the GPU
        `hit`; vLLM's `OffloadingConnectorScheduler.get_num_new_matched_tokens` returns None for it, and
        `Scheduler.schedule` skips it and goes on admitting the requests behind it, asking again next step:
        * a block of the walk, before its first miss, is still being stored (vLLM's `_maximal_prefix_lookup`:
          the manager's lookup says HIT_PENDING, "a lookup that should be tried later"): the engine is woken
          when a store ends (`OffloadConnector.await_stores`) and the request, tried again, loads the blocks;
        * a load in flight (another request's) reads a block of its hit ("hit blocks are being loaded, delay
          request", `_blocks_being_loaded`, kept only with GPU prefix caching): once that load has ended its
          blocks are in the GPU prefix cache and the request hits them there instead of loading them twice."""
        offload = self.offload
        assert offload is not None
        num_full = self._blocks_asked(req)
        first = len(hit.block_ids)
        if num_full <= first:
            return False
        assert req.content is not None
        if offload.hit_pending(req.content, first, num_full):
            offload.await_stores()
            return True
        if not self.alloc.enable_caching or not self.loading:
            return False
        num_blocks = offload.lookup(req.content, first, num_full)
        return offload.loading_any(req.content, first, num_blocks)

    def finish_loads(self, now: float) -> None:
        """Book the offload transfers ended by `now`; loaded requests go to the front of `waiting`, holding
        their KV (`held_kv_tokens`), in the order their loads started, which is their order in the queue:
        vLLM keeps a request waiting for its KV in the queue and admits the ready ones in queue order, however
        their transfers ended (a CPU-tier load may end before an earlier disk-tier one)."""
        assert self.offload is not None
        ready = set(self.offload.take_ready(now))
        for request_id in reversed([rid for rid in self.loading if rid in ready]) if ready else ():
            req, num_tokens = self.loading.pop(request_id)
            self.held_kv_tokens[request_id] = num_tokens
            self.waiting.prepend(req)

    def loaded_first(self) -> None:
        """Under FCFS, put the requests holding loaded KV, and those waiting for another's load
        (`load_waiters`), at the front of `waiting`, in their order, before admission: vLLM keeps both in its
        skipped queue, which FCFS admission takes before the waiting queue (`_select_waiting_queue_for_
        scheduling`), whatever was preempted since they went there (a preempted request goes to the front of the
        waiting queue). Ahead of the loaded ones, a victim that cannot fit while they hold their blocks stopped
        admission with nothing left running: the engine stalled for good."""
        held, waiters = self.held_kv_tokens, self.load_waiters
        if not (held or waiters) or self.waiting.policy != "fcfs":
            return
        loaded = [req for req in self.waiting if req.request_id in held or req.request_id in waiters]
        # already the front? (a loaded head alone does not say so: a victim can sit between two loaded requests)
        if all(req is head for req, head in zip(loaded, self.waiting, strict=False)):
            return
        for req in reversed(loaded):
            self.waiting.remove(req)
            self.waiting.prepend(req)

    def held_kv_stall(self) -> str | None:
        """Why the engine can never step again although requests wait, when its queue's head cannot fit while
        requests hold the KV they loaded (from `held_kv_source`: the offload tiers, `start_load` taking
        their blocks, or a disaggregated decode instance's prefill instances; freed once they run): with nothing
        running or loading, no block is ever freed, so the head never fits and admission, which stops at it,
        takes nobody. vLLM's scheduler waits forever there too. Under the priority policy its higher-priority
        head comes before the loaded requests (`_select_waiting_queue_for_scheduling` compares the two queues'
        heads). Under FCFS vLLM takes the loaded requests first (its skipped queue, `loaded_first`), so the head
        holds its KV. Under either policy a loaded head still asks slots for its speculative lookahead
        (`allocate_slots`' `num_lookahead_tokens`, 0 only for a request with no computed token): K more slots than
        it holds, a block more where they cross one, which a pool full of other loaded requests cannot give. None
        when the engine is not in that state (an FCFS head that loaded no KV: admission would not stop at it)."""
        if self.running or self.loading or not self.waiting or not self.held_kv_tokens:
            return None
        head, held, policy = self.waiting.peek(), self.held_kv_tokens, self.waiting.policy
        holders = [request_label(req.request_id) for req in self.waiting
                   if req.request_id in held and req is not head]
        advice = ("and nothing runs to free any: vLLM's scheduler waits forever there; give the KV cache more "
                  "blocks (engine.num_gpu_blocks_override, engine.gpu_memory_utilization)")
        if head.request_id in held:  # a loaded head: it asks more than it holds only for a speculative lookahead
            lookahead = self.speculation.num_lookahead_slots if self.speculation is not None else 0
            asks = f" and the {lookahead} slots of its speculative lookahead" if lookahead else ""
            others = f" while requests [{', '.join(holders)}] behind it hold theirs" if holders else ""
            return (f"engine.scheduling_policy={policy}: request {request_label(head.request_id)} heads the queue "
                    f"holding the KV it loaded from {self.held_kv_source} and cannot fit its next token{asks} in "
                    f"the KV cache{others}, {advice}")
        if policy != "priority" or not holders:
            return None
        return (f"engine.scheduling_policy=priority: request {request_label(head.request_id)} (priority "
                f"{head.priority}) heads the queue and cannot fit in the KV cache while requests "
                f"[{', '.join(holders)}] behind it hold the KV they loaded from {self.held_kv_source}, {advice}")

    def touch_offloaded(self, req: Request) -> None:
        """The waiting head `req` is considered for admission: its full blocks in the tiers become the most
        recently used, its first most of all, as vLLM's `get_num_new_matched_tokens` touches them each time
        the scheduler asks about a request not yet computed (a loaded one is not asked again)."""
        assert self.offload is not None
        num_full = self._blocks_asked(req)
        if num_full:
            assert req.content is not None
            self.offload.touch(req.content, num_full)

    def _blocks_asked(self, req: Request) -> int:
        """The full blocks of `req` the tiers are asked about, its last one included (vLLM's
        `get_num_new_matched_tokens`: `num_tokens // block_size`); 0 for a request without content or one
        whose KV it already holds (loaded: not asked again)."""
        assert self.offload is not None
        if req.content is None or req.request_id in self.held_kv_tokens:
            return 0
        return min(req.num_tokens, req.content.num_tokens) // self.offload.block_size

    def _store_computed(self, plan: StepPlan, now: float) -> None:
        """Offer the full blocks each request computed in this step to the offload tiers (write-through,
        vLLM's `_build_store_jobs`): every newly full block since the last offer taken, from block 0 on; with
        `offload_prompt_only` (vLLM's default) no further than the prompt's last full block
        (`num_offloadable_tokens = min(..., req.num_prompt_tokens)`), so decoded tokens' blocks are never offered."""
        assert self.offload is not None
        bs, next_stored = self.offload.block_size, self._next_stored_block
        prompt_only = self.offload.offload_prompt_only
        running = RequestStatus.RUNNING
        offers, offered = [], []
        for req, _ in plan.scheduled:
            content = req.content
            if req.status is not running or content is None:
                continue
            num_tokens = min(req.num_computed_tokens, content.num_tokens)
            num_full = (min(num_tokens, req.prompt_len) if prompt_only else num_tokens) // bs
            start = next_stored.get(req.request_id, 0)
            if num_full > start:
                offers.append((content.block_hashes(bs, num_full), start))
                offered.append((req.request_id, num_full))
        if offers:
            for (request_id, num_full), taken in zip(offered, self.offload.store(offers, now), strict=True):
                if taken:
                    next_stored[request_id] = num_full


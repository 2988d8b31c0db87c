"""The two pools of a disaggregated fleet and the hand-offs between them (`Disaggregation`).

`Disaggregation` routes each arrival to a prefill instance (asking one token), hands the request to a decode
instance once its prefill ends, reserves its blocks at the decode instance's step boundaries (in that queue's
order), starts its KV transfer on the decode instance's link and, when the transfer ends, frees the prefill
side's blocks and delivers the request to the decode queue with its KV held. `TRANSFER_COLUMNS` are its
transfer rows; `_PrefillClock` and `_DecodeClock` are each instance's arrival clock. A request's life, what a
client measures and the simplifications are `kvsim.fleet.disagg`'s (which runs the fleet: `simulate_disagg`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvsim.engine.builder import EngineParts
from kvsim.engine.clock import ArrivalClock, call_at, past_the_clock
from kvsim.engine.runtime import Engine
from kvsim.fleet.disagg_checks import check_decode_alike
from kvsim.fleet.driver import FleetView, Routes
from kvsim.fleet.kv_transfer import decode_link, kv_bytes_per_token_received, prefill_blocks_read
from kvsim.fleet.router import Router, prefix_table_blocks
from kvsim.kv import PagedAllocator
from kvsim.kv.link import SharedLink
from kvsim.model.config import load_model
from kvsim.model.errors import KvsimError
from kvsim.sched.request_queue import priority_key
from kvsim.workload.conversations import served_reply_len
from kvsim.workload.fleet_layout import KVTransferConfig
from kvsim.workload.fleet_layout import Router as RouterConfig
from kvsim.workload.generate import MAX_INSTANT_S
from kvsim.workload.request import Request, RequestStatus
from kvsim.workload.scenario import Scenario

TRANSFER_COLUMNS = ("request_id", "prefill_replica", "decode_replica", "num_bytes", "handoff_s", "start_s",
                    "end_s")


@dataclass(slots=True)
class _InFlight:
    req: Request
    prefill: int  # replica index
    handoff_s: float
    start_s: float
    num_bytes: int


def _make_router(config: RouterConfig, parts: Sequence[EngineParts], block_size: int) -> Router:
    return Router(config.policy, len(parts), block_size, config.load_bound, config.load_slack,
                  config.match_threshold, max_prefix_blocks=prefix_table_blocks(
                      (p.spec.kv_cache_size_tokens for p in parts), block_size))


class Disaggregation:
    """The two pools, their routers and the links into the decode instances; the hand-offs between them.

    Indices: `prefill[k]` / `decode[k]` are replica indices (the scenario's replica order).
    """

    def __init__(self, scenario: Scenario, specs: list[Scenario], parts: list[EngineParts],
                 engines: list[Engine]) -> None:
        config = scenario.kv_transfer_config
        assert config is not None and isinstance(scenario.replicas, list)
        roles = [group.kv_role for group in scenario.replicas for _ in range(group.count)]
        self.config: KVTransferConfig = config
        self.engines = engines
        self.prefill = [i for i, role in enumerate(roles) if role == "kv_producer"]
        self.decode = [i for i, role in enumerate(roles) if role == "kv_consumer"]
        for i, (spec, part) in enumerate(zip(specs, parts, strict=True)):
            if not isinstance(part.scheduler.alloc, PagedAllocator):  # a hybrid model's grouped pool (paged, v1)
                raise KvsimError(f"replicas ({spec.name}, {roles[i]}): model={spec.model} has sliding-window/chunked "
                                 "KV groups, and a disaggregated fleet is modelled moving one full-attention pool "
                                 "(vLLM disables the hybrid manager beside a KV connector without hybrid support); "
                                 f"{part.spec.kv_layout.full_attention_advice}")
        self.links = [SharedLink(decode_link(config, specs[d].engine)) for d in self.decode]
        self.token_bytes = [kv_bytes_per_token_received(load_model(specs[d].model), specs[d].engine)
                            for d in self.decode]
        self.block_size = [spec.engine.block_size for spec in specs]  # per replica
        self.p_view = FleetView([engines[i] for i in self.prefill])
        self.d_view = FleetView([engines[i] for i in self.decode])
        for pool, router in ((self.prefill, config.prefill_router), (self.decode, config.decode_router)):
            for i in pool:  # only a pool whose router reads KV usage needs it mid-burst (`Engine.kv_usage`)
                engines[i].observe_kv = router.policy == "least_kv"
        # each pool's router hashes at its first instance's block size (`kvsim.fleet.router`: one size a router)
        self.p_router = _make_router(config.prefill_router, [parts[i] for i in self.prefill],
                                     self.block_size[self.prefill[0]])
        self.d_router = _make_router(config.decode_router, [parts[i] for i in self.decode],
                                     self.block_size[self.decode[0]])
        multi_turn = scenario.workload.multi_turn
        if multi_turn is not None and multi_turn.turns > 1:  # a turn's reply is known before D is picked (reply_len)
            check_decode_alike(specs, [engine.scheduler for engine in engines], self.decode)
        self.p_routes, self.d_routes = Routes(), Routes()
        self.pending: list[deque[tuple[Request, int, float]]] = [deque() for _ in self.decode]
        self.in_flight: list[dict[int, _InFlight]] = [{} for _ in self.decode]
        self._timer: list[object] = [None] * len(self.decode)
        self.output_len: dict[int, int] = {}  # request id -> the client's max_tokens while it prefills
        self.transfers: dict[str, list[Any]] = {key: [] for key in TRANSFER_COLUMNS}
        self.num_handed_off = self.num_in_decode_queues = 0
        self.num_held = dict.fromkeys(self.prefill, 0)  # prefill replica -> requests whose KV it keeps for D
        self.env: Any = None  # the run's simpy.Environment (only kvsim.engine imports simpy)
        self.arrivals: ArrivalClock | None = None
        for i in self.prefill:
            engines[i].scheduler.hand_off = self._hand_off_from(i)
        for k, i in enumerate(self.decode):
            engines[i].at_step_boundary = self._reserve_on(k)
            engines[i].upstream_state = self._upstream_state(k)
            scheduler = engines[i].scheduler  # its held KV (`held_kv_tokens`) came from a prefill instance
            scheduler.held_kv_source = "a prefill instance (kv_transfer_config)" + (
                " or engine.kv_offload's tiers" if scheduler.offload is not None else "")

    def reply_len(self, req: Request) -> int:
        """The reply the client of turn `req` gets (`kvsim.workload.conversations.OpenTurns.reply_len`): for a turn
        still on a prefill instance, what the decode pool will give it, none if it refuses it, else the client's
        max_tokens cut at its max_model_len, as `hand_off` decides (the decode instances answer alike,
        `check_decode_alike`, so this is known before the router picks one); for any other, what its engine
        decided (`served_reply_len`: refused by its prefill instance, or by or on its decode instance). The probe
        is `hand_off`'s decision exactly: `reject_reason` reads only the lengths, D's limits and its pool's size,
        never its state, so a full pool, a priority or held KV makes a turn wait, never answer otherwise."""
        asked = self.output_len.get(req.request_id)
        if asked is None:
            return served_reply_len(req)
        scheduler = self.engines[self.decode[0]].scheduler
        probe = Request(req.request_id, req.arrival_s, req.prompt_len, asked)
        probe.cap_output(scheduler.limits.max_model_len)
        return 0 if scheduler.reject_reason(probe) is not None else probe.output_len

    # ---------------------------------------------------------------- the clocks
    def clocks(self, env: Any, arrivals: ArrivalClock) -> list[ArrivalClock]:
        """The run's arrivals feed the prefill instances; hand-offs feed the decode instances."""
        self.env, self.arrivals = env, arrivals
        decode = set(self.decode)
        return [_DecodeClock(self, self.decode.index(i)) if i in decode else _PrefillClock(self, i, arrivals)
                for i in range(len(self.engines))]

    def upstream_done(self) -> bool:
        """No request can still reach a decode queue: all arrived, none on a prefill instance or between."""
        assert self.arrivals is not None
        if not self.arrivals.all_arrived:
            return False
        ended_on_prefill = sum(len(self.engines[i].scheduler.records) for i in self.prefill)
        on_prefill = sum(self.p_view.dispatched) - ended_on_prefill
        return on_prefill == 0 and self.num_handed_off == self.num_in_decode_queues

    def _upstream_state(self, k: int) -> Callable[[], tuple[Any, ...] | None]:
        def state() -> tuple[Any, ...] | None:
            """Decode instance k's `Engine.upstream_state`, once every request has arrived and no transfer is in
            flight to any decode instance (one to another frees a prefill instance's blocks when it ends: that
            instance may then prefill a request and hand it to k): the hand-offs waiting for each decode instance's
            blocks, in order, and the state of each prefill instance, which runs nothing and is between steps
            (`Scheduler.idle_state`: its head waits for the KV it keeps for hand-offs, freed only when a transfer
            ends). Both change then only where a decode instance's step boundary reserves blocks and starts a
            transfer. None before, or while a prefill instance runs or steps."""
            assert self.arrivals is not None and self.env is not None
            if not self.arrivals.all_arrived or any(self.in_flight):
                return None
            prefill_states = []
            for i in self.prefill:
                engine = self.engines[i]
                idle = engine.scheduler.idle_state() if not engine.inbox and engine.step_end_s <= self.env.now else None
                if idle is None:
                    return None
                prefill_states.append(idle)
            return (tuple(tuple(req.request_id for req, _, _ in pending) for pending in self.pending),
                    tuple(prefill_states))
        return state

    def _ring_decode_if_done(self) -> None:
        if self.upstream_done():
            for i in self.decode:
                self.engines[i].wakeup.ring()

    # ---------------------------------------------------------------- dispatch
    def dispatch(self, req: Request, now: float) -> int:
        """A request arrives: to a prefill instance, asking for one token (the proxy's max_tokens=1). One the
        instance refuses (`reject_reason`) goes with the client's max_tokens instead, so that its row keeps the
        output asked, as a refused request's row does on one engine (docs/metrics.md `reject_reasons`): it is
        refused the same way, since no reason passes a longer output that refused one token."""
        self.p_view.now_s = now
        decision = self.p_router.route(req, self.p_view)
        self.p_routes.add(req, decision)
        self.p_view.dispatched[decision.replica] += 1
        prefill, asked = self.prefill[decision.replica], req.output_len
        req.output_len = 1
        if self.engines[prefill].scheduler.reject_reason(req) is None:
            # the client's whole max_tokens, uncut: its prefill row cut none of its one token (the decode instance's
            # max_model_len cuts it at the hand-off), where the row showed the cut made when the requests were drawn
            self.output_len[req.request_id] = asked + req.num_length_capped_tokens
            req.num_length_capped_tokens = 0
        else:
            req.output_len = asked
        return prefill

    def _hand_off_from(self, prefill: int):  # type: ignore[no-untyped-def]
        def hand_off(req: Request, now: float) -> None:
            """P sampled its token (its KV stays held): the request is the client's again, for a decode instance."""
            req.output_len = self.output_len.pop(req.request_id)
            req.status, req.num_computed_tokens, req.num_output_tokens = RequestStatus.WAITING, 0, 0
            req.first_token_s = req.finish_s = None
            req.has_drafts = False  # a new request to the decode instance: no drafts of its own yet
            # D's is a new vLLM Request (its first admission no re-admission); the row keeps P's in the total
            req.num_prior_preemptions += req.num_preemptions
            req.num_preemptions = 0
            req.engine_arrival_s = now  # D's frontend stamps its arrival on receipt: D's queue orders by it
            self.num_handed_off += 1
            self.num_held[prefill] += 1
            self.d_view.now_s = now
            decision = self.d_router.route(req, self.d_view)
            self.d_routes.add(req, decision)
            self.d_view.dispatched[decision.replica] += 1
            engine = self.engines[self.decode[decision.replica]]
            req.cap_output(engine.scheduler.limits.max_model_len)  # the client's max_tokens, capped to D's limit
            if engine.scheduler.reject_reason(req) is not None:  # D can never hold it: rejected there
                self._release(prefill, req)
                self.num_in_decode_queues += 1
                engine.scheduler.add(req)
                self._ring_decode_if_done()
                return
            self.pending[decision.replica].append((req, prefill, now))
            engine.scheduler.num_remote_waiting += 1  # in D's waiting queue from now, as vLLM's
            if engine.burst is not None:
                engine.burst.cut(now)  # D reserves at its next step boundary
            engine.wakeup.ring()
        return hand_off

    def _release(self, prefill: int, req: Request) -> None:
        """The prefill instance frees the request's KV; it may admit what waited for those blocks."""
        engine = self.engines[prefill]
        engine.scheduler.free_request(req)
        self.num_held[prefill] -= 1
        engine.wakeup.ring()

    # ---------------------------------------------------------------- decode side
    def _reserve_on(self, k: int):  # type: ignore[no-untyped-def]
        def reserve(now: float) -> None:
            """At a step boundary of decode instance k: under FCFS, requests whose KV has arrived go first in the
            queue, as admission's `loaded_first` puts them, so that burst planning (`waiting_blocked`) sees the
            head admission will (they need no new block: a preempted request that cannot fit never blocks them);
            a priority queue keeps its keys' order (`held_kv_stall` names its deadlock); then blocks for pending
            transfers in D's queue order, unless a local request comes first in it or
            the running batch is full: vLLM reserves a remote request's blocks in the scheduler's waiting loop
            (WAITING_FOR_REMOTE_KVS), which takes D's queue in its policy's order and stops once `len(running)`
            reaches `max_num_seqs` (a reservation does not run yet, so below that every pending transfer may
            start). FCFS: hand-off order, and any local waiting request (a preempted one, back at the front)
            comes first; priority: smallest `priority_key` first (its arrival the hand-off, as D's frontend
            stamps it), a local request only ahead of those it precedes. Not modelled: vLLM's loop also ends
            once the step's token budget is spent (`while self.waiting and token_budget > 0`; a reservation
            itself takes none, num_new_tokens = 0): reservations here come before the step is planned."""
            scheduler = self.engines[self.decode[k]].scheduler
            waiting, held = scheduler.waiting, scheduler.held_kv_tokens
            scheduler.loaded_first()  # FCFS only; nothing to move where nothing is held
            pending = self.pending[k]
            if not pending or scheduler.num_running_seqs() >= scheduler.limits.max_num_seqs:
                return
            by_priority = waiting.policy == "priority"
            if not by_priority and len(waiting) > len(held):
                return
            local_first = min((priority_key(r) for r in waiting if r.request_id not in held), default=None) \
                if by_priority else None
            alloc, started = scheduler.alloc, False
            while pending:
                index = min(range(len(pending)), key=lambda i: priority_key(pending[i][0])) if by_priority else 0
                req, prefill, handoff_s = pending[index]
                if local_first is not None and local_first < priority_key(req):
                    break  # a local request comes first in D's queue
                hit = scheduler.lookup(req)  # D's own hit, as its scheduler looks up (EAGLE drops its last block)
                seq_id = req.seq_ids[0]
                if not alloc.allocate(seq_id, req.prompt_len, req.kv_len, req.content, hit):
                    break  # vLLM's decode side: the request waits until its blocks can be allocated
                del pending[index]
                if alloc.enable_caching:  # vLLM counts no query without prefix caching
                    scheduler.prefix_stats.record(req.prompt_len, hit.num_tokens, preempted=False)
                p_size = self.block_size[prefill]  # D reads P's blocks (`prefill_blocks_read`)
                num_blocks = prefill_blocks_read(req.prompt_len, p_size, self.block_size[self.decode[k]],
                                                 len(hit.block_ids))
                num_bytes = num_blocks * p_size * self.token_bytes[k]
                self.links[k].start(req.request_id, num_bytes, now)
                self.in_flight[k][req.request_id] = _InFlight(req, prefill, handoff_s, now, num_bytes)
                started = True
            if started:
                self._arm(k)
        return reserve

    def _arm(self, k: int) -> None:
        """Wake at the next transfer end on link k (a later start re-arms: the older timer is ignored)."""
        assert self.env is not None
        nxt = self.links[k].next_end()
        token = self._timer[k] = object()
        if nxt is not None:
            if nxt[0] > MAX_INSTANT_S:
                bandwidth = self.links[k].spec.bandwidth_bytes_per_s
                raise past_the_clock(f"kv_transfer_config: a KV transfer at {bandwidth:g} B/s", nxt[0],
                                     "kv_link_bandwidth_bytes_per_s and kv_link_latency_s")
            call_at(self.env, max(nxt[0], self.env.now), lambda: self._transfers_end(k, token))

    def _transfers_end(self, k: int, token: object) -> None:
        if token is not self._timer[k]:
            return
        assert self.env is not None
        now = self.env.now
        engine = self.engines[self.decode[k]]
        for request_id in self.links[k].advance(now):
            flight = self.in_flight[k].pop(request_id)
            req = flight.req
            self._release(flight.prefill, req)  # P frees when the transfer ends
            for key, value in zip(TRANSFER_COLUMNS, (request_id, flight.prefill, self.decode[k], flight.num_bytes,
                                                     flight.handoff_s, flight.start_s, now), strict=True):
                self.transfers[key].append(value)
            engine.scheduler.held_kv_tokens[request_id] = req.prompt_len - 1
            engine.scheduler.num_remote_waiting -= 1
            self.num_in_decode_queues += 1
            engine.deliver(now, req)
        self._arm(k)
        self._ring_decode_if_done()


@dataclass(slots=True)
class _PrefillClock:
    """A prefill instance's arrival clock: the run's arrivals, and it is not done while it keeps KV for
    transfers (its queue may wait for those blocks; their release wakes it)."""

    disagg: Disaggregation
    replica: int
    arrivals: ArrivalClock

    @property
    def all_arrived(self) -> bool:
        return self.arrivals.all_arrived and not self.disagg.num_held[self.replica]

    def horizon_s(self, num_ahead: int) -> float:
        return self.arrivals.horizon_s(num_ahead)

    def none_delivered_at(self, instants_s: Sequence[float]) -> bool:
        return self.arrivals.none_delivered_at(instants_s)


@dataclass(slots=True)
class _DecodeClock:
    """A decode instance's arrival clock: requests join its queue when their transfers end."""

    disagg: Disaggregation
    k: int

    @property
    def all_arrived(self) -> bool:
        return self.disagg.upstream_done() and not self.disagg.pending[self.k] and not self.disagg.in_flight[self.k]

    def horizon_s(self, num_ahead: int) -> float:
        return float("inf")  # unknown: a burst planned with an empty queue is cut when a request joins

    def none_delivered_at(self, instants_s: Sequence[float]) -> bool:
        return not self.disagg.in_flight[self.k]  # a transfer may end on a step's end: step by step then

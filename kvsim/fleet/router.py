"""Routers: which replica of a fleet serves an arriving request. Pure Python, no simpy.

A router is called at the request's arrival instant with the replicas' state, so it
sees what a production router sees from its replicas' metrics at that moment:

| policy              | picks                                                                |
|---------------------|----------------------------------------------------------------------|
| `round_robin`       | replicas in turn                                                     |
| `least_outstanding` | fewest requests waiting + running + swapped (vLLM's `num_requests_*`) |
| `least_kv`          | lowest `kv_cache_usage_perc`, then fewest outstanding                |
| `affinity`          | where the prompt's longest prefix of blocks was last routed, within  |
|                     | a load bound; otherwise the least outstanding                        |

Ties go to the first replica at or after a rotating start, so idle fleets spread requests
instead of piling them on replica 0. Affinity keys are the prompt's chained block hashes
(the same hashes prefix caching uses, so a conversation's earlier turns and a shared system
prompt match), kept for at most as many tokens as the whole fleet's KV pools hold (older
entries are forgotten first, as the caches themselves evict; `prefix_table_blocks`). The router hashes at
one block size, the scenario engine's (in a disaggregated fleet, each pool's router its pool's first
instance's), whatever its replicas' own: a router-side index approximates the
replicas' caches at a granularity of its own, as llm-d's prefix-cache scorer hashes every prompt at one
`blockSizeTokens` (a router parameter, 16 by default, auto-tuned from the endpoints' metrics) and its
precise scorer at the one block size it is configured to match; neither hashes per candidate. A match of
m blocks is m · block_size prompt tokens, which a replica of larger blocks caches down to its last full
block. The load bound follows
consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA 2018): the
preferred replica is taken if its outstanding requests, counting this one, stay within
`load_bound · (all outstanding + 1) / num_replicas`, or (so that a lightly loaded fleet
does not scatter conversations over one request in flight) within `load_slack` of the
least loaded replica. A match shorter than `match_threshold` of the prompt (a common first
block, say) is no reason to herd requests, so they go to the least loaded instead. SGLang's
cache-aware router makes the same trades with its `cache_threshold` and its relative and
absolute balance thresholds (`balance_rel_threshold`, `balance_abs_threshold`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from kvsim.workload.request import Request


def prefix_table_blocks(pool_tokens: Iterable[int], block_size: int) -> int:
    """Entries of `block_size` tokens an affinity table keeps: as many tokens as the replicas' KV pools hold
    (`pool_tokens`: each one's `EngineSpec.kv_cache_size_tokens`, its blocks divided among its KV cache groups,
    each of which holds a block per prefix block), counted in the router's blocks, not theirs."""
    return sum(pool_tokens) // block_size


class FleetState(Protocol):
    """What a router may read of the replicas at an arrival, one value per replica in replica order."""

    def outstanding(self) -> list[int]:
        """Requests each holds and has not finished: waiting (or arrived in a burst), running, swapped out."""
        ...

    def kv_usage(self) -> list[float]:
        """Each one's `vllm:kv_cache_usage_perc` now."""
        ...


@dataclass(frozen=True, slots=True)
class Decision:
    """Why a request went where it went (one row of the run's `routes` table)."""

    replica: int
    reason: str  # "turn", "least_outstanding", "least_kv", "affinity", "new_prefix", "over_bound"
    matched_tokens: int = 0  # prompt tokens whose blocks were last routed to the preferred replica


@dataclass(slots=True)
class Router:
    """A routing policy with its state; `route(req, replicas)` is called once per arrival."""

    policy: str
    num_replicas: int
    block_size: int = 16
    load_bound: float = 1.25
    load_slack: int = 8
    match_threshold: float = 0.25
    max_prefix_blocks: int = 1 << 20
    _turn: int = 0
    _owner: OrderedDict[int, int] = field(default_factory=OrderedDict)  # block hash -> replica

    def __post_init__(self) -> None:
        assert self.policy in ("round_robin", "least_outstanding", "least_kv", "affinity"), self.policy
        assert self.num_replicas > 0 and self.block_size > 0 and self.load_bound >= 1.0

    def route(self, req: Request, fleet: FleetState) -> Decision:
        start = self._turn % self.num_replicas
        self._turn += 1
        if self.policy == "round_robin":
            return Decision(start, "turn")
        if self.policy == "least_kv":
            loads, usage = fleet.outstanding(), fleet.kv_usage()
            n = self.num_replicas
            return Decision(min(range(n), key=lambda i: (usage[i], loads[i], (i - start) % n)), "least_kv")
        if self.policy == "least_outstanding":
            return Decision(self._least(fleet.outstanding(), start), "least_outstanding")
        return self._affinity(req, fleet.outstanding(), start)

    def _least(self, loads: list[int], start: int) -> int:
        """The least loaded replica, the first at or after `start` (wrapping) on a tie."""
        assert len(loads) == self.num_replicas
        fewest = min(loads)
        try:
            return loads.index(fewest, start)
        except ValueError:
            return loads.index(fewest)

    def _affinity(self, req: Request, loads: list[int], start: int) -> Decision:
        num_blocks = req.prompt_len // self.block_size
        hashes = req.content.block_hashes(self.block_size, num_blocks) if req.content is not None and num_blocks \
            else []
        owner = self._owner
        matched, preferred = 0, -1
        for h in hashes:  # the longest routed prefix: stop at the first block never routed
            replica = owner.get(h)
            if replica is None:
                break
            matched, preferred = matched + 1, replica
        if preferred < 0 or matched * self.block_size < self.match_threshold * req.prompt_len:
            decision = Decision(self._least(loads, start), "new_prefix", matched * self.block_size)
        else:
            within_bound = (loads[preferred] + 1) * self.num_replicas <= self.load_bound * (sum(loads) + 1)
            if within_bound or loads[preferred] - min(loads) < self.load_slack:
                decision = Decision(preferred, "affinity", matched * self.block_size)
            else:
                decision = Decision(self._least(loads, start), "over_bound", matched * self.block_size)
        for h in hashes:
            owner[h] = decision.replica
            owner.move_to_end(h)
        while len(owner) > self.max_prefix_blocks:
            owner.popitem(last=False)
        return decision

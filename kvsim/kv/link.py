"""A link shared by concurrent KV transfers: a fixed latency, then bytes drained at a fairly shared bandwidth.

Disaggregated prefill/decode moves a request's KV from a prefill instance to a decode instance over a
link (NVLink, PCIe or an RDMA NIC). One transfer alone takes `latency_s + num_bytes / bandwidth`.
Transfers in flight together share the bandwidth equally (processor sharing, as concurrent flows on one
link do to first order), so two equal transfers started together both end at
`latency_s + 2 · num_bytes / bandwidth`:

    time ─▶   start            +latency           ends (2 active: each drains at bw / 2)
    A         |──── latency ────|████████████████████|
    B         |──── latency ────|████████████████████|

The latency is paid before a transfer starts draining and is not shared. Pure Python, no simulated
clock of its own: the caller (the fleet's step loop) tells it the time at every start and asks when the
next transfer ends; the answer changes whenever a transfer starts or ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kvsim.model.errors import KvsimError


@dataclass(frozen=True, slots=True)
class LinkSpec:
    """A link's speed: `bandwidth_bytes_per_s` shared by the transfers in flight, `latency_s` per transfer."""

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bandwidth_bytes_per_s) and self.bandwidth_bytes_per_s > 0):
            raise KvsimError(f"bandwidth_bytes_per_s={self.bandwidth_bytes_per_s!r}: expected a positive number")
        if not (math.isfinite(self.latency_s) and self.latency_s >= 0):
            raise KvsimError(f"latency_s={self.latency_s!r}: expected a number >= 0")


@dataclass(slots=True)
class _Transfer:
    drain_from_s: float  # when its latency is over and it starts sharing the bandwidth
    remaining_bytes: float


@dataclass(slots=True)
class SharedLink:
    """Transfers in flight on one link. `start` at `now_s`; `next_end()` gives (instant, id) of the first to end
    if nothing else starts; `advance(now_s)` books the bytes drained up to `now_s` and returns the ids that ended.

    Contract: calls come with non-decreasing `now_s`; a transfer id is in flight at most once.
    `bytes_moved` counts every byte of every ended transfer (a pool's "bytes moved" metric);
    `ended_s` holds the instant each transfer the last `advance` returned ended, in its order.
    """

    spec: LinkSpec
    bytes_moved: int = 0
    ended_s: list[float] = field(default_factory=list)
    _active: dict[int, _Transfer] = field(default_factory=dict)
    _sizes: dict[int, int] = field(default_factory=dict)
    _now_s: float = 0.0

    @property
    def num_in_flight(self) -> int:
        return len(self._active)

    @property
    def in_flight_ids(self) -> set[int]:
        return set(self._active)

    def start(self, transfer_id: int, num_bytes: int, now_s: float) -> None:
        assert transfer_id not in self._active, f"transfer {transfer_id} is already in flight"
        if num_bytes < 0:
            raise KvsimError(f"num_bytes={num_bytes}: expected >= 0")
        self.advance(now_s)
        self._active[transfer_id] = _Transfer(now_s + self.spec.latency_s, float(num_bytes))
        self._sizes[transfer_id] = num_bytes

    @property
    def bytes_drained(self) -> float:
        """Bytes moved up to the link's clock (its last `start`/`advance`): every byte of the ended transfers and
        the bytes drained so far of those in flight. ÷ the bandwidth: the seconds the link was busy, the union of
        the intervals in which some transfer was draining (it then moves its full bandwidth however many share
        it; a transfer still in its latency moves nothing)."""
        return self.bytes_moved + sum(self._sizes[i] - t.remaining_bytes for i, t in self._active.items())

    def _draining(self, at_s: float) -> list[int]:
        return [i for i, t in self._active.items() if t.drain_from_s <= at_s]

    def next_end(self) -> tuple[float, int] | None:
        """The instant the next transfer ends (and its id), if no other transfer starts before then."""
        if not self._active:
            return None
        if len(self._active) == 1:  # hot (a link mostly carries one transfer): the loop below, unrolled
            ((i, t),) = self._active.items()
            start_s = t.drain_from_s if t.drain_from_s > self._now_s else self._now_s
            return start_s + t.remaining_bytes / self.spec.bandwidth_bytes_per_s, i
        now, remaining = self._now_s, {i: t.remaining_bytes for i, t in self._active.items()}
        pending = sorted((t.drain_from_s, i) for i, t in self._active.items() if t.drain_from_s > now)
        draining = [i for i in remaining if self._active[i].drain_from_s <= now]
        while True:
            rate = self.spec.bandwidth_bytes_per_s / len(draining) if draining else 0.0
            first = min(draining, key=lambda i: (remaining[i], i)) if draining else None
            end_s = now + remaining[first] / rate if first is not None else math.inf
            if pending and pending[0][0] < end_s:  # a transfer's latency ends first: it joins the sharing
                joins_s, joining = pending.pop(0)
                for i in draining:
                    remaining[i] -= rate * (joins_s - now)
                now = joins_s
                draining.append(joining)
                continue
            assert first is not None
            return end_s, first

    def advance(self, now_s: float) -> list[int]:
        """Drain the bytes the link moves until `now_s`; return the ids of the transfers that ended (in order)."""
        assert now_s >= self._now_s, f"time went back: {now_s} < {self._now_s}"
        ended: list[int] = []
        self.ended_s = []
        while (nxt := self.next_end()) is not None and nxt[0] <= now_s:
            self._drain_until(nxt[0])
            del self._active[nxt[1]]
            self.bytes_moved += self._sizes.pop(nxt[1])
            ended.append(nxt[1])
            self.ended_s.append(nxt[0])
        self._drain_until(now_s)
        return ended

    def _drain_until(self, until_s: float) -> None:
        """Move bytes from `self._now_s` to `until_s`, with joins of transfers whose latency ends between."""
        now = self._now_s
        while now < until_s:
            joins = [t.drain_from_s for t in self._active.values() if now < t.drain_from_s < until_s]
            step_end = min(joins, default=until_s)
            draining = self._draining(now)
            if draining:
                rate = self.spec.bandwidth_bytes_per_s / len(draining)
                for i in draining:
                    t = self._active[i]
                    t.remaining_bytes = max(0.0, t.remaining_bytes - rate * (step_end - now))
            now = step_end
        self._now_s = max(self._now_s, until_s)

"""The one interface every KV allocator implements, and the small value types it speaks in.

The scheduler, the engine and the metrics drive allocators only through `KVAllocator`;
none of them asks which kind it holds. Paged (`paged.py`) and contiguous slab (`slab.py`)
allocators and the grouped paged allocator of sliding-window and hybrid models
(`hybrid.py`) implement it; another attention type plugs in by implementing the same
methods. This module is a leaf: it imports nothing from kvsim but the content types.

Units: every size is in token *slots* (one token's KV for one sequence), never blocks, so
allocators with different granularity compare directly. A *sequence* is identified by an
int id; a request with n samples owns n of them.

Contracts shared by all implementations:

* `can_allocate(...)` is True exactly when `allocate(...)` with the same arguments would
  succeed; `allocate` is all-or-nothing: an `Allocation` (what it cost besides new blocks),
  or None when nothing changed ("can't" is a return value).
* Growth is monotone: `allocate(seq, n)` with `n` at most what is written only re-checks.
* `free` releases everything a sequence holds, on the GPU or swapped out.
* `swap_out`/`swap_in` move whole groups or nothing (None: nothing changed).
* Counters (`num_held_slots`, `num_filled_slots`, `num_reserved_slots`) are kept
  incrementally and re-derived from scratch by `check_invariants`, which raises
  AssertionError on any inconsistency.
* The `burst_*` methods describe exactly what `num_steps` rounds of
  `allocate(seq, written + 1)` over `seq_ids` in order would do (see
  `kvsim.sched.burst` for why that makes multi-step decode bursts exact).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from kvsim.workload.content import Content


@dataclass(frozen=True, slots=True)
class PrefixHit:
    """Cached blocks a new sequence can start from: `num_tokens` tokens in `block_ids`.

    `num_uncomputed_tokens`: the hit's trailing tokens whose blocks are shared but whose KV is not
    computed yet (vLLM v0 fills a block's content in the step that admits its first holder, so a second
    sequence admitted in that step shares the block's memory but computes its tokens itself);
    `num_computed_tokens` are the tokens a sequence starting from this hit skips.
    """

    num_tokens: int
    block_ids: tuple[int, ...]
    num_uncomputed_tokens: int = 0

    @property
    def num_computed_tokens(self) -> int:
        return self.num_tokens - self.num_uncomputed_tokens


@dataclass(frozen=True, slots=True)
class SwapResult:
    """What a swap moved: `num_blocks` units (blocks, or tokens for slabs) and their bytes."""

    num_blocks: int
    num_bytes: int


@dataclass(frozen=True, slots=True)
class Allocation:
    """A successful `allocate`: `num_copied_blocks` shared blocks it copied first (copy-on-write)."""

    num_copied_blocks: int = 0


NO_HIT = PrefixHit(0, ())
ALLOCATED = Allocation()  # the common result: nothing copied
Occupancy = tuple[list[int], list[int], list[int]]  # held, filled, reserved slots after each step of a burst


class KVAllocator(Protocol):
    """What the scheduler, engine and metrics use of a KV allocator (all sizes in slots)."""

    shares_blocks: bool  # True: `fork` shares the parent's KV; False: each sample reserves its own region
    supports_bursts: bool  # False: the `burst_*` methods are never called (plan every step)
    admits_by_chunk_above_tokens: int | None  # a v1 admission of more tokens asks for its first chunk's blocks,
    # not the whole prompt's (None: always the whole prompt's)
    enable_caching: bool  # False: no prefix cache (lookups never hit, and nothing is counted as queried)
    num_copy_on_writes: int

    # ------------------------------------------------------------- sizes and usage
    @property
    def num_total_slots(self) -> int: ...
    @property
    def num_held_slots(self) -> int: ...
    @property
    def num_free_slots(self) -> int: ...
    @property
    def num_filled_slots(self) -> int:
        """Slots holding a token that is stored and still needed (shared slots counted once)."""
    @property
    def num_reserved_slots(self) -> int:
        """Held slots their owner has not written yet but will (below its final length)."""
    @property
    def num_slack_slots(self) -> int:
        """Held slots a placement rounded up beyond what the policy asked (buddy slabs)."""
    @property
    def num_mapped_slots(self) -> int:
        """Σ over GPU sequences of the slots each one maps (a shared slot counted per sharer)."""
    @property
    def usage(self) -> float:
        """vLLM's `kv_cache_usage_perc`: 1 − free / total."""

    def external_fragmentation_slots(self, next_request_slots: int | None) -> int:
        """Free slots unusable for a region of `next_request_slots` (None: nobody waits)."""
    def region_slots(self, final_num_tokens: int, prompt_len: int | None = None) -> int:
        """Slots one sequence of `final_num_tokens` tokens (`prompt_len` of them prompt) occupies at its largest."""
    def never_fits_reason(self, final_num_tokens: int, prompt_len: int | None = None) -> str | None:
        """Why one such sequence could never be placed even in the empty pool, or None."""
    def request_slots(self, prompt_len: int, final_num_tokens: int, num_samples: int) -> int:
        """Slots a whole request (all samples, at their largest) holds at once."""

    # ------------------------------------------------------------------ allocation
    def lookup_prefix(self, content: Content | None, num_tokens: int) -> PrefixHit: ...
    def mark_blocks_as_computed(self) -> None:
        """The step's admissions are computed: hits on their blocks count as computed from now on
        (vLLM v0's `mark_blocks_as_computed`, called once the scheduler has built the step's batch)."""
    def can_allocate(self, seq_id: int, num_tokens_total: int, final_num_tokens: int | None = None,
                     hit: PrefixHit = NO_HIT, reserve_slots: int = 0, num_samples: int = 1,
                     prompt_len: int | None = None) -> bool:
        """Whether `allocate` would succeed leaving `reserve_slots` free; for a new request with
        `num_samples` > 1, also whether its siblings' regions fit (allocators that do not share)."""
    def allocate(self, seq_id: int, num_tokens_total: int, final_num_tokens: int | None = None,
                 content: Content | None = None, hit: PrefixHit = NO_HIT, reserve_slots: int = 0) -> Allocation | None:
        """Make the sequence hold `num_tokens_total` written slots (a new one starts from `hit`);
        None, changing nothing, when the space is not there."""
    def append_token(self, seq_id: int) -> bool:
        """`allocate(seq_id, written + 1)` if that needs no new space (a decode's common case), else
        False with nothing changed: the caller then takes the general path (`allocate`)."""
    def hold(self, seq_id: int, num_slots: int) -> bool:
        """Hold space for `num_slots` slots without writing them (speculative verify and lookahead
        slots); all or nothing. Paged only."""
    def reserve(self, seq_id: int, final_num_tokens: int, prompt_len: int | None = None) -> bool:
        """Set aside a sample's own space at admission, before `allocate` (True, no-op, if shared)."""
    def slots_needed(self, seq_ids: Sequence[int], num_tokens_total: int) -> int:
        """Free slots growing every sequence of a group to `num_tokens_total` takes."""
    def holds(self, seq_id: int) -> bool:
        """Whether the sequence holds anything (on the GPU or swapped out)."""
    def fork(self, parent_id: int, child_id: int, child_content: Content | None = None,
             child_final_num_tokens: int | None = None) -> None:
        """Start `child_id` off `parent_id`'s written tokens; its tokens are `child_content`, else the parent's
        so far and then its own (`Content.branch`), never the parent's next ones."""
    def free(self, seq_id: int) -> None: ...
    def forget_newest_hashes(self, seq_id: int, num_tokens: int) -> None:
        """Take the full blocks holding any of the sequence's newest `num_tokens` written tokens out of the prefix
        cache (they stay in its table): vLLM had not cached them yet, their tokens unknown when it last cached
        (a token in flight under async scheduling, accepted drafts: `kvsim.sched.async_steps.AsyncSteps.
        forget_in_flight_hash`, `kvsim.sched.speculative_steps.SpeculativeSteps.forget_draft_hashes`); the
        caller frees the sequence next. No-op without caching."""

    # ------------------------------------------------------------------------ swap
    def swap_out(self, seq_ids: Sequence[int]) -> SwapResult | None: ...
    def swap_in_growth_slots(self, seq_ids: Sequence[int]) -> int:
        """Slots a swapped group needs, once back, for each sequence's next token."""
    def can_swap_in(self, seq_ids: Sequence[int], reserve_slots: int = 0) -> bool: ...
    def swap_in(self, seq_ids: Sequence[int], reserve_slots: int = 0) -> SwapResult | None: ...

    # --------------------------------------------------------------- decode bursts
    def burst_fits(self, seq_ids: Sequence[int], num_steps: int) -> bool:
        """Whether the new space of `num_steps` decode steps of every sequence fits in the free slots."""
    def append_burst(self, seq_ids: Sequence[int], num_steps: int) -> Occupancy:
        """`num_steps` decode steps of every sequence at once; returns what `burst_occupancy` said before."""
    def burst_occupancy(self, seq_ids: Sequence[int], num_steps: int) -> Occupancy:
        """Held, filled and reserved slots after each of the next `num_steps` decode steps."""
    def burst_extends_prefix(self, seq_ids: Sequence[int], num_steps: int, content: Content | None,
                             num_tokens: int) -> bool:
        """Whether `lookup_prefix(content, num_tokens)` could find more after the burst."""

    def state_key(self) -> tuple[Any, ...] | None:
        """Everything of the allocator that a later call's result depends on, as a hashable value: equal keys,
        equal futures (the scheduler's livelock check, `kvsim.sched.livelock`); None where it cannot say."""

    def check_invariants(self) -> None: ...

"""Contiguous slab allocation: the pre-PagedAttention baseline (the paper's Orca variants).

Each sequence reserves one contiguous region of token slots when it is admitted; the
policy says how many slots it asks for (Kwon et al., SOSP 2023, §6.1):

    policy `max`    → max_model_len slots
    policy `pow2`   → the prompt + the output length rounded up to a power of two
                      (the paper: "reserving 32 slots for 25 output tokens"), at most max_model_len
    policy `oracle` → exactly prompt + output

The placement decides where it goes and how many slots it really holds:

    `buddy` (the paper's Orca, default)  the request rounded up to a power of two; the extra
                                          slots are *slack*
    `first-fit`                           exactly the request, first free run that fits

    address space  0                                                    num_total_slots
                   |[A: 2048.......]|  free  |[B: 512..]|[C: 1024.....]|    free     |
                     ^ written ^ reserved ^ internal fragmentation ^ slack

External fragmentation appears by itself: free space split into blocks too short for the
next request's region. Slab pools have no null block (only vLLM's paged pool reserves one).

Contract: `allocate` is all-or-nothing; writing past a region is a `KvsimError` (the
request outgrew the slab its policy gave it); regions never overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from kvsim.kv.protocol import ALLOCATED, NO_HIT, Allocation, Occupancy, PrefixHit, SwapResult
from kvsim.kv.regions import BuddySpace, FreeRuns
from kvsim.model.errors import KvsimError
from kvsim.workload.content import Content

SlabPolicy = Literal["max", "pow2", "oracle"]
SlabPlacement = Literal["buddy", "first-fit"]


@dataclass(slots=True)
class Slab:
    start: int
    size: int  # slots held (the placement's rounding included)
    num_tokens: int
    final_num_tokens: int
    policy_size: int  # slots the policy asked for; size − policy_size is slack


def region_slots(policy: SlabPolicy, final_num_tokens: int, max_model_len: int, prompt_len: int | None = None) -> int:
    """Slots a sequence of `final_num_tokens` KV slots (prompt + output) asks for under `policy`.

    `pow2` reserves the prompt and its output length rounded up to a power of two, the paper's "32 slots for
    25 output tokens": the output is `final_num_tokens + 1 − prompt_len` tokens, the last sampled one holding
    no slot (`Request.kv_len`), so 33 output tokens reserve 64, not the 32 their 32 slots would round to.
    Without `prompt_len` the whole length is rounded.
    """
    if policy == "max":
        return max_model_len
    if policy == "pow2":
        if prompt_len is not None and prompt_len <= final_num_tokens:
            prompt, output_tokens = prompt_len, final_num_tokens + 1 - prompt_len
        else:
            prompt, output_tokens = 0, final_num_tokens
        return max(final_num_tokens, min(prompt + (1 << (output_tokens - 1).bit_length()), max_model_len))
    return final_num_tokens


class SlabAllocator:
    """One contiguous region per sequence in a single token address space (first-fit or buddy).

    Implements `kvsim.kv.protocol.KVAllocator`.
    """

    shares_blocks = False
    supports_bursts = True
    admits_by_chunk_above_tokens: int | None = None  # a slab is reserved whole at admission
    enable_caching = False  # slabs share nothing

    def __init__(self, num_slots: int, max_model_len: int, policy: SlabPolicy,
                 num_cpu_slots: int = 0, bytes_per_token: int = 0, placement: SlabPlacement = "first-fit") -> None:
        self.num_total_slots = num_slots
        self.max_model_len = max_model_len
        self.policy = policy
        self.placement = placement
        self.free_runs: FreeRuns | BuddySpace = BuddySpace(num_slots) if placement == "buddy" else FreeRuns(num_slots)
        self.seqs: dict[int, Slab] = {}
        self.swapped: dict[int, Slab] = {}
        self.num_cpu_slots = num_cpu_slots
        self.num_cpu_slots_used = 0
        self.bytes_per_token = bytes_per_token
        self.num_held_slots = 0
        self.num_filled_slots = 0
        self._sum_reservable = 0  # Σ min(size, final_num_tokens)
        self.num_slack_slots = 0  # Σ size − policy_size: the buddy allocator's rounding
        self.num_copy_on_writes = 0  # slabs never share, so never copy

    @property
    def num_free_slots(self) -> int:
        return self.num_total_slots - self.num_held_slots

    @property
    def num_reserved_slots(self) -> int:
        return self._sum_reservable - self.num_filled_slots

    @property
    def usage(self) -> float:
        """1 − free / total, computed as the paged pool does (so decode bursts reproduce it exactly)."""
        return 1.0 - self.num_free_slots / self.num_total_slots

    @property
    def num_mapped_slots(self) -> int:
        """Regions are never shared: what sequences map is what they hold."""
        return self.num_held_slots

    def external_fragmentation_slots(self, next_request_slots: int | None) -> int:
        """Free slots in runs too short for the next waiting request's region (0 if none waits)."""
        if next_request_slots is None:
            return 0
        return sum(n for n in self.free_runs.lengths.values() if n < next_request_slots)

    def region_slots(self, final_num_tokens: int, prompt_len: int | None = None) -> int:
        """Slots a region really holds: the policy's request, rounded by the placement."""
        return self.free_runs.rounded(region_slots(self.policy, final_num_tokens, self.max_model_len, prompt_len))

    def request_slots(self, prompt_len: int, final_num_tokens: int, num_samples: int) -> int:
        """Each sample holds a region of its own from admission on."""
        return num_samples * self.region_slots(final_num_tokens, prompt_len)

    def never_fits_reason(self, final_num_tokens: int, prompt_len: int | None = None) -> str | None:
        """A region larger than the empty pool could place (buddy: its largest tile) never fits."""
        largest = self.free_runs.largest_region(self.num_total_slots)
        if self.region_slots(final_num_tokens, prompt_len) <= largest:
            return None
        return f"its region exceeds the largest {self.placement} region of the pool ({largest} slots)"

    def lookup_prefix(self, content: Content | None, num_tokens: int) -> PrefixHit:
        """Slabs share nothing: no prefix hits."""
        return NO_HIT

    def mark_blocks_as_computed(self) -> None:
        """Nothing to mark: slabs cache nothing."""

    def slots_needed(self, seq_ids: Sequence[int], num_tokens_total: int) -> int:
        """0: sequences that hold a region never grow; new ones are admitted via `allocate`."""
        assert all(s in self.seqs for s in seq_ids), "slots_needed is for sequences that hold a region"
        return 0

    def can_allocate(self, seq_id: int, num_tokens_total: int, final_num_tokens: int | None = None,
                     hit: PrefixHit = NO_HIT, reserve_slots: int = 0, num_samples: int = 1,
                     prompt_len: int | None = None) -> bool:
        """A new sequence needs its region placed, and each of its `num_samples − 1` siblings' too."""
        if seq_id in self.seqs:
            return True
        return self.can_place([final_num_tokens or num_tokens_total] * num_samples, reserve_slots, prompt_len)

    def allocate(self, seq_id: int, num_tokens_total: int, final_num_tokens: int | None = None,
                 content: Content | None = None, hit: PrefixHit = NO_HIT, reserve_slots: int = 0) -> Allocation | None:
        """Reserve the region on first call; later calls only write tokens into it (nothing is ever copied)."""
        slab = self.seqs.get(seq_id)
        if slab is not None and num_tokens_total == slab.num_tokens + 1 and self.append_token(seq_id):
            return ALLOCATED
        if slab is None:
            if not self.can_allocate(seq_id, num_tokens_total, final_num_tokens, reserve_slots=reserve_slots):
                return None
            slab = self._place(seq_id, 0, final_num_tokens or num_tokens_total)
            assert slab is not None
        self._write(seq_id, slab, num_tokens_total)
        return ALLOCATED

    def append_token(self, seq_id: int) -> bool:
        """`allocate(seq_id, written + 1)` for a sequence whose region has room for that token (a region
        never grows: every decode but one past the region, an error `allocate` raises); otherwise False,
        changing nothing. The hot path of every decode step (`_write` inlined); `allocate` takes it too."""
        slab = self.seqs.get(seq_id)
        if slab is None or slab.num_tokens >= slab.size:
            return False
        slab.num_tokens += 1
        self.num_filled_slots += 1
        return True

    def hold(self, seq_id: int, num_slots: int) -> bool:
        """Speculative decoding runs on the paged allocator only (the builder refuses it here)."""
        raise AssertionError("hold: speculative decoding needs the paged allocator")

    def reserve(self, seq_id: int, final_num_tokens: int, prompt_len: int | None = None) -> bool:
        """Reserve a region with nothing written yet (at admission, where the policy may need the prompt)."""
        if seq_id in self.seqs:
            return True
        policy_size = region_slots(self.policy, final_num_tokens, self.max_model_len, prompt_len)
        size = self.free_runs.rounded(policy_size)
        if self.free_runs.find(size) is None:
            return False
        return self._place(seq_id, 0, final_num_tokens, policy_size) is not None

    def _place(self, seq_id: int, num_tokens: int, final_num_tokens: int,
               policy_size: int | None = None) -> Slab | None:
        if policy_size is None:
            policy_size = region_slots(self.policy, final_num_tokens, self.max_model_len)
        size = self.free_runs.rounded(policy_size)
        start = self.free_runs.find(size)
        if start is None:
            return None
        self.free_runs.take(start, size)
        slab = Slab(start, size, num_tokens, final_num_tokens, policy_size)
        self.seqs[seq_id] = slab
        self.num_held_slots += size
        self.num_filled_slots += num_tokens
        self._sum_reservable += min(size, final_num_tokens)
        self.num_slack_slots += size - policy_size
        return slab

    def _write(self, seq_id: int, slab: Slab, num_tokens_total: int) -> None:
        if num_tokens_total > slab.size:
            raise KvsimError(
                f"request {seq_id}: {num_tokens_total} tokens exceed its {self.policy} slab of {slab.size} slots"
            )
        if num_tokens_total > slab.num_tokens:
            self.num_filled_slots += num_tokens_total - slab.num_tokens
            slab.num_tokens = num_tokens_total

    def burst_fits(self, seq_ids: Sequence[int], num_steps: int) -> bool:
        """Regions never grow: a decode burst needs no new space."""
        return True

    def append_burst(self, seq_ids: Sequence[int], num_steps: int) -> Occupancy:
        """`num_steps` decode tokens for each sequence, as that many `allocate` calls would write."""
        occupancy = self.burst_occupancy(seq_ids, num_steps)
        for seq_id in seq_ids:
            slab = self.seqs[seq_id]
            self._write(seq_id, slab, slab.num_tokens + num_steps)
        return occupancy

    def burst_extends_prefix(self, seq_ids: Sequence[int], num_steps: int, content: Content | None,
                             num_tokens: int) -> bool:
        """Slabs cache nothing."""
        return False

    def burst_occupancy(self, seq_ids: Sequence[int], num_steps: int) -> Occupancy:
        """Held, filled and reserved slots after each of the next `num_steps` decode steps."""
        filled = [self.num_filled_slots + len(seq_ids) * j for j in range(1, num_steps + 1)]
        return [self.num_held_slots] * num_steps, filled, [self._sum_reservable - f for f in filled]

    def fork(self, parent_id: int, child_id: int, child_content: Content | None = None,
             child_final_num_tokens: int | None = None) -> None:
        """Copy the parent's tokens into the child's own region, reserved earlier by `reserve`."""
        self._write(child_id, self.seqs[child_id], self.seqs[parent_id].num_tokens)

    def holds(self, seq_id: int) -> bool:
        return seq_id in self.seqs or seq_id in self.swapped

    def forget_newest_hashes(self, seq_id: int, num_tokens: int) -> None:
        """Slabs cache nothing (`lookup_prefix`): nothing to forget."""

    def free(self, seq_id: int) -> None:
        if seq_id in self.swapped:
            self.num_cpu_slots_used -= self.swapped.pop(seq_id).num_tokens
            return
        self._remove(self.seqs.pop(seq_id))

    def _remove(self, slab: Slab) -> None:
        self.free_runs.give(slab.start, slab.size)
        self.num_held_slots -= slab.size
        self.num_filled_slots -= slab.num_tokens
        self._sum_reservable -= min(slab.size, slab.final_num_tokens)
        self.num_slack_slots -= slab.size - slab.policy_size

    def swap_out(self, seq_ids: Sequence[int]) -> SwapResult | None:
        """Copy the written tokens to CPU and release the regions; None if CPU space lacks."""
        tokens = sum(self.seqs[s].num_tokens for s in seq_ids)
        if self.num_cpu_slots_used + tokens > self.num_cpu_slots:
            return None
        for seq_id in seq_ids:
            slab = self.seqs.pop(seq_id)
            self._remove(slab)
            self.swapped[seq_id] = slab
        self.num_cpu_slots_used += tokens
        return SwapResult(tokens, tokens * self.bytes_per_token)

    def can_place(self, final_num_tokens: Sequence[int], reserve_slots: int = 0, prompt_len: int | None = None) -> bool:
        """Whether regions for all these lengths fit at once."""
        return self._fit_all([self.region_slots(final, prompt_len) for final in final_num_tokens], reserve_slots)

    def _fit_all(self, sizes: Sequence[int], reserve_slots: int) -> bool:
        """Whether regions of these (placement-rounded) sizes fit at once, placed on a copy of the free space."""
        trial = self.free_runs.copy()
        for size in sizes:
            start = trial.find(size)
            if start is None:
                return False
            trial.take(start, size)
        return sum(sizes) + reserve_slots <= self.num_free_slots

    def swap_in_growth_slots(self, seq_ids: Sequence[int]) -> int:
        """Regions already hold every future token: nothing beyond the regions themselves."""
        return 0

    def can_swap_in(self, seq_ids: Sequence[int], reserve_slots: int = 0) -> bool:
        """Whether the swapped regions (same sizes as before) fit again."""
        return self._fit_all([self.swapped[s].size for s in seq_ids], reserve_slots)

    def swap_in(self, seq_ids: Sequence[int], reserve_slots: int = 0) -> SwapResult | None:
        if not self.can_swap_in(seq_ids, reserve_slots):
            return None
        tokens = 0
        for seq_id in seq_ids:
            old = self.swapped.pop(seq_id)
            self._place(seq_id, old.num_tokens, old.final_num_tokens, old.policy_size)
            tokens += old.num_tokens
        self.num_cpu_slots_used -= tokens
        return SwapResult(tokens, tokens * self.bytes_per_token)

    def state_key(self) -> None:
        """`KVAllocator.state_key`: None, its regions are not taken (a livelock check never fires with it)."""
        return None

    def check_invariants(self) -> None:
        """Regions never overlap, cover their tokens, and free + held = total."""
        spans = sorted((s.start, s.start + s.size) for s in self.seqs.values())
        spans += sorted((start, start + n) for start, n in self.free_runs.lengths.items())
        spans.sort()
        position = 0
        for start, end in spans:
            assert start == position, f"gap or overlap at slot {position} (next span starts at {start})"
            position = end
        assert position == self.num_total_slots, "address space not covered"
        for seq_id, slab in self.seqs.items():
            assert slab.num_tokens <= slab.size, f"request {seq_id} overflows its slab"
            assert slab.size == self.free_runs.rounded(slab.policy_size)
        self.free_runs.check()
        assert self.num_slack_slots == sum(s.size - s.policy_size for s in self.seqs.values())
        assert self.num_held_slots == sum(s.size for s in self.seqs.values())
        assert self.num_filled_slots == sum(s.num_tokens for s in self.seqs.values())
        assert self._sum_reservable == sum(min(s.size, s.final_num_tokens) for s in self.seqs.values())
        assert self.num_cpu_slots_used == sum(s.num_tokens for s in self.swapped.values())
        assert self.num_cpu_slots_used <= self.num_cpu_slots

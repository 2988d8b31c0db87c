"""What a sequence's tokens are, as far as prefix caching needs to know: block identities.

vLLM hashes each full block as `hash(parent_hash, block_tokens, extra_keys)`, so equal
hashes mean equal prefixes. kvsim rarely has token ids, so a sequence's content is either

* `SegmentContent`: a list of (segment_id, num_tokens) pieces — a shared system prompt, a
  conversation's earlier turns, Mooncake's 512-token `hash_ids`, a request's own output —
  where token `i` of a segment is the same token wherever that segment appears; or
* `TokenContent`: real token ids (the token-level ShareGPT workload).

Both give `block_hashes(block_size, n)`: the chained hashes of the first `n` full blocks,
computed once and memoised on the object.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Hashable, Sequence
from itertools import accumulate

ROOT_HASH = 0x6B7673696D  # the parent hash of block 0


class _ChainedHashes:
    """Lazily extended chain `h[i] = hash((h[i-1], key(i)))` for one block size."""

    __slots__ = ("_hashes", "_block_size")

    def __init__(self) -> None:
        self._hashes: list[int] = []
        self._block_size = 0

    def block_key(self, start: int, end: int) -> Hashable:  # pragma: no cover - abstract
        raise NotImplementedError

    @property
    def num_tokens(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def block_hashes(self, block_size: int, num_blocks: int) -> list[int]:
        """Hashes of the first `num_blocks` full blocks (the content must cover them)."""
        if block_size != self._block_size:
            self._hashes, self._block_size = [], block_size
        hashes = self._hashes
        assert num_blocks * block_size <= self.num_tokens, "hashing beyond the known content"
        parent = hashes[-1] if hashes else ROOT_HASH
        for i in range(len(hashes), num_blocks):
            parent = hash((parent, self.block_key(i * block_size, (i + 1) * block_size)))
            hashes.append(parent)
        return hashes[:num_blocks] if num_blocks < len(hashes) else hashes


class SegmentContent(_ChainedHashes):
    """Content made of named segments; a block's key lists the segment pieces it covers.

        segments: (sys, 5000) (conv7.turn0, 300) (conv7.out0, 120) ...
        tokens:   |----- sys -----|--- turn0 ---|-- out0 --| ...
        block i covers [i·bs, (i+1)·bs) → key ((sys, 4992, 5000), (conv7.turn0, 0, 8))
    """

    __slots__ = ("segments", "_starts", "_num_tokens", "_run_end")

    def __init__(self, segments: Sequence[tuple[Hashable, int]]) -> None:
        super().__init__()
        self.segments = tuple(segments)
        lengths = [n for _, n in self.segments]
        assert all(n > 0 for n in lengths), "segments must be non-empty"
        self._starts = [0, *accumulate(lengths)]
        self._num_tokens = self._starts[-1]
        # where the segment holding the last hashed block ends, when that block lies inside one (0: it does not)
        self._run_end = 0

    @property
    def num_tokens(self) -> int:
        return self._num_tokens

    def block_hashes(self, block_size: int, num_blocks: int) -> list[int]:
        """As `_ChainedHashes.block_hashes`, with a fast path for blocks inside one segment.

        Hot: every full block of every request is hashed once. The whole blocks that lie inside one
        segment form a *run*: the run is keyed once, `base = hash((parent, hash(segment id), offset))`
        (the key of the block before it, and where the run starts in the segment), and its blocks
        take the consecutive integers `base + k` for k = 0, 1, ..., so a run of n blocks costs one hash
        instead of n. A base is a 64-bit hash, so the keys stay C integers (`sys.maxsize`) bar a run
        within its length of the top (probability n / 2^64; its keys are then merely bigger ints):
        `range`, int hashing and the dicts take their fast paths. Equal keys still mean equal prefixes:
        a run's base fixes the tokens before it and the segment and offset it starts at, block k of it
        then covers that segment's tokens from offset + k·bs; two runs of a and b blocks under different
        bases share a key only if the bases lie within a + b of each other, probability (a + b − 1) / 2^64
        for hashes taken as uniform: over R runs of N blocks in all, below R·N / 2^64 (5e-5 for a million
        runs of a thousand blocks, where the per-block 64-bit chain of vLLM's builtin hash risks N² / 2^65,
        3e-2). A block across segments keeps `block_key`'s pieces, so a key, like the per-block chain
        before it, depends only on the tokens up to its block, not on how many blocks earlier calls
        hashed: a call that starts inside a run continues its integers.

        A call whose new blocks all lie in the segment of the last hashed block, which lies inside it (a
        decoding sequence's next blocks, hot), continues that run without looking the segment up: the loop
        below would find the same segment and take the same integers.
        """
        if block_size != self._block_size:
            self._hashes, self._block_size, self._run_end = [], block_size, 0
        hashes = self._hashes
        done = len(hashes)
        if num_blocks <= done:
            return hashes if num_blocks == done else hashes[:num_blocks]
        if num_blocks * block_size <= self._run_end:
            last = hashes[-1]
            if num_blocks == done + 1:
                hashes.append(last + 1)
            else:
                hashes.extend(range(last + 1, last + 1 + num_blocks - done))
            return hashes
        assert num_blocks * block_size <= self._num_tokens, "hashing beyond the known content"
        parent = hashes[-1] if hashes else ROOT_HASH
        starts, segments = self._starts, self.segments
        i = bisect_right(starts, done * block_size) - 1
        start, stop = done * block_size, num_blocks * block_size
        while start < stop:
            while starts[i + 1] <= start:
                i += 1
            seg_start = starts[i]
            inside = min(stop, start + (starts[i + 1] - start) // block_size * block_size)
            if inside > start:  # whole blocks inside segment i, up to `inside`: a run
                num = (inside - start) // block_size
                if start - block_size >= seg_start:  # the block before is in the segment too: its run goes on
                    first = parent + 1
                else:
                    first = hash((parent, hash(segments[i][0]), start - seg_start))
                if num == 1:  # a decoding sequence's next block (hot): one append, no range built
                    hashes.append(first)
                else:  # a range of C integers: ~45 instructions a key fewer than islice(count(...))
                    hashes.extend(range(first, first + num))
                parent = first + num - 1
                start = inside
                self._run_end = starts[i + 1]
            else:  # the block at `start` runs past the end of segment i
                parent = hash((parent, self.block_key(start, start + block_size)))
                hashes.append(parent)
                start += block_size
                self._run_end = 0
        return hashes

    def branch(self, num_shared_tokens: int, name: Hashable) -> SegmentContent:
        """This content's first `num_shared_tokens` tokens, then a segment `name` of its own for the rest (as many
        tokens): a sequence forked off this one at that length, whose later tokens are not this one's. Forked
        where this content ends or past it (tokens written beyond what a content names are never hashed), the
        branch is this content: it names no token of its own; at 0, all its own."""
        assert num_shared_tokens >= 0
        if num_shared_tokens >= self._num_tokens:
            return self
        end = bisect_right(self._starts, num_shared_tokens) - 1  # the segment holding the first own token
        shared = [*self.segments[:end], (self.segments[end][0], num_shared_tokens - self._starts[end])]
        return SegmentContent([piece for piece in shared if piece[1] > 0]
                              + [(name, self._num_tokens - num_shared_tokens)])

    def block_key(self, start: int, end: int) -> Hashable:
        pieces = []
        i = bisect_right(self._starts, start) - 1
        while start < end:
            seg_id, _ = self.segments[i]
            seg_start, seg_end = self._starts[i], self._starts[i + 1]
            stop = min(end, seg_end)
            pieces.append((seg_id, start - seg_start, stop - seg_start))
            start, i = stop, i + 1
        return tuple(pieces)


class TokenContent(_ChainedHashes):
    """Content given as token ids: real ones (ints ≥ 0), or, for a token no trace gives (a reply's), a
    hashable that names its owner, never equal to a real id: a tuple (`kvsim.workload.conversations.TurnBuilder
    .content`) or a sample's negative child request id (`kvsim.sched.fanout.sample_content`)."""

    __slots__ = ("token_ids",)

    def __init__(self, token_ids: Sequence[Hashable]) -> None:
        super().__init__()
        self.token_ids = tuple(token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def branch(self, num_shared_tokens: int, name: Hashable) -> TokenContent:
        """As `SegmentContent.branch`: this content's first `num_shared_tokens` ids, then `name` for each later
        token (a placeholder: `name` must equal no real id, nor any other placeholder)."""
        assert num_shared_tokens >= 0
        return TokenContent(self.token_ids[:num_shared_tokens]
                            + (name,) * (len(self.token_ids) - num_shared_tokens))

    def block_key(self, start: int, end: int) -> Hashable:
        return self.token_ids[start:end]


Content = SegmentContent | TokenContent

"""Free space of a contiguous token address space: first-fit runs or a binary buddy allocator.

Both place regions of token slots in [0, total) and share one interface:

    find(size)          start of the free block a region of `size` would take, or None
    take(start, size)   carve the region out of that block (size already `rounded`)
    give(start, size)   return a region; neighbours merge (runs) or buddies coalesce (buddy)
    rounded(size)       the slots a region of `size` really holds (buddy: the next power of two)
    lengths             {start: length} of every free block (external fragmentation reads it)

The PagedAttention paper's Orca baselines place regions with a buddy allocator (Kwon et
al., SOSP 2023, §6.1), so every region is rounded up to a power of two. A pool that is not
a power of two is tiled by the powers of two of its binary expansion, largest first:

    15,728 slots = 8192 | 4096 | 2048 | 1024 | 256 | 64 | 32 | 16
                   0      8192   12288  14336  15360 ...

Each tile is aligned to its size, so the usual `start XOR size` buddy rule never merges
across the pool's end. A region larger than the largest tile never fits.
"""

from __future__ import annotations

from bisect import bisect_left, insort


class FreeRuns:
    """First-fit free list of [start, start + length) runs, sorted and coalesced."""

    __slots__ = ("starts", "lengths")

    def __init__(self, total: int) -> None:
        self.starts = [0] if total else []
        self.lengths = {0: total} if total else {}

    def copy(self) -> FreeRuns:
        other = FreeRuns(0)
        other.starts, other.lengths = list(self.starts), dict(self.lengths)
        return other

    @staticmethod
    def rounded(size: int) -> int:
        return size

    def largest_region(self, total: int) -> int:
        """The largest region that could ever be placed: the whole space."""
        return total

    def find(self, size: int) -> int | None:
        """Start of the first run that holds `size` slots, or None."""
        for start in self.starts:
            if self.lengths[start] >= size:
                return start
        return None

    def take(self, start: int, size: int) -> None:
        length = self.lengths.pop(start)
        self.starts.pop(bisect_left(self.starts, start))
        if length > size:
            self.lengths[start + size] = length - size
            insort(self.starts, start + size)

    def give(self, start: int, size: int) -> None:
        index = bisect_left(self.starts, start)
        if index < len(self.starts) and self.starts[index] == start + size:  # merge with next
            size += self.lengths.pop(self.starts.pop(index))
        if index > 0:
            prev = self.starts[index - 1]
            if prev + self.lengths[prev] == start:  # merge with previous
                self.lengths[prev] += size
                return
        self.lengths[start] = size
        insort(self.starts, start)

    def check(self) -> None:
        assert self.starts == sorted(self.lengths)
        for a, b in zip(self.starts, self.starts[1:], strict=False):
            assert a + self.lengths[a] < b, f"free runs at {a} and {b} not coalesced"


class BuddySpace:
    """Binary buddy allocator: free blocks are powers of two aligned to their size."""

    __slots__ = ("lengths", "by_size", "largest")

    def __init__(self, total: int) -> None:
        self.lengths: dict[int, int] = {}
        self.by_size: dict[int, list[int]] = {}  # block size -> sorted starts of free blocks
        start = 0
        for bit in reversed(range(total.bit_length())):
            if total >> bit & 1:
                self._add(start, 1 << bit)
                start += 1 << bit
        self.largest = 1 << (total.bit_length() - 1) if total else 0

    def copy(self) -> BuddySpace:
        other = BuddySpace(0)
        other.lengths = dict(self.lengths)
        other.by_size = {size: list(starts) for size, starts in self.by_size.items()}
        other.largest = self.largest
        return other

    @staticmethod
    def rounded(size: int) -> int:
        return 1 << (size - 1).bit_length()

    def largest_region(self, total: int) -> int:
        """The largest tile of the pool: no region above it ever fits."""
        return self.largest

    def _add(self, start: int, size: int) -> None:
        self.lengths[start] = size
        insort(self.by_size.setdefault(size, []), start)

    def _remove(self, start: int, size: int) -> None:
        del self.lengths[start]
        starts = self.by_size[size]
        starts.pop(bisect_left(starts, start))
        if not starts:
            del self.by_size[size]

    def find(self, size: int) -> int | None:
        """The lowest-addressed free block of the smallest size that holds `size` (best fit)."""
        fitting = [s for s in self.by_size if s >= size]
        return self.by_size[min(fitting)][0] if fitting else None

    def take(self, start: int, size: int) -> None:
        """Split the free block at `start` in halves until a block of `size` (a power of two) remains."""
        assert size & (size - 1) == 0, "buddy regions are powers of two"
        block = self.lengths[start]
        self._remove(start, block)
        while block > size:
            block //= 2
            self._add(start + block, block)  # the upper half stays free

    def give(self, start: int, size: int) -> None:
        """Free a block and coalesce it with its buddy while the buddy is free and the same size."""
        while self.lengths.get(start ^ size) == size:
            self._remove(start ^ size, size)
            start = min(start, start ^ size)
            size *= 2
        self._add(start, size)

    def check(self) -> None:
        for start, size in self.lengths.items():
            assert size & (size - 1) == 0 and start % size == 0, f"free block {start}+{size} misaligned"
            assert self.lengths.get(start ^ size) != size, f"free buddies at {start} and {start ^ size} not merged"
        assert sorted(self.lengths) == sorted(s for starts in self.by_size.values() for s in starts)

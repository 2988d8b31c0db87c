"""Allocator operations per second: paged append, prefix lookup, fork, slab allocate/free.

    python benchmarks/bench_allocators.py [--repeats 5] [--output benchmarks/results/allocators.json]

Each operation runs `n` times per repeat; the JSON holds the median ops/s over repeats and the
ratio against a baseline measured in the same run (a plain dict insert + delete loop), so
results from different machines can be compared by ratio.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from result_file import check_result_file, write_result_file

from kvsim.kv import PagedAllocator, SegmentContent, SlabAllocator

N = 20_000


def baseline() -> None:
    d: dict[int, int] = {}
    for i in range(N):
        d[i] = i
    for i in range(N):
        del d[i]


def paged_append() -> None:
    a = PagedAllocator(num_blocks=N // 16 * 64 + 2, block_size=16, enable_caching=False)
    for seq in range(64):
        a.allocate(seq, 1)
    for step in range(2, N // 64 + 2):
        for seq in range(64):
            a.allocate(seq, step)


def prefix_lookup() -> None:
    a = PagedAllocator(num_blocks=4096, block_size=16)
    system = ("system", 2048)
    a.allocate(0, 2100, content=SegmentContent([system, ("u0", 52)]))
    for i in range(N // 128):  # each lookup walks 128 blocks
        a.lookup_prefix(SegmentContent([system, (("u", i), 52)]), 2100)


def fork() -> None:
    a = PagedAllocator(num_blocks=N + 200, block_size=16)
    a.allocate(0, 1000)
    for child in range(1, N // 16):
        a.fork(0, child)
    for child in range(1, N // 16):
        a.free(child)


def slab_allocate_free() -> None:
    s = SlabAllocator(1_000_000, max_model_len=4096, policy="pow2")
    live: list[int] = []
    for i in range(N):
        if s.allocate(i, 10, final_num_tokens=100 + (i * 7919) % 3000):
            live.append(i)
        if len(live) > 200:
            s.free(live.pop(i % len(live)))


CASES: dict[str, tuple[Callable[[], None], int]] = {
    "baseline_dict_insert_delete": (baseline, 2 * N),
    "paged_append_tokens": (paged_append, N),
    "paged_prefix_lookup_blocks": (prefix_lookup, N),
    "paged_fork_and_free": (fork, 2 * (N // 16)),
    "slab_allocate_free": (slab_allocate_free, N),
}


# the result's keys: --output replaces only such a JSON object (result_file.py)
RESULT_KEYS = frozenset({"benchmark", "machine", "python", "repeats", "results"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output", type=Path, default=Path(__file__).parent / "results" / "allocators.json")
    args = parser.parse_args()
    check_result_file("bench_allocators.py", args.output, RESULT_KEYS)  # before it runs, not after
    results = {}
    for name, (fn, ops) in CASES.items():
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        median = statistics.median(times)
        results[name] = {"ops": ops, "median_s": median, "ops_per_s": ops / median, "runs_s": times}
    base = results["baseline_dict_insert_delete"]["ops_per_s"]
    for r in results.values():
        r["ratio_to_baseline"] = r["ops_per_s"] / base
    out = {"benchmark": "allocators", "python": platform.python_version(), "machine": platform.machine(),
           "repeats": args.repeats, "results": results}
    write_result_file("bench_allocators.py", args.output, RESULT_KEYS, out)
    for name, r in results.items():
        print(f"{name:32s} {r['ops_per_s']:>14,.0f} ops/s  ({r['ratio_to_baseline']:.3f}x baseline)")


if __name__ == "__main__":
    main()

"""Tensor-parallel communication: the time of one ring all-reduce over the GPU link.

A ring all-reduce of `n` bytes over `p` GPUs runs 2 · (p − 1) steps (reduce-scatter, then
all-gather), each sending n / p bytes, so every GPU sends 2 · (p − 1) / p · n bytes:

    t = 2 · (p − 1) / p · n / (η · link bandwidth) + 2 · (p − 1) · step latency + base latency

as NCCL's own cost model has it (src/graph/tuning.cc: latency = baseLat + nsteps · hwLat,
time = latency + bytes / busBw). Fitted only on public data, LLMServingSim's NCCL all-reduce
measurements on two RTX PRO 6000 GPUs over PCIe 5.0 (profiler/perf/RTXPRO6000/hardware.yaml,
casys-kaist/LLMServingSim, MIT): 12.7 us at 4 KiB, 41 us at 1 MiB, 125 us at 4 MiB, 587 us at
20 MiB, i.e. 36 GB/s of the link's 64 GB/s (η = 0.57) and about 10 us of fixed latency; NCCL's
baseLat for Ring/Simple is 8.4 us. NVLink reaches a larger share of its datasheet rate
(nccl-tests bus bandwidth on H100 NVLink: about 80 %).

A link may also carry fits at particular GPU counts (`GPULink.by_num_gpus`: η and one fixed cost
per count, for the step latencies and base together); the A100 and H100/H200 presets carry those
of Vidur's DGX measurements at 2, 4 and 8 GPUs (benchmarks/fit_collectives.py), since NCCL's
choice of algorithm and protocol, hence its achieved bandwidth, changes with the count.

A particular cluster can be slower than its GPUs' datasheet link (PCIe through host memory
when peer-to-peer is off): a scenario's `gpu_link` then describes it. `kvsim validate` takes
the measured cluster's link from LLMServingSim's cluster config (16 GB/s effective in ASTRA-Sim's
units, 2^30 bytes a GB, so 17.2e9 bytes/s, and 20 us per hop for the RTX PRO 6000 TP-2 run, 2.1x
slower than the NCCL measurements above, which were taken later on another host), with that
simulator's cost model: no separate base latency.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.model.config import GPULink

BASE_LATENCY_S = 8.4e-6
"""NCCL's per-collective base latency (tuning.cc baseLat, Ring/Simple), unless the link gives its own."""

LINK_EFFICIENCY = {"pcie": 0.57, "nvlink": 0.80}
"""Achievable fraction of the link's datasheet bandwidth for an all-reduce (sources above), used
when the link gives no `efficiency` of its own."""


def allreduce_s(num_bytes: float, num_gpus: int, link: GPULink) -> float:
    """Seconds for one ring all-reduce of `num_bytes` over `num_gpus` GPUs joined by `link`."""
    if num_gpus <= 1:
        return 0.0
    steps = 2 * (num_gpus - 1)
    at_count = link.by_num_gpus.get(num_gpus) if link.by_num_gpus else None
    if at_count is not None:  # fitted at this GPU count (`GPULink.by_num_gpus`)
        return steps / num_gpus * num_bytes / (at_count.efficiency * link.bandwidth_bytes_per_s) + at_count.fixed_s
    efficiency = link.efficiency if link.efficiency is not None else LINK_EFFICIENCY[link.kind]
    base = link.collective_latency_s if link.collective_latency_s is not None else BASE_LATENCY_S
    transfer = steps / num_gpus * num_bytes / (efficiency * link.bandwidth_bytes_per_s)
    return transfer + steps * link.latency_s + base

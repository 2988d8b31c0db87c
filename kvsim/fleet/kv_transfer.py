"""The KV a disaggregated fleet moves: link presets and the bytes one request's prompt takes.

| `kv_link` | bandwidth per GPU, one direction        | latency per transfer | source                          |
|-----------|------------------------------------------|----------------------|---------------------------------|
| `nvlink`  | 450e9 B/s (NVLink 4: 900 GB/s bidir.)    | 5 µs                 | NVIDIA H100 datasheet           |
| `pcie`    | 64e9 B/s (PCIe 5.0 x16)                  | 10 µs                | PCI-SIG 5.0: 32 GT/s × 16 lanes |
| `rdma`    | 50e9 B/s (400 Gb/s NIC, ConnectX-7)      | 20 µs                | NVIDIA ConnectX-7 datasheet     |

The latencies are orders of magnitude for one transfer's setup (a NIXL read's descriptor exchange and
completion), not measurements; `kv_link_latency_s` replaces them. A decode instance of TP size t has
one such link per GPU (one NIC per GPU, as rail-optimised clusters wire them), so its ingress is
t × the per-GPU bandwidth, shared by every transfer into it (`kvsim.kv.link.SharedLink`).

Bytes: a decode instance receives the whole prompt's KV in its own layout, whole blocks as vLLM's
connectors move them (block-granular descriptors): `num_blocks · block_size · bytes_per_token(D) · tp(D)`,
where `bytes_per_token(D)` is the per-GPU figure at the decode side's TP (`kvsim.model.capacity`: kv
heads divided by TP, at least 1, so heads replicated across ranks are received by each of them).
"""

from __future__ import annotations

from kvsim.kv.link import LinkSpec
from kvsim.model.capacity import kv_bytes_per_token
from kvsim.model.config import EngineConfig, ModelSpec
from kvsim.workload.fleet_layout import KVTransferConfig

LINK_PRESETS: dict[str, tuple[float, float]] = {  # kv_link -> (bandwidth per GPU in B/s, latency in s)
    "nvlink": (450e9, 5e-6),
    "pcie": (64e9, 10e-6),
    "rdma": (50e9, 20e-6),
}


def per_gpu_link(config: KVTransferConfig) -> tuple[float, float]:
    """(bandwidth per GPU in B/s, latency in s): the preset, with the config's replacements."""
    bandwidth, latency = LINK_PRESETS[config.kv_link]
    if config.kv_link_bandwidth_bytes_per_s is not None:
        bandwidth = config.kv_link_bandwidth_bytes_per_s
    if config.kv_link_latency_s is not None:
        latency = config.kv_link_latency_s
    return bandwidth, latency


def decode_link(config: KVTransferConfig, decode_engine: EngineConfig) -> LinkSpec:
    """The ingress link of one decode instance: one per-GPU link per tensor-parallel rank."""
    bandwidth, latency = per_gpu_link(config)
    return LinkSpec(bandwidth * decode_engine.tensor_parallel_size, latency)


def kv_bytes_per_block_received(model: ModelSpec, decode_engine: EngineConfig) -> int:
    """Bytes one block of KV takes on the decode instance, all its TP ranks together."""
    return kv_bytes_per_token(model, decode_engine) * decode_engine.tensor_parallel_size * decode_engine.block_size

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

Bytes: a decode instance reads the prompt's KV in the prefill instance's blocks (block-granular NIXL
descriptors): `num_blocks · block_size(P) · bytes_per_token(D) · tp(D)`, where `bytes_per_token(D)` is the
per-GPU figure at the decode side's TP (`kvsim.model.capacity`: kv heads divided by TP, at least 1, so heads
replicated across ranks are received by each of them). `num_blocks` is `prefill_blocks_read`: vLLM's
`NixlConnectorWorker._read_blocks` splits each of D's blocks it must fill (those its prefix cache does not
hold) into `block_size_ratio` blocks of P's size (`get_mapped_blocks`) and clips them to the blocks P holds,
so a 100-token prompt moves ceil(100 / 16) = 7 blocks of 16 into blocks of 32, 112 tokens' KV, not 128.
With a prefix hit on D the bytes are not the un-cached tokens' KV either: D holding tokens 0..63 of that
prompt (2 blocks of 32) fills 2 blocks, 4 of P's, and vLLM reads P's *last* 4 (`remote_block_ids[-4:]`,
tokens 48..111 of P's 7 blocks: 64 tokens' KV for 36 un-cached tokens), the bytes counted here. That read is
shifted one P block before D's blocks 2 and 3 (P's block 3, tokens 48..63, lands where D wants 64..79) whenever
the mapped blocks outnumber P's blocks after the hit, a misalignment of vLLM's code, not modelled as more than
its bytes (`tests/test_disagg_block_ratio.py`).
"""

from __future__ import annotations

from kvsim.kv.link import LinkSpec
from kvsim.model.capacity import kv_bytes_per_token
from kvsim.model.engine_config import EngineConfig
from kvsim.model.spec import ModelSpec
from kvsim.model.units import ceil_div
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


def kv_bytes_per_token_received(model: ModelSpec, decode_engine: EngineConfig) -> int:
    """Bytes one token of KV takes on the decode instance, all its TP ranks together."""
    return kv_bytes_per_token(model, decode_engine) * decode_engine.tensor_parallel_size


def prefill_blocks_read(prompt_len: int, prefill_block_size: int, decode_block_size: int,
                        num_decode_blocks_hit: int) -> int:
    """Blocks of the prefill instance's size a decode instance reads for a `prompt_len`-token prompt of which
    its own prefix cache holds `num_decode_blocks_hit` blocks (of its size, a multiple of the prefill's:
    `kvsim.fleet.disagg_checks`): its blocks to fill, each `decode // prefill` of P's, at most P's
    `ceil(prompt_len / prefill_block_size)` (vLLM's `NixlConnectorWorker._read_blocks`)."""
    ratio = decode_block_size // prefill_block_size
    to_fill = ceil_div(prompt_len, decode_block_size) - num_decode_blocks_hit
    return min(to_fill * ratio, ceil_div(prompt_len, prefill_block_size))

"""`engine.kv_offload`: the CPU (and disk) tiers below the GPU prefix cache, as a validated, frozen config."""

from __future__ import annotations

from pydantic import Field, model_validator

from kvsim.model.errors import KvsimError
from kvsim.model.sizes import Bytes, BytesOrZero
from kvsim.model.spec import Settings

DGX_HOST_MEMORY_BYTES = 2 * 10**12  # NVIDIA DGX H100 / H200 datasheet: 2 TB system memory


class KVOffloadConfig(Settings):
    """`engine.kv_offload`: a CPU (and optionally disk) tier below the GPU prefix cache (vLLM's CPU
    offloading connector, LMCache's CPU and local disk backends); validated once, frozen.

        engine:
          kv_offload:
            cpu_bytes: 64GiB                 # vLLM's --kv-offloading-size (GiB, all TP ranks together)
            # num_cpu_blocks: 40000          # or a block count (vLLM's OffloadingConnector `num_cpu_blocks`)
            bandwidth_bytes_per_s: 64e9      # GPU <-> CPU per GPU and direction; default the GPU's host link
            disk_bytes: 1TiB                 # optional: LMCache's local disk tier below the CPU
            disk_bandwidth_bytes_per_s: 5e9  # required with a disk tier (no default: drives differ)
            host_memory_bytes: 1TB           # the host the CPU tier must fit in (default: a DGX node's 2 TB)
            offload_prompt_only: false       # store decoded tokens' blocks too (vLLM's default: prompt blocks only)

    Sizes are the engine's, all tensor-parallel ranks together (each rank keeps its shard of a block; a
    block takes `bytes_per_block(shard) · tensor_parallel_size` bytes of the tier), as vLLM's
    `kv_offloading_size` sums over ranks. Each rank moves its shard over its own host link at
    `bandwidth_bytes_per_s`, so the engine moves `bandwidth · tp` bytes/s each way. A tier of 0 bytes or 0
    blocks is no tier; one of more than 0 bytes but less than a block is refused (`num_blocks`). The default
    host memory is a DGX H100/H200 node's 2 TB of system memory (NVIDIA DGX H100 datasheet); set
    `host_memory_bytes` for the machine you deploy on. `offload_prompt_only` is vLLM's `kv_connector_extra_config`
    key of that name, with its default (true: only the prompt's full blocks are stored, `OffloadingSpec` in
    vllm/v1/kv_offload/base.py; written to scenario.yaml only when false). Bad values raise one line naming the
    field and the value.
    """

    cpu_bytes: BytesOrZero | None = None
    num_cpu_blocks: int | None = Field(default=None, ge=0)
    bandwidth_bytes_per_s: float | None = Field(default=None, ge=1)
    disk_bytes: BytesOrZero | None = None
    num_disk_blocks: int | None = Field(default=None, ge=0)
    disk_bandwidth_bytes_per_s: float | None = Field(default=None, ge=1)
    host_memory_bytes: Bytes = DGX_HOST_MEMORY_BYTES
    offload_prompt_only: bool = Field(default=True, exclude_if=lambda value: value)

    @model_validator(mode="after")
    def _one_size_per_tier(self) -> KVOffloadConfig:
        for tier in ("cpu", "disk"):
            if getattr(self, f"{tier}_bytes") is not None and getattr(self, f"num_{tier}_blocks") is not None:
                raise ValueError(f"give {tier}_bytes or num_{tier}_blocks, not both")
        if self.cpu_bytes is not None and self.cpu_bytes > self.host_memory_bytes:
            raise ValueError(f"cpu_bytes={self.cpu_bytes}: larger than host_memory_bytes={self.host_memory_bytes} "
                             "(the CPU tier must fit in the host's memory)")
        has_disk = bool(self.disk_bytes) or bool(self.num_disk_blocks)
        if has_disk and self.disk_bandwidth_bytes_per_s is None:
            raise ValueError("a disk tier needs disk_bandwidth_bytes_per_s (bytes/s the drive reads)")
        return self

    @model_validator(mode="after")
    def _sizes_given(self) -> KVOffloadConfig:
        """`kv_offload: {}` (or a bandwidth alone) ran with no tier, as if `kv_offload` were not there: the CPU
        tier's size has no default (0 is no tier, said so), and a disk drive's bandwidth without a disk tier was
        dropped without a word."""
        sizes = (self.cpu_bytes, self.num_cpu_blocks, self.disk_bytes, self.num_disk_blocks)
        if all(size is None for size in sizes):  # a disk tier without a CPU one: `make_offload` says so
            raise ValueError("give the CPU tier's size, cpu_bytes (vLLM's --kv-offloading-size) or num_cpu_blocks "
                             "(0: no tier)")
        if self.disk_bandwidth_bytes_per_s is not None and self.disk_bytes is None and self.num_disk_blocks is None:
            raise ValueError(f"disk_bandwidth_bytes_per_s={self.disk_bandwidth_bytes_per_s:g}: no disk tier reads it "
                             "(give disk_bytes or num_disk_blocks)")
        return self

    def num_blocks(self, tier: str, bytes_per_block: int, field: str | None = None) -> int:
        """Blocks of `bytes_per_block` (all ranks together) that the tier holds (0: no tier). A size of
        more than 0 bytes but less than one block raises `KvsimError` naming `field` (default the tier's
        `engine.kv_offload` field): it was silently no tier. Only that field is told to give 0 for no tier: a
        sizing grid's size (`kvsim plan --offload-size`, which refuses 0) is compared with no tier anyway."""
        num = getattr(self, f"num_{tier}_blocks")
        if num is not None:
            return int(num)
        size = getattr(self, f"{tier}_bytes")
        if size is None:
            return 0
        if 0 < size < bytes_per_block:
            raise KvsimError(f"{field or f'engine.kv_offload.{tier}_bytes'}={size:,}: smaller than one KV block "
                             f"({bytes_per_block:,} bytes, all tensor-parallel ranks together), so the tier "
                             f"would hold none; give at least one block{', or 0 for no tier' if field is None else ''}")
        return size // bytes_per_block

"""The calibration grid: one transformer layer's shapes and every measurement `kernels.calibrate` takes.

Standard library only (no torch, no triton), so `kvsim calibrate --dry-run` prints the grid on a
machine without the kernels extra; `kernels.calibrate` measures the points on a GPU.

A model with sliding-window layers (gemma-3, gpt-oss, mistral-7b) or chunked-local ones (llama-4-scout) is planned as
one full-attention layer, and that is what its windowed layers cost: vLLM runs a sliding layer's FlashAttention with
`window_size = (window - 1, 0)` (vllm/v1/attention/backends/flash_attn.py), whose kernel skips the KV tiles left of
the window, so a query reads its last `window` keys as a windowless kernel reads a context of `window`.
`kvsim.latency.calibrated` looks windowed layers up at contexts capped by their window, the roofline's reading
(`RooflineLatency.decode_read_bytes`); a prefill chunk's lookup is an upper bound there. The default grid's shortest
context is at most every preset's window (gpt-oss: 128), so those lookups stay inside it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KERNELS_COMMIT_ENV = "KVSIM_KERNELS_COMMIT"
"""The environment variable that names the kernels' commit when their tree has no .git (`kernels.calibrate`
records it in the profile's `# kernels_commit:` line; `kvsim calibrate` checks it is one line before measuring)."""


@dataclass(frozen=True)
class LayerShapes:
    """Per-shard shapes of one transformer layer (what the kernels and GEMMs see)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    hidden_size: int
    intermediate_size: int
    vocab_size: int
    gated_mlp: bool
    dtype: str  # weight / activation dtype name
    kv_dtype: str  # "auto" (= dtype) or "fp8"
    model: str = ""  # the model's name, recorded in the profile
    tensor_parallel_size: int = 1  # the shapes are one shard's of this many

    @property
    def kv_cache_dtype(self) -> str:
        """The KV cache's dtype as profiles record it (`kvsim.latency.PROFILE_META_KEYS`)."""
        return "fp8" if self.kv_dtype == "fp8" else self.dtype

    def gemm_shapes(self) -> dict[str, tuple[int, int]]:
        """op → (K input features, N output features)."""
        hd = self.head_dim
        return {
            "qkv": (self.hidden_size, (self.num_heads + 2 * self.num_kv_heads) * hd),
            "o": (self.num_heads * hd, self.hidden_size),
            "gate_up": (self.hidden_size, (2 if self.gated_mlp else 1) * self.intermediate_size),
            "down": (self.intermediate_size, self.hidden_size),
            "lm_head": (self.hidden_size, self.vocab_size),
        }


@dataclass(frozen=True)
class Grid:
    batches: tuple[int, ...]
    contexts: tuple[int, ...]
    block_sizes: tuple[int, ...]
    prefill_query_lens: tuple[int, ...]
    prefill_cached_lens: tuple[int, ...]
    gemm_tokens: tuple[int, ...]


DEFAULT_GRID = Grid(
    batches=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    contexts=(128, 512, 1024, 2048, 4096, 8192, 16384, 32768),
    block_sizes=(16, 32),
    prefill_query_lens=(16, 64, 256, 1024, 2048),
    prefill_cached_lens=(0, 1024, 4096, 16384),
    gemm_tokens=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
)
QUICK_GRID = Grid(batches=(1, 16, 128), contexts=(512, 4096), block_sizes=(16,), prefill_query_lens=(128, 1024),
                  prefill_cached_lens=(0, 2048), gemm_tokens=(1, 64, 1024))


def plan(shapes: LayerShapes, grid: Grid) -> list[dict[str, Any]]:
    """Every measurement the grid asks for, in the order `measure` takes them."""
    points: list[dict[str, Any]] = []
    for bs in grid.block_sizes:
        points += [{"kind": "decode", "batch": b, "context_len": c, "block_size": bs}
                   for b in grid.batches for c in grid.contexts]
        points += [{"kind": "prefill", "batch": 1, "query_len": q, "context_len": p + q, "block_size": bs}
                   for q in grid.prefill_query_lens for p in grid.prefill_cached_lens]
    for op, (k, n) in shapes.gemm_shapes().items():
        points += [{"kind": "gemm", "op": op, "num_tokens": t, "k": k, "n": n} for t in grid.gemm_tokens]
    points.append({"kind": "copy"})
    return points

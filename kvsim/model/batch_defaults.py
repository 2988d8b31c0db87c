"""vLLM's default step budget when the user gives none: `batch_defaults` for `EngineConfig`'s resolvers."""

from __future__ import annotations

LARGE_GPU_BYTES = 70 * 2**30


def batch_defaults(gpu_memory_bytes: int, gpu_name: str, usage_context: str) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) that vLLM picks when neither is given, on a GPU of
    `gpu_memory_bytes` named `gpu_name` (its preset's `memory_bytes` and `name`).

    Follows `EngineArgs.get_batch_defaults` in vllm/engine/arg_utils.py: GPUs with at least
    70 GiB whose name does not contain "a100" (H100, H200, MI300x) get 8192 tokens for the
    API server (`vllm serve`) and 16384 for the offline `LLM` class, and 1024 sequences;
    every other GPU gets 2048 / 8192 tokens and 256 sequences (A100 is excluded because the
    larger budget lowered its throughput, vLLM PR #17885).
    """
    if gpu_memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu_name.lower():
        return (8192 if usage_context == "openai_api_server" else 16384), 1024
    return (2048 if usage_context == "openai_api_server" else 8192), 256

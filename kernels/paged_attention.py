"""Paged attention in Triton: the public API (callers import from here).

    write_kv_cache(key, value, k_cache, v_cache, slot_mapping)         kernels/cache_write.py
    paged_attention_prefill(q, k_cache, v_cache, block_tables, ...)   kernels/prefill.py
    paged_attention_decode(q, k_cache, v_cache, block_tables, ...)    kernels/decode.py

The cache layout, tiles that span pages and head_dim padding: kernels/layout.py. A serving
step first writes the new tokens' K/V, then runs prefill over the chunked-prefill sequences and
decode over the rest. Importing this module has no side effects; the wrappers assert shapes,
dtypes and strides.
"""

from kernels.cache_write import write_kv_cache
from kernels.decode import SmLimits, default_num_splits, paged_attention_decode
from kernels.layout import BLOCK_SIZES, FP8_DTYPE, HEAD_DIMS, KV_DTYPES
from kernels.prefill import paged_attention_prefill

__all__ = ["BLOCK_SIZES", "FP8_DTYPE", "HEAD_DIMS", "KV_DTYPES", "SmLimits", "default_num_splits",
           "paged_attention_decode", "paged_attention_prefill", "write_kv_cache"]

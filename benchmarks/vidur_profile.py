"""Vidur's per-operator profile tables, priced by kvsim's roofline, laid out where Vidur looks.

Vidur 0.0.26 reads its profiles from Hugging Face datasets through `snapshot_download`
(vidur/execution_time_predictor/sklearn_execution_time_predictor.py, `_get_input_files`): a
compute dataset with `config.json` ({model, device_sku}), `mlp.csv.xz` and `attention.csv.xz`,
and a network dataset with `config.json` ({sku}) whose all_reduce/send_recv tables are only read
at TP > 1 or PP > 1. This machine reaches no dataset hub and microsoft/vidur keeps its measured
attention.csv in Git LFS, so `write_profile` writes the tables in Vidur's column layout from
kvsim's roofline (`kvsim.latency.roofline.RooflineLatency`) as an offline Hugging Face cache
(`datasets--ORG--NAME/refs/main` -> `snapshots/REV/`), which `HF_HUB_OFFLINE=1` makes
`snapshot_download` return. Both simulators then price a step from the same per-layer terms:

    Vidur op                         kvsim roofline term (per layer, milliseconds)
    attn_pre_proj / attn_post_proj   the qkv / o GEMM at T tokens (`_gemm`, linear in params)
    mlp_up_proj / mlp_down_proj      the gate_up / down GEMM at T tokens
    input_layernorm, attn_rope,      `token_ops_s(T)` / layers, split evenly over the five
    post_attention_layernorm,        (kvsim prices them together)
    mlp_act, add
    attn_prefill (kv, chunk)         `prefill_s` of one chunk after kv cached tokens
    attn_decode (batch, kv)          `decode_s` of `batch` sequences at context kv each

kvsim's LM head, sampler and CPU overhead per step have no Vidur op (Vidur 0.0.26 prices the
transformer blocks only), so kvsim's steps are slightly longer. The dataset name carries a digest
of the tables, so Vidur's prediction cache (keyed by that name) never serves stale numbers.
"""

from __future__ import annotations

import hashlib
import io
import json
import lzma
from pathlib import Path

from kvsim.latency.roofline import RooflineLatency
from kvsim.model.config import load_gpu, load_model
from kvsim.model.engine_config import EngineConfig

VIDUR_MODEL = "meta-llama/Llama-2-7b-hf"  # vidur/config/model_config.py, Llama2_7BModelConfig
VIDUR_DEVICE, VIDUR_NETWORK = "a100", "a100_dgx"  # vidur/types/{device,node}_sku_type.py
KVSIM_MODEL, KVSIM_GPU = "llama-2-7b", "a100-80gb"
VIDUR_VOCAB = 32768  # Vidur's padded Llama-2 vocabulary; its mlp.csv rows are filtered on it
TOKEN_OPS = ("input_layernorm", "attn_rope", "post_attention_layernorm", "mlp_act", "add")
KV_STEP = 256  # Vidur's kv_cache_prediction_granularity default
CHUNK_STEP = 32  # Vidur predicts prefill chunks in multiples of 32


def _csv(header: list[str], rows: list[list]) -> bytes:
    out = io.StringIO()
    out.write(",".join(header) + "\n")
    for row in rows:
        out.write(",".join(repr(v) if isinstance(v, float) else str(v) for v in row) + "\n")
    return out.getvalue().encode()


def _stats(ms: float) -> list[float]:
    """min, max, mean, median, std of a deterministic time: the value four times, then 0."""
    return [ms, ms, ms, ms, 0.0]


def tables(block_size: int, max_tokens: int, max_batch: int) -> dict[str, bytes]:
    """`mlp.csv` and `attention.csv` for TP 1, num_tokens 1..max_tokens, batch 1..max_batch."""
    model, gpu = load_model(KVSIM_MODEL), load_gpu(KVSIM_GPU)
    roof = RooflineLatency(model, gpu, EngineConfig(block_size=block_size))
    h, heads, kv_heads, hd, inter = (model.hidden_size, model.num_attention_heads, model.num_kv_heads,
                                     model.head_dim, model.intermediate_size)
    layers = model.num_layers
    gemms = {"attn_pre_proj": h * (heads + 2 * kv_heads) * hd, "attn_post_proj": heads * hd * h,
             "mlp_up_proj": 2 * h * inter, "mlp_down_proj": h * inter}
    ops = ["emb", *gemms, *TOKEN_OPS]
    header = [f"time_stats.{op}.{s}" for op in ops for s in ("min", "max", "mean", "median", "std")]
    header += ["n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp", "num_tokens",
               "num_tensor_parallel_workers"]
    mlp = []
    for t in range(1, max_tokens + 1):
        token_op_ms = roof.token_ops_s(t) / layers / len(TOKEN_OPS) * 1e3
        times = [0.0] + [roof._gemm(p, t) * 1e3 for p in gemms.values()] + [token_op_ms] * len(TOKEN_OPS)
        mlp.append([v for ms in times for v in _stats(ms)] + [heads, kv_heads, h, inter, VIDUR_VOCAB, True, t, 1])
    attn_header = ["time_stats.attn_prefill.median", "time_stats.attn_decode.median",
                   "time_stats.attn_kv_cache_save.median", "n_embd", "n_q_head", "n_kv_head", "block_size",
                   "num_tensor_parallel_workers", "batch_size", "prefill_chunk_size", "kv_cache_size"]
    shape = [h, heads, kv_heads, block_size, 1]
    attn = []
    for kv in range(0, max_tokens + 1, KV_STEP):
        for chunk in range(CHUNK_STEP, max_tokens + 1, CHUNK_STEP):
            ms = roof.prefill_s(chunk * (kv + (chunk + 1) / 2), kv + chunk) / layers * 1e3
            attn.append([ms, 0.0, 0.0, *shape, 1, chunk, kv])
        for batch in range(1, max_batch + 1):
            ms = roof.decode_s(batch, batch * kv) / layers * 1e3 if kv else 0.0
            attn.append([0.0, ms, 0.0, *shape, batch, 0, kv])
    return {"mlp.csv.xz": lzma.compress(_csv(header, mlp)),
            "attention.csv.xz": lzma.compress(_csv(attn_header, attn))}


def _lay_out(cache: Path, kind: str, repo_id: str, files: dict[str, bytes]) -> None:
    digest = hashlib.sha1(b"".join(files[k] for k in sorted(files))).hexdigest()
    root = cache / "profiling_data" / kind / f"datasets--{repo_id.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "snapshots" / digest).mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (root / "snapshots" / digest / name).write_bytes(data)
    (root / "refs" / "main").write_text(digest, encoding="utf-8")


def write_profile(cache: Path, block_size: int, max_tokens: int, max_batch: int) -> tuple[str, str]:
    """Lay the compute and network datasets out under `cache`; returns their repo ids."""
    files = tables(block_size, max_tokens, max_batch)
    digest = hashlib.sha1(b"".join(lzma.decompress(files[k]) for k in sorted(files))).hexdigest()[:10]
    compute_id = f"kvsim/roofline-llama-2-7b-a100-{digest}"
    files["config.json"] = json.dumps({"model": VIDUR_MODEL, "device_sku": VIDUR_DEVICE}).encode()
    _lay_out(cache, "compute", compute_id, files)
    network_id = "kvsim/network-a100-dgx-tp1"
    _lay_out(cache, "network", network_id, {"config.json": json.dumps({"sku": VIDUR_NETWORK}).encode()})
    return compute_id, network_id


def write_csv_profile(folder: Path, block_size: int, max_tokens: int, max_batch: int) -> tuple[Path, Path]:
    """The same tables as plain `mlp.csv` and `attention.csv` in `folder`, for the paper's code
    (microsoft/vidur @ 7d47513 reads `--*_compute_input_file` / `--*_attention_input_file` paths,
    default `data/profiling/compute/{DEVICE}/{MODEL}/`); returns their paths. The folder name
    carries the tables' digest, as the package's dataset name does (the paper's own prediction
    cache is keyed by a hash of the training rows and settings)."""
    files = {name.removesuffix(".xz"): lzma.decompress(data)
             for name, data in tables(block_size, max_tokens, max_batch).items()}
    digest = hashlib.sha1(b"".join(files[k] for k in sorted(files))).hexdigest()[:10]
    out = folder / f"roofline-llama-2-7b-a100-{digest}"
    out.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (out / name).write_bytes(data)
    return out / "mlp.csv", out / "attention.csv"

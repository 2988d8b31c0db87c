"""A published CPU-offload measurement against kvsim's load model (issue 22 item 6, the offload part).

    python benchmarks/study_offload_published.py

A study, not a speed benchmark. The measurement: the agentic-kvc project's tier study
(gitea.gahow.org/gahow/agentic-kvc, commit 837df6bc9e05f5a5b4af27a36356efdd4cff2ecd, its message):
TTFT of one request whose reused prefix of L tokens is served from each tier, on one H20 with
Qwen3-Coder-30B-A3B and vLLM 0.18.1 (native CPU offloading), L from 1k to 64k tokens: a CPU-tier
hit takes 57 ms at 1k and 272 ms at 64k ("transfer-bound", PCIe host-to-device about 54 GB/s), a
miss 78 ms to 15.2 s. kvsim has no H20 preset, so only the part of a CPU hit that does not depend
on the GPU's arithmetic is compared: how much longer a 64k-token CPU hit takes than a 1k one, which
kvsim attributes to the load (whole blocks at the link's bandwidth, as `kvsim.kv.offload_connector`
prices one load on an idle link; 64k is past the preset's max_position_embeddings, so the bytes are
computed from its KV layout directly rather than by a run).
kvsim's KV bytes are its `qwen3-30b-a3b` preset's (the Coder variant's attention shape is taken to be
the same: not checked here).

The second measurement: vLLM's own post on the connector ("Inside vLLM's New Offloading Connector", Ozeri and
Harnik, vllm-project/vllm-project.github.io `_posts/2025-12-29-offloading-connector.md`, blog.vllm.ai):
one request's TTFT with its whole prompt loaded from the CPU tier against prefilling it, Llama-3.1-8B-Instruct
on one H100 80GB HBM3, GPU prefix caching off, 16-token blocks. Its text gives a 2x-22x reduction "depending
on the prompt size" (the prompt sizes are only in its Fig. 1, not in the text), about 2x at 512 tokens, and
up to about 50 GB/s one way for the DMA copy at large blocks (a Llama-3.1-8B block of 16 tokens is 2 MB).
kvsim prices the same request as its connector does: every full block loads over the link (L // 16 blocks,
as vLLM's `get_num_new_matched_tokens` asks for), then one step prefills the rest, or recomputes the last token
when the load covered them all (vLLM's `_update_waiting_for_remote_kv`); against the prefill of all L tokens
(`kvsim.planning.offload_sizing.prefill_s`), both with kvsim's llama-3.1-8b and h100-80gb presets and
roofline latency, at the preset's PCIe 5.0 link (64 GB/s) and at the post's 50 GB/s.
Writes `benchmarks/results/offload_published.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kvsim.engine.builder import make_latency, resolve_engine
from kvsim.latency.step_plan import StepPlan
from kvsim.model.capacity import kv_bytes_per_block
from kvsim.model.config import load_model
from kvsim.model.engine_config import make_engine
from kvsim.model.units import ceil_div
from kvsim.planning.offload_sizing import prefill_s
from kvsim.workload.scenario import make_scenario

RESULTS = Path(__file__).resolve().parent / "results" / "offload_published.json"
SOURCE = ("gitea.gahow.org/gahow/agentic-kvc commit 837df6bc9e05f5a5b4af27a36356efdd4cff2ecd: H20, "
          "Qwen3-Coder-30B-A3B, vLLM 0.18.1, native CPU offloading")
MEASURED_CPU_HIT_TTFT_S = {1024: 0.057, 65536: 0.272}
MEASURED_H2D_BYTES_PER_S = 54e9
VLLM_BLOG = ("vllm-project/vllm-project.github.io _posts/2025-12-29-offloading-connector.md (blog.vllm.ai): "
             "Llama-3.1-8B-Instruct, H100 80GB HBM3, GPU prefix caching off, single request")
VLLM_BLOG_DMA_BYTES_PER_S = 50e9  # "both can get up to about 50GB/s" one way, large blocks
VLLM_BLOG_PUBLISHED = {"ttft_reduction_range": [2, 22], "ttft_reduction_at_512_tokens": 2,
                       "dma_one_way_bytes_per_s_max": VLLM_BLOG_DMA_BYTES_PER_S}
PROMPT_LENS = (512, 1024, 4096, 16384, 65536, 131072)


def vllm_blog_comparison() -> dict[str, Any]:
    """kvsim's single-request TTFT, whole prompt from the CPU tier against recomputed (module docstring)."""
    scenario = make_scenario({"name": "vllm-offload-blog", "model": "llama-3.1-8b", "gpu": "h100-80gb",
                              "engine": {"max_model_len": 131072},
                              "workload": {"num_requests": 1, "prompt_len": {"dist": "fixed", "value": 512},
                                           "output_len": {"dist": "fixed", "value": 1}}})
    spec = resolve_engine(scenario)
    latency, bs = make_latency(spec), spec.engine.block_size
    rows = []
    for n in PROMPT_LENS:
        num_blocks = n // bs  # every full block, as the connector loads them (`kvsim.sched.offload`)
        computed = min(num_blocks * bs, n - 1)  # a load covering every token leaves the last to recompute
        rest = StepPlan()
        rest.add(n - computed, computed, 1, True)
        num_bytes = num_blocks * spec.bytes_per_block
        recompute = prefill_s(scenario, n)
        row: dict[str, Any] = {"prompt_tokens": n, "bytes_loaded": num_bytes, "recompute_ttft_s": recompute}
        for name, bandwidth in (("pcie5", spec.gpu.host_link_bandwidth_bytes_per_s),
                                ("blog_dma", VLLM_BLOG_DMA_BYTES_PER_S)):
            hit = num_bytes / bandwidth + latency.step_time(rest)
            row[f"cpu_hit_ttft_s_{name}"] = hit
            row[f"ttft_reduction_{name}"] = recompute / hit
        rows.append(row)
    return {"source": VLLM_BLOG, "published": VLLM_BLOG_PUBLISHED, "bytes_per_block": spec.bytes_per_block,
            "max_num_batched_tokens": spec.limits.max_num_batched_tokens, "kvsim": rows}


def main() -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()  # --help: say what it is, run nothing
    engine = make_engine()  # block size 16, TP 1, KV in the model's dtype
    block_bytes = kv_bytes_per_block(load_model("qwen3-30b-a3b"), engine)
    num_bytes = {n: ceil_div(n, engine.block_size) * block_bytes for n in MEASURED_CPU_HIT_TTFT_S}  # whole blocks
    load_s = {n: b / MEASURED_H2D_BYTES_PER_S for n, b in num_bytes.items()}  # the connector's load, link idle
    measured_growth = MEASURED_CPU_HIT_TTFT_S[65536] - MEASURED_CPU_HIT_TTFT_S[1024]
    kvsim_growth = load_s[65536] - load_s[1024]
    out = {"source": SOURCE, "measured_cpu_hit_ttft_s": MEASURED_CPU_HIT_TTFT_S,
           "measured_h2d_bytes_per_s": MEASURED_H2D_BYTES_PER_S, "kvsim_load_s": load_s,
           "kvsim_bytes": num_bytes, "kvsim_bytes_per_block": block_bytes,
           "measured_growth_1k_to_64k_s": measured_growth, "kvsim_load_growth_1k_to_64k_s": kvsim_growth,
           "kvsim_over_measured": kvsim_growth / measured_growth,
           "implied_effective_bytes_per_s": (num_bytes[65536] - num_bytes[1024]) / measured_growth,
           "vllm_blog": vllm_blog_comparison()}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

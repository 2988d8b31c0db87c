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
the same: not checked here). Writes `benchmarks/results/offload_published.json`.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvsim.model.capacity import kv_bytes_per_block
from kvsim.model.config import load_model, make_engine
from kvsim.model.units import ceil_div

RESULTS = Path(__file__).resolve().parent / "results" / "offload_published.json"
SOURCE = ("gitea.gahow.org/gahow/agentic-kvc commit 837df6bc9e05f5a5b4af27a36356efdd4cff2ecd: H20, "
          "Qwen3-Coder-30B-A3B, vLLM 0.18.1, native CPU offloading")
MEASURED_CPU_HIT_TTFT_S = {1024: 0.057, 65536: 0.272}
MEASURED_H2D_BYTES_PER_S = 54e9


def main() -> None:
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
           "implied_effective_bytes_per_s": (num_bytes[65536] - num_bytes[1024]) / measured_growth}
    RESULTS.write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

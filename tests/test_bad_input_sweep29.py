"""Bad input found by the twenty-ninth sweep (the commands' options at their edges, `--set` on every section, settings
valid alone that conflict, the Python API, whether a result says it is whole). Each is refused (the CLI: exit 2, one
line naming the field and the value, nothing written; the Python API: a `KvsimError`), or said as it is.

Found: a v0 request that fits the KV pool but not beside v0's free-block watermark (vLLM v0's `can_allocate`:
AllocStatus.NEVER) was rejected as "needs more KV slots than the pool's N", a request needing N or fewer.
"""

from __future__ import annotations

import kvsim

TINY_V0 = {"engine": {"scheduler": "v0", "max_model_len": 8192, "num_gpu_blocks_override": 600, "watermark": 0.9},
           "latency": {"model": "constant"}, "steps": "none",
           "workload": {"num_requests": 2, "prompt_len": {"dist": "fixed", "value": 2000},
                        "output_len": {"dist": "fixed", "value": 10}}}


def test_a_v0_request_that_fits_the_pool_but_not_beside_the_watermark_names_the_watermark():
    """600 blocks of 16 tokens: 9,600 slots (v0 has no null block). The watermark keeps int(0.9 · 600) = 540 blocks,
    8,640 slots, free; a request of 2,000 + 10 tokens holds cdiv(2,010, 16) = 126 blocks, 2,016 slots: it fits the
    9,600 but not the 960 beside the watermark, so vLLM v0 never admits it (9,600 − 2,016 < 8,640)."""
    summary = kvsim.simulate(TINY_V0).summary
    assert summary["reject_reasons"] == {"needs more KV slots than the pool's 9600 less the watermark's 8640": 2}


def test_a_v0_request_larger_than_the_pool_is_still_told_so():
    """Two samples of a 4,800-token prompt (300 blocks, shared) each answering 3,000 tokens (cdiv(3,000, 16) = 188
    blocks of its own): 300 + 2 · 188 = 676 blocks, more than the 600 of the pool itself, watermark or not."""
    summary = kvsim.simulate(TINY_V0, workload__n=2, workload__prompt_len={"dist": "fixed", "value": 4800},
                             workload__output_len={"dist": "fixed", "value": 3000}).summary
    assert summary["reject_reasons"] == {"needs more KV slots than the pool's 9600": 2}

"""CUDA-graph batch padding: how many tokens a vLLM v1 step really runs through its layers.

vLLM v1 (unless `enforce_eager`) captures CUDA graphs at fixed token counts and pads a step's batch up to
the next one. What follows is vLLM 0.19.0's code, the version of the measured runs; it is unchanged on main.

Capture sizes (vllm/config/vllm.py, `VllmConfig._set_cudagraph_sizes`, default "balanced" performance mode):

    max = min(max_num_seqs · (1 + K) · 2, 512, max_num_batched_tokens)      K: speculative tokens (0 without)
    sizes = [1, 2, 4] + range(8, 256, 8) + range(256, max + 1, 16), those ≤ max

With speculative decoding and full decode graphs (the default `FULL_AND_PIECEWISE` mode), every size is rounded
up to a multiple of K + 1 and those above the old max dropped (`CompilationConfig.
adjust_cudagraph_sizes_for_spec_decode`, called from `GPUModelRunner.initialize_cudagraph_capture`); vLLM refuses to
start where none is left (K + 1 > max). Sequence parallelism would drop sizes that are not multiples of the
TP degree, but it is off at every default optimization level (`IS_DENSE = False`).

Padding (vllm/v1/cudagraph_dispatcher.py, `CudagraphDispatcher.dispatch`, from `GPUModelRunner.
_determine_batch_execution_and_padding`): a step of T ≤ max tokens runs at the smallest size ≥ T, a full graph
for a uniform decode batch, a piecewise one (attention outside the graph) for any other; T > max runs eager,
unpadded. The padded tokens go through every op inside the graphs: the linear layers, the MoE layers, the
per-token ops (norms, rotary, activation, embedding) and the TP all-reduces. They add no attention work: in a
full graph the padded requests have `seq_lens` 0 (`GPUModelRunner._prepare_inputs`: `seq_lens[num_reqs:].fill_(0)`)
and their slot mapping −1, and a piecewise graph runs attention eagerly on the real tokens only; nor LM head
or sampler rows (`logits_indices` picks the real ones).

Data parallelism, for MoE models (`coordinate_batch_across_dp`, vllm/v1/worker/dp_utils.py; dense DP ranks are
independent engines with no coordination): every rank, an idle one on its dummy batch of 1 + K tokens
(`Worker.execute_dummy_batch`, a uniform decode), pads its own count as above, then an all-reduce takes the
least graph mode of the ranks: if every rank runs a graph, every rank runs the largest padded count; if one runs
eager, each runs its own padded count. The expert layers all-gather every rank's tokens
(`allgather_reducescatter`, vLLM's default all2all backend), so they carry the sum over the ranks.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kvsim.model.errors import KvsimError

if TYPE_CHECKING:
    from kvsim.latency.step_plan import StepPlan
    from kvsim.model.engine_config import EngineConfig


def capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, num_speculative_tokens: int = 0) -> tuple[int, ...]:
    """vLLM 0.19's default CUDA-graph capture sizes, ascending (the module docstring). `KvsimError` where vLLM
    refuses to start: no size is a multiple of 1 + `num_speculative_tokens`."""
    query_len = 1 + num_speculative_tokens
    largest = min(max_num_seqs * query_len * 2, 512, max_num_batched_tokens)
    sizes = sorted({*(i for i in (1, 2, 4) if i <= largest), *range(8, min(largest + 1, 256), 8),
                    *range(256, largest + 1, 16)})
    if query_len > 1:  # each size rounded up to a multiple of 1 + K, those past the largest size dropped
        top = sizes[-1]
        sizes = sorted({up for up in (-(-size // query_len) * query_len for size in sizes) if up <= top})
        if not sizes:
            raise KvsimError(f"engine.max_num_batched_tokens={max_num_batched_tokens}: vLLM refuses to start with "
                             f"num_speculative_tokens={num_speculative_tokens}: no CUDA graph size up to {top} "
                             f"is a multiple of {query_len}; set engine.enforce_eager=true or raise the budget")
    return tuple(sizes)


@dataclass(frozen=True, slots=True)
class CudaGraphPadding:
    """The capture sizes of one engine (`capture_sizes`) and the padding they imply; `dummy_tokens`: the
    uniform decode an idle data-parallel rank runs (1 + speculative tokens)."""

    sizes: tuple[int, ...]
    dummy_tokens: int = 1

    @classmethod
    def of(cls, max_num_seqs: int, max_num_batched_tokens: int, num_speculative_tokens: int = 0) -> CudaGraphPadding:
        return cls(capture_sizes(max_num_seqs, max_num_batched_tokens, num_speculative_tokens),
                   1 + num_speculative_tokens)

    def padded(self, num_tokens: int) -> int:
        """Tokens a step of `num_tokens` runs: the smallest capture size that holds them; itself when it is
        larger than every size (eager) or 0 (no step)."""
        i = bisect.bisect_left(self.sizes, num_tokens)
        return self.sizes[i] if num_tokens and i < len(self.sizes) else num_tokens

    def in_graph(self, num_tokens: int) -> bool:
        return num_tokens <= self.sizes[-1]

    def coordinate(self, plans: Sequence[StepPlan], num_ranks: int) -> None:
        """Set `num_dp_padded_tokens` and `num_dp_group_tokens` on the `plans` of one step of a lockstep
        data-parallel group of `num_ranks` ranks (the ranks without a plan run the dummy batch), as vLLM's
        `coordinate_batch_across_dp` pads them (the module docstring)."""
        idle = num_ranks - len(plans)
        counts = [plan.num_tokens for plan in plans] + [self.dummy_tokens] * idle
        padded = [self.padded(n) for n in counts]
        if all(self.in_graph(n) for n in counts):
            padded = [max(padded)] * num_ranks
        group = sum(padded)
        for i, plan in enumerate(plans):
            plan.num_dp_padded_tokens = padded[i]
            plan.num_dp_group_tokens = group


def engine_padding(engine: EngineConfig, max_num_seqs: int, max_num_batched_tokens: int) -> CudaGraphPadding | None:
    """The padding of `engine`'s steps, given its resolved limits: None with `enforce_eager`, and for the v0 and
    static schedulers (vLLM v0 captured decode graphs by other rules, not modelled)."""
    if engine.enforce_eager or engine.scheduler != "v1":
        return None
    spec = engine.speculative_config
    return CudaGraphPadding.of(max_num_seqs, max_num_batched_tokens, 0 if spec is None else spec.num_speculative_tokens)


def coordinate_dp_group(plans: Sequence[StepPlan], num_ranks: int, padding: CudaGraphPadding | None) -> None:
    """One step of a lockstep data-parallel group: each plan learns the group's token count for the expert
    layers (`StepPlan.num_dp_group_tokens`) and, with CUDA graphs (`padding`), the tokens its rank runs
    (`CudaGraphPadding.coordinate`); without them the group's tokens are the plans' own, unpadded."""
    if padding is not None:
        padding.coordinate(plans, num_ranks)
        return
    group = sum(plan.num_tokens for plan in plans)
    for plan in plans:
        plan.num_dp_group_tokens = group

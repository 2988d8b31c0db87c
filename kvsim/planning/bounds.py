"""The fewest replicas any engine could serve a traffic with: a floor from first principles.

    floor = replica_floor(scenario, rate_per_s)   # the traffic's lengths on one replica of the scenario

Two floors; the larger binds (`binds`), and `replicas = ceil(max(compute, kv))`:

**compute.** Every output token and every prompt token no cache can serve must be computed. With prefix
caching on, a prompt's leading full blocks that an earlier request's sequence also has (at most all but the
block holding its last token, which vLLM computes whatever is cached) are taken as served by a cache that
never evicts and that every replica shares (`cacheable_prompt_tokens`): no engine computes fewer. So are they,
prefix caching on or off, beside an offload tier (`engine.kv_offload`), which stores and loads those blocks too,
and its last full block as well: vLLM's OffloadingConnector looks up `num_tokens // block_size` blocks, and a
load that covers the whole prompt leaves only its last token to compute (`Scheduler._update_waiting_for_remote_kv`),
so with a tier at most P − 1 tokens are served (31 of a 32-token prompt in 16-token blocks, where a GPU hit
serves 16). One replica computes prompt
tokens at best at C ÷ t_prefill tokens/s (one step of a full chunk, C = max_num_batched_tokens new
tokens) and output tokens at best at B ÷ t_decode tokens/s (one decode step of B = max_num_seqs
sequences at the traffic's mean context, or of a CUDA-graph capture size below B where that is faster a token:
`_decode_steps`), t the latency model's step time (`kvsim.latency`). So a
request costs at least P · t_prefill/C + O · t_decode/B replica-seconds, and λ requests a second
need λ · E[that] replicas. (Each token type is priced at its own best batch; a step mixing both
could share the weight reads, which this leaves out, so it is a floor per token type.)

A request of n > 1 samples (parallel sampling, or n beams) computes n · O output tokens. Its prompt is
computed once where the samples fork from one prefill (vLLM v0, the static policies, beam search); vLLM v1
fans it out into n child requests (`kvsim.sched.fanout`), each of which computes the prompt on its own but
for the cache: with prefix caching on, children 2..n hit the first child's full blocks except the one
holding the last token, so each computes P − block_size · ⌊(P − 1) / block_size⌋ tokens (the tail: 8 of a
40-token prompt in 16-token blocks, 16 of a 32-token one); with an offload tier, which serves the last full
block too, P − min(block_size · ⌊P / block_size⌋, P − 1) (8 of 40, 1 of 32); with neither, all P. So a request computes
(P − cached) + (n − 1) · that prompt tokens.

**kv.** By Little's law the KV one replica's requests hold on average is λ · E[∫ held dt]. A request
holds at least its context (P + k tokens at its k-th output token; of the prompt, only the tokens no cache
the GPU prefix cache serves, as a cached prefix may be shared with other requests; a prefix loaded from an
offload tier with caching off fills the request's own blocks, so it counts) during each of its O − 1 decode steps, and a
decode step lasts at least t_1 (one sequence: the fastest step), so in a pool of one KV cache group
∫ held dt ≥ t_1 · (O − 1) · (P − cached + n · O/2) token-seconds (n samples share at most the prompt),
against the pool's usable token slots
(num_gpu_blocks − 1) · block_size (all num_gpu_blocks where no null block is kept: v0, slab pools).
A hybrid model's pool (Gemma 3: one full-attention group and six sliding ones; gpt-oss) gives every KV
cache group a block table of its own, all drawing from those slots (vllm/v1/core/kv_cache_coordinator.py,
KVCacheCoordinator.__init__: one BlockPool of kv_cache_config.num_blocks for every group's manager), so a
request holds slots in each group: a full-attention group its context c, a sliding-window one of window w
at least min(c, w − 1) (SlidingWindowManager frees what slid out, `KVGroup.num_skipped_tokens`), a
chunked-local one of chunk C at least one sample's c mod C (the tokens of its current chunk, less a cached
prefix in it). While every context is inside the window and the chunk, that is the group count times the
one-group floor (the pool's slots divided among the groups, as vLLM's "GPU KV cache size",
num_blocks // groups · block_size, counts them); past them, the sliding groups add at most w − 1 each
(`held_token_steps`).

Requests the engine refuses (prompt + output over max_model_len) are left out, as they are never served:
λ is the rate of the servable ones (an offered traffic's rate times their share of the scenario's requests; a
run's, the rate it finished requests at).

**The gap, from the run's own counters** (`gap_breakdown`). The floor and its gap describe one run: the run
behind the answer (`run_floor`: that run's requests, at the rate it served them, λ = n ÷ T, its n finished
requests over its duration T from the first arrival to the last step's end). Neither the offered traffic's
nominal rate nor a probe's: the gap splits the answer's replicas by what that run's replicas did, so its rate
must be the one their busy time was spent at. (The first 200 arrivals of a 14 req/s Poisson toy come at
12.26 req/s, its 4,000-request run's at 14.19, served at 14.13 over the run: priced at the 200's rate, the
compute floor read 1.97 replicas instead of 2.27 and idle 0.40 instead of 0.00; a base traffic faster than the
long run made idle negative, which no run can be.) A fleet of R replicas whose steps took B replica-seconds in
all keeps B ÷ T replicas busy on average, and each request costs w = B ÷ n replica-seconds against the floor's
w_min (λ·w = B ÷ T). So, exactly,

    R = λ·w_min                      compute floor (every token at its best batch)
      + B/T − λ·w_min − recompute    batching: steps below the best batch (too little load, max_num_seqs,
                                     or the KV pool capping the batch); negative where mixed prefill and
                                     decode steps share weight reads the floor prices apart
      + recompute                    preemption: (prefill tokens computed beyond each prompt's uncached part)
                                     ÷ T · the floor's cost of a prompt token
      + (R − B/T)                    idle: the replicas not stepping, averaged over the run (capacity held
                                     back so queues stay within the SLO, the warm-up and drain of a finite
                                     run, and the count rounded up); never negative, as no replica steps for
                                     longer than T

and the gap to the floor that binds is R − max(compute, kv). The KV floor stands beside it: when it
binds, the KV pool is what caps the batch, and its cost shows up as batching.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from kvsim.latency.step_plan import StepPlan
from kvsim.model.kv_layout import KVGroup
from kvsim.model.units import counted
from kvsim.sched.fanout import fans_out
from kvsim.workload.request import Request
from kvsim.workload.scenario import Scenario

if TYPE_CHECKING:
    from kvsim.latency.base import LatencyModel


@dataclass(frozen=True, slots=True)
class ReplicaFloor:
    """Replicas needed by compute and by KV held (fractions), and which binds."""

    rate_per_s: float
    compute_replicas: float
    kv_replicas: float
    num_requests: int  # the servable requests the mean lengths come from
    prompt_token_s: float = 0.0  # replica-seconds a prompt token costs at best (a full chunk's step ÷ its tokens)
    output_token_s: float = 0.0  # ... and an output token (a full decode step ÷ its sequences)
    # the run this floor describes (`run_floor`): its finished requests and its duration (0, 0.0: offered traffic)
    num_served: int = 0
    duration_s: float = 0.0

    @property
    def replicas(self) -> int:
        return max(1, math.ceil(max(self.compute_replicas, self.kv_replicas)))

    @property
    def binds(self) -> str:
        return "compute" if self.compute_replicas >= self.kv_replicas else "kv"


def replica_floor(scenario: Scenario, rate_per_s: float) -> ReplicaFloor:
    """The floor for `rate_per_s` requests a second offered with `scenario`'s lengths on its model, GPU and
    engine: an offered traffic's, with no run behind it. Refused requests are never served: the floor is for the
    servable share of `rate_per_s` (its `rate_per_s`)."""
    return _floor(scenario, lambda num_servable, num_offered: rate_per_s * num_servable / num_offered)


def run_floor(scenario: Scenario, num_served: int, duration_s: float) -> ReplicaFloor:
    """The floor of one run: `scenario`'s requests (the run's own, all of them, on one replica of its shape) at
    the rate the run served them, `num_served` finished requests over its `duration_s` (first arrival to the last
    step's end). The rate its replicas' busy time was spent at: `gap_breakdown` splits the run's replicas
    against this floor, and against no other. Empty (rate 0) when the run served nothing."""
    if num_served <= 0 or duration_s <= 0:
        return ReplicaFloor(0.0, 0.0, 0.0, 0)
    floor = _floor(scenario, lambda num_servable, num_offered: num_served / duration_s)
    return replace(floor, num_served=num_served, duration_s=duration_s)


def _floor(scenario: Scenario, servable_rate_per_s: Callable[[int, int], float]) -> ReplicaFloor:
    """The floor at the rate `servable_rate_per_s(servable requests, offered requests)` of `scenario`'s requests
    that the engine can serve (prompt + output within max_model_len), with their lengths."""
    from kvsim.engine.builder import make_latency, resolve_engine
    from kvsim.workload.generate import build_requests

    spec = resolve_engine(scenario)
    gpu, engine, max_model_len = spec.gpu, spec.engine, spec.max_model_len
    offered = build_requests(scenario, max_model_len, np.random.default_rng(scenario.seed))
    requests = [r for r in offered if r.prompt_len + r.output_len <= max_model_len]
    if not requests:
        return ReplicaFloor(0.0, 0.0, 0.0, 0)
    rate_per_s = servable_rate_per_s(len(requests), len(offered))
    prompts = np.array([r.prompt_len * 1.0 for r in requests])
    # prefix tokens no request computes again: hit on the GPU (never the block holding the last token), or loaded
    # from an offload tier (that block too, but for the last token; with caching off too); held once for all
    # only where the GPU cache shares the blocks (a load fills a request's own blocks)
    bs, tier = engine.block_size, engine.has_offload_tier
    reuses = engine.enable_prefix_caching or tier
    cached = cacheable_prompt_tokens(requests, bs) if engine.enable_prefix_caching else 0.0
    reused = cacheable_prompt_tokens(requests, bs, last_block=True) if tier else cached
    samples = np.array([r.num_samples * 1.0 for r in requests])
    outputs = np.array([r.output_len * 1.0 for r in requests])
    latency = make_latency(spec)
    chunk = engine.resolved_max_num_batched_tokens(max_model_len, gpu)
    batch = engine.resolved_max_num_seqs(gpu)
    context = max(1, round(float(np.mean(prompts + outputs / 2))))  # a decode step attends the cached prefix too
    fanned = np.array([engine.scheduler == "v1" and fans_out(r) for r in requests])
    served_blocks = prompts // bs if tier else (prompts - 1) // bs  # a tier serves the last full block too
    child_prompts = np.where(fanned, prompts - np.minimum(bs * served_blocks, prompts - 1)
                             if reuses else prompts, 0.0)  # what each further v1 child computes
    held_prompts = prompts - cached  # the prompt tokens every request holds on its own
    prompts = prompts - reused  # ... and computes
    prefill, single = StepPlan(), StepPlan()
    prefill.add(int(chunk), 0, 1, logits_row=True)
    single.add(1, context - 1, 1, logits_row=True)
    per_prompt_token_s = latency.step_time(prefill) / chunk
    per_output_token_s = min(latency.step_time(decodes) / decodes.num_seqs
                             for decodes in _decode_steps(latency, batch, context))
    computed_prompts = prompts + (samples - 1) * child_prompts
    work_s = float(np.mean(computed_prompts * per_prompt_token_s + samples * outputs * per_output_token_s))
    held_token_s = latency.step_time(single) * float(np.mean(held_token_steps(spec.kv_layout.groups, held_prompts,
                                                                               samples, outputs, cached)))
    pool_tokens = spec.num_kv_slots  # v1's paged pool keeps its null block back; v0's and slab pools do not
    return ReplicaFloor(rate_per_s, rate_per_s * work_s, rate_per_s * held_token_s / pool_tokens, len(requests),
                        per_prompt_token_s, per_output_token_s)


def _decode_steps(latency: LatencyModel, batch: int, context: int) -> list[StepPlan]:
    """Decode steps of `batch` sequences at `context` and of every CUDA-graph capture size below `batch`
    (`kvsim.latency.cudagraph`, the latency model's `cudagraph_padding`): one of them decodes a token at the least
    time. A padded step's layers run its capture size, so a batch that pads up (257 sequences to 272 tokens) can
    cost more a token than the capture size below it (256); within a size's bucket, and past the largest, the
    step's other terms grow at most linearly with its sequences, so its time per token falls with them."""
    padding = latency.cudagraph_padding
    steps = []
    for num_seqs in [*(size for size in (padding.sizes if padding else ()) if size < batch), batch]:
        step = StepPlan()
        step.add(1, context - 1, num_seqs, logits_row=True)
        steps.append(step)
    return steps


def held_token_steps(groups: tuple[KVGroup, ...], prompts: np.ndarray, samples: np.ndarray,
                     outputs: np.ndarray, cached: np.ndarray | float = 0.0) -> np.ndarray:
    """Per request, the fewest KV slots it holds on its own summed over its O − 1 decode steps and over the KV
    cache `groups`: at its k-th step it holds c_k = P + n · k tokens of context (`prompts` P its own, the prompt
    less the `cached` prefix H that other requests may share; n `samples`, O `outputs`), of which a full-attention
    (or MLA) group holds all, a sliding-window group of window w at least min(c_k, w − 1) (n samples' windows hold
    at least that together) and a chunked-local group of chunk C at least one sample's current chunk less the
    cached prefix, min((H + P + k) mod C, P + k): Σ_k c_k = (O − 1) · (P + n · O/2),
    Σ_k min(c_k, W) = m · P + n · m(m + 1)/2 + (O − 1 − m) · W, m = the steps with c_k ≤ W; for the chunk, P + k
    while H + P + k is below B = C · ⌈H / C⌉ (the current chunk still starts inside the cached prefix), then
    Σ_k (H + P + k) mod C = Σ_k (H + P + k) − C · Σ_k ⌊(H + P + k) / C⌋. (The chunk is the whole context's:
    (P + k) mod C is no bound on it.)"""
    steps = np.maximum(outputs - 1, 0)
    held = np.zeros(len(prompts))
    for group in groups:
        if group.kind in ("full", "mla"):
            held += steps * (prompts + samples * outputs / 2)
        elif group.kind == "sliding_window":
            assert group.window_tokens is not None
            most = group.window_tokens - 1
            m = np.clip(np.floor((most - prompts) / samples), 0, steps)
            held += m * prompts + samples * m * (m + 1) / 2 + (steps - m) * most
        elif group.kind == "chunked_local":
            assert group.window_tokens is not None
            chunk, whole = group.window_tokens, prompts + cached
            m = np.clip(chunk * np.ceil(cached / chunk) - whole - 1, 0, steps)  # steps whose chunk starts in H
            first, last = whole + m + 1, whole + steps  # one sample's contexts after those, the fewest any holds
            held += (m * prompts + m * (m + 1) / 2 + (steps - m) * (first + last) / 2
                     - chunk * (_floor_sum(last, chunk) - _floor_sum(first - 1, chunk)))
    return held


def _floor_sum(x: np.ndarray, chunk: int) -> np.ndarray:
    """Σ_{j=0..x} ⌊j / chunk⌋ (x ≥ −1): q = ⌊x / chunk⌋ full runs of 0..q − 1, then x mod chunk + 1 of q."""
    q = np.floor(x / chunk)
    return chunk * q * (q - 1) / 2 + q * (x - q * chunk + 1)


def cacheable_prompt_tokens(requests: list[Request], block_size: int, last_block: bool = False) -> np.ndarray:
    """Per request, the most prompt tokens a prefix cache could serve it: its leading full blocks (at most
    (P − 1) // block_size of them: vLLM's GPU prefix cache never hits the block holding a prompt's last token)
    whose chained hashes an earlier-arriving request's sequence (prompt and output) also has, as a cache that
    never evicts and that every replica shares would hold them. With `last_block` (an offload tier: vLLM's
    OffloadingConnector asks for P // block_size blocks) the last full block counts too, and a prompt served
    whole still computes its last token: at most P − 1. Requests without content share nothing."""
    seen: set[int] = set()
    cached = np.zeros(len(requests))
    for i in sorted(range(len(requests)), key=lambda i: requests[i].arrival_s):
        r = requests[i]
        if r.content is None:
            continue
        hits = 0
        num_asked = (r.prompt_len if last_block else r.prompt_len - 1) // block_size
        for block_hash in r.content.block_hashes(block_size, num_asked):
            if block_hash not in seen:
                break
            hits += 1
        cached[i] = min(hits * block_size, r.prompt_len - 1)
        num_tokens = min(r.content.num_tokens, r.prompt_len + r.output_len)
        seen.update(r.content.block_hashes(block_size, num_tokens // block_size))
    return cached


GAP_PARTS = ("compute_floor", "batching", "preemption", "idle")


def gap_breakdown(floor: ReplicaFloor, replicas: int, busy_replica_s: float,
                  recomputed_tokens: int) -> dict[str, float]:
    """`replicas` split into `GAP_PARTS` (they sum to it) from the run `floor` describes (`run_floor`: its
    requests, served rate and duration T): `busy_replica_s` (its step times summed over replicas) and
    `recomputed_tokens` (tokens computed again after a preemption by recompute dropped their KV:
    `EngineCounters.num_recomputed_tokens`). Also `kv_floor` and `gap` (replicas − the binding floor), all in
    replicas over that run. Idle, `replicas` − busy_replica_s ÷ T, is never negative: a replica that steps the
    whole run has step times summing to T only up to rounding (a sum of thousands of floats against the clock's
    end), so busy is capped at `replicas`. Empty when the run served nothing."""
    if floor.num_served <= 0:
        return {}
    busy = min(busy_replica_s / floor.duration_s, replicas)  # replicas stepping, on average over the run
    preemption = recomputed_tokens / floor.duration_s * floor.prompt_token_s
    parts = {"compute_floor": floor.compute_replicas, "batching": busy - floor.compute_replicas - preemption,
             "preemption": preemption, "idle": replicas - busy}
    return {**parts, "kv_floor": floor.kv_replicas,
            "gap": replicas - max(floor.compute_replicas, floor.kv_replicas)}


def gap_text(parts: dict[str, float], replicas: int | None) -> str:
    """One line: 'R = compute floor a + batching b + preemption c + idle d; KV floor e' (empty: no parts)."""
    if not parts or not replicas:
        return ""
    first, *rest = GAP_PARTS
    terms = f"{first.replace('_', ' ')} {parts[first]:.2f}" + "".join(
        f" {'-' if parts[name] < 0 else '+'} {name} {abs(parts[name]):.2f}" for name in rest)
    return f"{counted(replicas, 'replica')} = {terms}; KV floor {parts['kv_floor']:.2f}"

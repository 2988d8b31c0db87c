"""The calibrated latency model: step time interpolated from a profile measured on a real GPU.

A profile (`kvsim.latency.profiles.Profile`, schema `kvsim.latency.base.PROFILE_COLUMNS`) comes from
`kvsim calibrate` or from an importer (LLMServingSim's bundle, Vidur's mlp.csv). For a step of
T tokens, S logits rows and L layers, on one tensor-parallel rank:

    linear      L · Σ over qkv, o, gate_up, down of t_op(T)          linear in T between points
    token ops   L · Σ calls · t_op(T) over norms, rotary, activation  + Σ t_op(T) of the step ops
    attention   L · t_att(prefill chunk, its cached tokens, decodes, their mean context)
                nested linear interpolation along each axis (`NestedInterp`); a
                profile without mixed batches adds its prefill and decode kernels instead; with a
                measured skew fit, + α · (t_att at the longest decode context − t_att) for decodes of
                unequal lengths (`kvsim.latency.skew`); a sliding-window layer with its contexts capped
                at the window
    sequence    t_lm_head(S) + t_sampler(S)
    + the roofline's all-reduce, copies, CPU overhead and swap (no per-op profile measures those)

T is the roofline's: CUDA-graph padded (`RooflineLatency.run_tokens`, `kvsim.latency.cudagraph`).

Each cost is counted once. LLMServingSim's bundles hold vLLM's layerwise-profile CUDA time per module
(GPU kernel time, no host time: profiler/core/hooks/timings.py), timed in eager mode on one GPU with
per-rank shapes (TP emulated: no all-reduce runs), so neither the CPU overhead nor the all-reduce is in
them; the roofline's token ops, attention and LM head are not added where the profile has its own.
With async scheduling (vLLM's default) the CPU overhead overlaps the step's kernels and counts only
where it is the longer (`RooflineLatency.total_s`). The eager kernels may differ from the CUDA-graph,
torch.compile kernels of the measured run (fusions); no public profile of the compiled kernels is at
hand to say by how much.

Terms the profile lacks fall back to the roofline's estimate, with one warning at load naming
them; a term whose inputs fall outside the measured range falls back for that step, with one
warning per term. Measured times along a 1-D series are made monotone (a running maximum), and
repeated points are averaged, so the model never predicts a shorter step for more work.
"""

from __future__ import annotations

import bisect
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvsim.latency.profiles import Profile
from kvsim.latency.roofline import RooflineLatency
from kvsim.latency.skew import SkewCorrection
from kvsim.latency.step_plan import StepPlan
from kvsim.model.errors import KvsimError
from kvsim.model.moe_cost import expected_experts_touched

if TYPE_CHECKING:
    from kvsim.model.engine_config import EngineConfig
    from kvsim.model.spec import ModelSpec

log = logging.getLogger(__name__)
LAYER_GEMMS = ("qkv", "o", "gate_up", "down")


def _dedupe(xs: Sequence[float], ys: Sequence[float]) -> tuple[list[float], list[float]]:
    """Sorted distinct xs, each with the mean of its ys (a profile may measure a point twice)."""
    groups: dict[float, list[float]] = {}
    for x, y in zip(xs, ys, strict=True):
        groups.setdefault(x, []).append(y)
    keys = sorted(groups)
    return keys, [sum(groups[k]) / len(groups[k]) for k in keys]


class Interp1D:
    """Monotone piecewise-linear interpolation, optionally in log-log space; None outside the range."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], log_space: bool = False) -> None:
        keys, values = _dedupe(xs, ys)
        self.log = log_space
        self.xs = [self._t(x) for x in keys]
        running, self.ys = 0.0, []
        for y in values:
            running = max(running, y)
            self.ys.append(self._t(running))

    def _t(self, v: float) -> float:
        return math.log(v) if self.log else v

    def __call__(self, x: float) -> float | None:
        tx = self._t(x)
        if tx < self.xs[0] - 1e-12 or tx > self.xs[-1] + 1e-12:
            return None
        if len(self.xs) == 1:
            y = self.ys[0]
        else:
            i = min(max(bisect.bisect_right(self.xs, tx) - 1, 0), len(self.xs) - 2)
            x0, x1, y0, y1 = self.xs[i], self.xs[i + 1], self.ys[i], self.ys[i + 1]
            y = y0 + (y1 - y0) * (tx - x0) / (x1 - x0)
        return math.exp(y) if self.log else y


class NestedInterp:
    """Interpolation over scattered points on a mostly regular grid of any number of axes.

    The points form a tree: first axis → second axis → ... → time. A lookup brackets the value
    of the first axis between the two nearest measured keys, interpolates each subtree on the
    remaining axes, and blends the two results linearly in x. Each subtree uses its own keys, so
    an irregular grid needs no filling in. None when a value lies outside its axis' measured range
    (or no subtree answers).

    Linear, not in log(1 + x), although the grids double: the kernels' time is close to linear
    along each axis (decode: a fixed cost + KV bytes read, in sequences and in context), and a
    blend in log space of a linear function overshoots between the points. Predicting every
    interior point of LLMServingSim's RTX PRO 6000 attention grids (Llama-3.1-8B TP 1, Qwen3-32B
    TP 2) from its two neighbours along one axis (4x apart): mean signed error, linear vs log(1 + x),
    prefill chunk +1.6 % vs +5.7 %, cached tokens +0.4 % vs +4.4 %, decodes +5.6 % vs +19.4 %,
    decode context +1.4 % vs +8.7 %; on the Qwen3-30B-A3B moe.csv, tokens +0.5 % vs +4.6 % and
    experts -0.4 % vs +16.4 %.
    """

    def __init__(self, points: Sequence[tuple[tuple[float, ...], float]]) -> None:
        self.tree: dict[float, Any] = {}
        sums: dict[tuple[float, ...], list[float]] = {}
        for key, t in points:  # a point measured twice counts once, at its mean
            sums.setdefault(key, []).append(t)
        for key, ts in sums.items():
            node = self.tree
            for x in key[:-1]:
                node = node.setdefault(x, {})
            node[key[-1]] = sum(ts) / len(ts)
        self.sorted: dict[int, list[float]] = {}

    def _keys(self, node: dict[float, Any]) -> list[float]:
        keys = self.sorted.get(id(node))
        if keys is None:
            keys = self.sorted[id(node)] = sorted(node)
        return keys

    def _lookup(self, node: Any, coords: tuple[float, ...]) -> float | None:
        if not coords:
            return float(node)
        keys, x = self._keys(node), coords[0]
        if x < keys[0] - 1e-9 or x > keys[-1] + 1e-9:
            return None
        i = bisect.bisect_left(keys, x)
        if i < len(keys) and abs(keys[i] - x) <= 1e-9:
            return self._lookup(node[keys[i]], coords[1:])
        k0, k1 = keys[i - 1], keys[i]
        v0, v1 = self._lookup(node[k0], coords[1:]), self._lookup(node[k1], coords[1:])
        if v0 is None or v1 is None:
            return v1 if v0 is None else v0
        return v0 + (v1 - v0) * (x - k0) / (k1 - k0)

    def __call__(self, *coords: float) -> float | None:
        return self._lookup(self.tree, coords) if self.tree else None


def _ops(rows: list[dict[str, str]], kind: str, axis: str) -> dict[str, tuple[Interp1D, int]]:
    """One monotone interpolator (and its calls per layer or step) per op of `kind` over `axis`."""
    by_op: dict[str, list[dict[str, str]]] = {}
    for r in rows:
        if r["kind"] == kind:
            by_op.setdefault(r["op"], []).append(r)
    return {op: (Interp1D([float(r[axis]) for r in rs], [float(r["time_s"]) for r in rs]),
                 int(float(rs[0].get("calls") or 1))) for op, rs in by_op.items()}


class CalibratedLatency:
    """Step time from a measured profile, with the roofline for what the profile does not cover."""

    def __init__(self, profile: Profile, model: ModelSpec, engine: EngineConfig, roofline: RooflineLatency) -> None:
        tp = engine.tensor_parallel_size
        self.name = f"calibrated({profile.name}: {profile.meta.get('gpu', '?')})"
        self.roofline = roofline
        self.cudagraph_padding = roofline.cudagraph_padding  # the loop pads a data-parallel group with it
        self.num_layers = model.num_layers
        rows = profile.rows
        self.gemms = {op: f for op, (f, _) in _ops(rows, "gemm", "num_tokens").items()}
        self.token_ops = _ops(rows, "token_op", "num_tokens")
        self.step_ops = _ops(rows, "step_op", "num_tokens")
        self.sequence_ops = {op: f for op, (f, _) in _ops(rows, "sequence_op", "batch").items()}
        if "lm_head" not in self.sequence_ops and "lm_head" in self.gemms:
            self.sequence_ops["lm_head"] = self.gemms["lm_head"]  # kvsim calibrate times it as a GEMM
        shape = {"block_size": str(engine.block_size), "num_heads": str(max(1, model.num_attention_heads // tp)),
                 "num_kv_heads": str(max(1, model.num_kv_heads // tp)), "head_dim": str(model.head_dim)}
        attention_rows = [r for r in rows if r["kind"] in ("decode", "prefill", "attention")]
        matching = [r for r in attention_rows if all(r.get(k) in ("", None, v) for k, v in shape.items())]
        if attention_rows and not matching:
            raise KvsimError(f"profile {profile.name}: no attention rows for {shape}; "
                             "calibrate with this model and block size")
        points = [(_attention_key(r), float(r["time_s"])) for r in matching]
        self.attention = NestedInterp(points)
        self.mixed = any(k[0] > 0 and k[2] > 0 for k, _ in points)
        skew_rows = [r for r in rows if r["kind"] == "attention_skew"]
        self.skew = (SkewCorrection(skew_rows, profile.meta, profile.name, profile.names)
                     if skew_rows and points else None)
        moe_points = [((float(r["num_tokens"]), float(r["num_experts"])), float(r["time_s"]))
                      for r in rows if r["kind"] == "moe"]
        self.moe = NestedInterp(moe_points) if moe_points and roofline.moe is not None else None
        needed = LAYER_GEMMS if roofline.num_dense_mlp_layers else LAYER_GEMMS[:2]
        missing = [term for term, have in (
            ("linear layers", all(op in self.gemms for op in needed)),
            ("MoE layers", roofline.moe is None or self.moe is not None), ("token ops", bool(self.token_ops)),
            ("attention", bool(points)), ("LM head", "lm_head" in self.sequence_ops),
            ("sampler", "sampler" in self.sequence_ops)) if not have]
        if missing:
            log.warning("calibrated latency: profile %s has no %s; using the roofline for %s",
                        profile.name, ", ".join(missing), "them" if len(missing) > 1 else "it")
        self.missing = set(missing)
        self._warned: set[str] = set()

    @classmethod
    def from_csv(cls, path: Path, model: ModelSpec, engine: EngineConfig,
                 roofline: RooflineLatency) -> CalibratedLatency:
        """A kvsim profile CSV, without the compatibility checks of `kvsim.latency.profiles.load_profile`."""
        from kvsim.latency.profiles.native import read_native

        return cls(read_native(path), model, engine, roofline)

    def _fallback(self, term: str, detail: str) -> None:
        if term not in self._warned:
            self._warned.add(term)
            log.warning("calibrated latency: %s outside the profile (%s); using the roofline for it", term, detail)

    def linear_s(self, num_tokens: int, group_tokens: int = 0) -> float:
        """Attention projections and dense MLPs from the GEMM rows, MoE layers from `moe_s`."""
        roof = self.roofline
        if "linear layers" in self.missing:
            return roof.linear_s(num_tokens, group_tokens)
        attn = [self.gemms[op](num_tokens) for op in LAYER_GEMMS[:2]]
        mlp = [self.gemms[op](num_tokens) for op in LAYER_GEMMS[2:]] if roof.num_dense_mlp_layers else []
        if any(t is None for t in attn + mlp):
            self._fallback("linear layers", f"{num_tokens} tokens")
            return roof.linear_s(num_tokens, group_tokens)
        return (sum(attn) * self.num_layers + sum(mlp) * roof.num_dense_mlp_layers  # type: ignore[arg-type]
                + self.moe_s(num_tokens, group_tokens))

    def moe_s(self, num_tokens: int, group_tokens: int = 0) -> float:
        """MoE layers from the profile's (tokens, activated experts) grid, measured on one GPU
        holding every expert: a GPU of g = tp · dp computes the DP group's T tokens' share T / g
        and reads E_touched(T) / g experts (at least top-k, the grid's floor); shared experts,
        router and dispatch/combine come from the roofline."""
        roof, m = self.roofline, self.roofline.moe
        if m is None or not num_tokens:
            return 0.0
        if self.moe is None:
            return roof.moe_s(num_tokens, group_tokens)
        routed = max(num_tokens, group_tokens)
        touched = expected_experts_touched(m.num_experts, m.top_k, routed) / m.num_gpus
        t = self.moe(max(1.0, routed / m.num_gpus), max(float(m.top_k), touched))
        if t is None:
            self._fallback("MoE layers", f"{routed} tokens, {touched:.1f} experts")
            return roof.moe_s(num_tokens, group_tokens)
        rest = (roof._gemm(m.shared_params, num_tokens) if m.shared_params else 0.0) + m.exchange_s(
            routed, roof.gpu_link)
        return m.num_layers * (t + rest)

    def token_ops_s(self, num_tokens: int) -> float:
        if "token ops" in self.missing:
            return self.roofline.token_ops_s(num_tokens)
        per_layer = [(f(num_tokens), calls) for f, calls in self.token_ops.values()]
        per_step = [(f(num_tokens), calls) for f, calls in self.step_ops.values()]
        layer_s = [t * c for t, c in per_layer if t is not None]
        step_s = [t * c for t, c in per_step if t is not None]
        if len(layer_s) + len(step_s) < len(per_layer) + len(per_step):
            self._fallback("token ops", f"{num_tokens} tokens")
            return self.roofline.token_ops_s(num_tokens)
        return self.num_layers * sum(layer_s) + sum(step_s)

    def sequence_s(self, num_logits_rows: int) -> float:
        if not num_logits_rows:
            return 0.0
        total = 0.0
        for op, roof in (("lm_head", self.roofline.lm_head_s), ("sampler", self.roofline.sampler_s)):
            f = self.sequence_ops.get(op)
            t = f(num_logits_rows) if f is not None else None
            if t is None:
                if f is not None:
                    self._fallback(op, f"{num_logits_rows} logits rows")
                t = roof(num_logits_rows)
            total += t
        return total

    def attention_s(self, plan: StepPlan) -> float:
        """All layers' attention: full-attention layers at the plan's contexts, each sliding-window (or
        chunked-local) group at contexts capped by its window (`_layer_attention_s`)."""
        if "attention" in self.missing:
            return self.roofline.attention_s(plan)
        roof = self.roofline
        total = 0.0
        for window, num_layers in ((None, roof.num_full_attention_layers), *roof.windowed_layer_counts):
            if num_layers:
                t = self._layer_attention_s(plan, window)
                if t is None:
                    return self.roofline.attention_s(plan)
                total += num_layers * t
        return total

    def _layer_attention_s(self, plan: StepPlan, window: int | None) -> float | None:
        """One layer's attention from the grid, skew-corrected; None (after the fallback warning) outside it.

        A layer with a `window` sees at most that many past tokens per sequence, so it is looked up with
        each context capped there, as the roofline reads it (`RooflineLatency.decode_read_bytes`): cached
        tokens at most `window` per prefilling sequence, decode contexts at Σ min(context, window) / n on
        average (`StepPlan.decode_context_in_window`) and the shortest and longest at most `window`. An upper
        bound for a prefill chunk (its own queries may see fewer than window + chunk keys), exact while every
        context fits the window.

        Speculative verify chunks (k + 1 tokens of each verifying sequence, `StepPlan.add_verify`) are in the
        prefill chunk: the step's chunks are looked up as one sequence of Σ chunk tokens after Σ cached tokens.
        That reads each sequence's KV once, as vLLM's varlen kernel does, but takes every query to see every
        cached token: n verifying sequences cost up to n times their query-key pairs, which matters where the
        kernel is compute-bound (large n · (k + 1) over long contexts; outside the grid the roofline, exact
        in pairs, prices it). vLLM's spec-as-decode backends (FlashInfer, MLA: `reorder_batch_threshold` =
        1 + k) run them as decodes of k + 1 queries, which a profile has no rows for. Left as it is."""
        chunk = plan.num_prefill_tokens
        num_dec = plan.num_decode_seqs
        cached = max(0, plan.sum_context_tokens - plan.sum_decode_context_tokens - chunk)
        sum_ctx, shortest, longest = (plan.sum_decode_context_tokens, plan.min_decode_context_tokens,
                                      plan.max_decode_context_tokens)
        if window is not None:
            cached = min(cached, (plan.num_seqs - num_dec) * window)
            sum_ctx = plan.decode_context_in_window(window)
            shortest, longest = min(shortest, window), min(longest, window)
        mean_ctx = sum_ctx / num_dec if num_dec else 0.0
        if self.mixed or not (chunk and num_dec):
            t = self.attention(chunk, cached, num_dec, mean_ctx)
            if self.skew is not None and t is not None and num_dec > 1 and longest > shortest:
                # (equal contexts, or fewer than two decodes: `corrected` would return t; skip the lookup)
                t = self.skew.corrected(t, self.attention(chunk, cached, num_dec, longest),
                                        chunk, num_dec, mean_ctx, shortest, longest, cached)
        else:
            pre, dec = self.attention(chunk, cached, 0, 0), self.attention(0, 0, num_dec, mean_ctx)
            t = None if pre is None or dec is None else pre + dec
        if t is None:
            self._fallback("attention", f"prefill {chunk} tokens after {cached}, {num_dec} decodes at "
                                        f"mean context {mean_ctx:.0f}")
        return t

    def step_time(self, plan: StepPlan) -> float:
        compute = 0.0
        if plan.num_tokens:
            t = self.roofline.run_tokens(plan)
            compute = (self.linear_s(t, plan.num_dp_group_tokens) + self.token_ops_s(t) + self.attention_s(plan)
                       + self.sequence_s(plan.num_logits_rows) + self.roofline.fixed_s(plan))
        return self.roofline.total_s(compute, plan)


def _attention_key(r: dict[str, str]) -> tuple[float, float, float, float]:
    """(prefill chunk, its cached tokens, decode sequences, decode context) of an attention-kind row."""
    if r["kind"] == "decode":
        return 0.0, 0.0, float(r["batch"]), float(r["context_len"])
    chunk = float(r["query_len"])
    cached = float(r["context_len"] or 0) - chunk if chunk else 0.0
    if r["kind"] == "prefill":
        return chunk, cached, 0.0, 0.0
    return chunk, cached, float(r["batch"] or 0), float(r["decode_context_len"] or 0)

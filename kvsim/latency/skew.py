"""The measured skew correction of attention for decodes of unequal context lengths.

A profile's attention grid times batches whose decodes all have one context length; the calibrated
model looks a step up at the decodes' mean context, which has the batch's exact KV read
(n · mean = Σ context). A real batch mixes short and long decodes, and the varlen attention
kernel is slower on it than on the uniform batch (work splits unevenly over the SMs, tiles are
padded): LLMServingSim's profiler times bimodal batches (`skew.csv`: n decodes of which a share are
long) against uniform ones at the mean and at the longest context and fits, per bucket,

    α = (t_skew − t_mean) / (t_max − t_mean),  so  t = t_mean + α · (t_max − t_mean)

(`skew_fit.csv`, weighted least squares per bucket; `meta.yaml` holds the bucket edges and α_default,
the pooled fit, for a bucket the table lacks). A step's bucket:

    chunk       the prefill chunk's tokens as they are (0 = pure decode): the fit keys its buckets by the
                profiled chunk itself (meta.yaml: `pc: raw pc value (profiled grid point)`) and LLMServingSim
                looks a step up by its raw chunk (`_skew_alpha`: `pc={int(pc)}|...`), so a chunk that is not
                a profiled one has no bucket (α_default). A runtime chunk (what is left of the prompt or of
                the token budget after the decodes) lands on a profiled one only by chance: all 208 mixed
                steps of the Qwen3-32B replay take α_default, the 208 of 208 LLMServingSim's later
                profiler (skew fit notes) counts for the peer on that workload
    batch       decode sequences n
    share       (mean − min) / (max − min) of the decode contexts, in [0, 1] (the long decodes' share
                for a bimodal batch)
    longest     the longest decode context (kv_big)
    cached      the prefill chunk's cached tokens (kv_prefill)

each axis but the chunk bucketed by its edges: a value falls in the first bucket whose upper edge
is at least the value; beyond the last edge it has no bucket (α_default). No correction for fewer
than two decodes or equal contexts.

Rows (`kvsim.latency.base.PROFILE_COLUMNS`, kind `attention_skew`): query_len = the chunk, batch,
skew_share, decode_context_len (longest) and context_len (cached) = the bucket's upper edges,
alpha. Metadata: `attention_skew_edges` (`batch=2,4,...;skew_share=...;decode_context_len=...;
context_len=...`) and `attention_skew_alpha_default`.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from kvsim.model.errors import KvsimError
from kvsim.model.units import read_number

AXES = ("batch", "skew_share", "decode_context_len", "context_len")
"""The bucketed axes, in key order after the chunk: decodes, share of long ones, longest decode, cached."""
EDGES_KEY = "attention_skew_edges"
DEFAULT_KEY = "attention_skew_alpha_default"


def format_edges(edges: Mapping[str, Sequence[float]]) -> str:
    """`attention_skew_edges` metadata: `axis=e1,e2,...` per axis of `AXES`, joined by `;`."""
    return ";".join(f"{axis}={','.join(repr(float(e)) for e in edges[axis])}" for axis in AXES)


def _parse_edges(text: str, where: str) -> dict[str, list[float]]:
    edges: dict[str, list[float]] = {}
    try:
        for part in text.split(";"):
            axis, _, values = part.partition("=")
            edges[axis.strip()] = sorted(read_number(v, float) for v in values.split(","))
            if not all(math.isfinite(edge) for edge in edges[axis.strip()]):  # NaN sorts nowhere: no bucket holds
                raise ValueError(values)
    except ValueError:
        raise KvsimError(f"profile {where}: {EDGES_KEY}={text!r} is not axis=number,...;...") from None
    if set(edges) != set(AXES):
        raise KvsimError(f"profile {where}: {EDGES_KEY} must give the edges of {', '.join(AXES)}, got {text!r}")
    return edges


def alpha_default(value: Any, where: str, field: str) -> float:
    """The pooled α of the buckets a fit lacks, `value` (a number, or text holding one) as a finite float; a
    `KvsimError` naming `field` otherwise: NaN or inf made every step outside the measured buckets NaN or inf
    seconds, and text such as `1_0` was read as 10."""
    try:
        number = read_number(value, float) if not isinstance(value, bool) else math.nan
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number):
        raise KvsimError(f"profile {where}: {field}={value!r} is not a finite number")
    return number


def bucket_name(key: Sequence[float]) -> str:
    """How an error names the `attention_skew` row of bucket `key` (query_len, then the edges of `AXES`)."""
    edges = ", ".join(f"{axis}={edge:g}" for axis, edge in zip(("query_len", *AXES), key, strict=True))
    return f"attention_skew row ({edges})"


class SkewCorrection:
    """α per bucket from a profile's `attention_skew` rows and metadata; `alpha(...)` for one step. `names`
    (`kvsim.latency.profiles.Profile.names`) gives an imported profile's own name of a row (by `bucket_name`) or
    of `DEFAULT_KEY`, for its errors."""

    def __init__(self, rows: Sequence[Mapping[str, str]], meta: Mapping[str, str], where: str,
                 names: Mapping[str, str] | None = None) -> None:
        self.where, self.names = where, names or {}
        self.edges = _parse_edges(meta.get(EDGES_KEY, ""), where)
        self.alpha_default = alpha_default(meta.get(DEFAULT_KEY) or 0.0, where, DEFAULT_KEY)
        try:
            self.table = {(float(r["query_len"]), *(float(r[a]) for a in AXES)): float(r["alpha"]) for r in rows}
        except ValueError:
            raise KvsimError(f"profile {where}: attention_skew rows need numbers in query_len, "
                             f"{', '.join(AXES)} and alpha") from None

    def _edge(self, axis: str, value: float) -> float | None:
        edges = self.edges[axis]
        i = bisect.bisect_left(edges, value)
        return edges[i] if i < len(edges) else None

    def _bucket(self, chunk: float, num_decodes: int, share: float, longest: float,
                cached: float) -> tuple[float, ...] | None:
        """A step's bucket, the key of its `attention_skew` row; None beyond an axis's last edge."""
        key = [float(max(0.0, chunk))]
        for axis, value in zip(AXES, (num_decodes, min(1.0, max(0.0, share)), longest, cached), strict=True):
            edge = self._edge(axis, value)
            if edge is None:
                return None
            key.append(edge)
        return tuple(key)

    def alpha(self, chunk: float, num_decodes: int, share: float, longest: float, cached: float) -> float:
        """α of a step's bucket (the pooled α_default when its bucket was not measured, a chunk that is not
        a profiled one included)."""
        key = self._bucket(chunk, num_decodes, share, longest, cached)
        return self.alpha_default if key is None else self.table.get(key, self.alpha_default)

    def corrected(self, t_mean: float, t_max: float | None, chunk: float, num_decodes: int, mean_context: float,
                  shortest: float, longest: float, cached: float) -> float:
        """t_mean + α · (t_max − t_mean) for the step's decodes; t_mean when they are fewer than two, all
        of one length, or t_max is unknown (longest beyond the grid) or not above t_mean."""
        if num_decodes < 2 or longest <= shortest or t_max is None or t_max <= t_mean:
            return t_mean
        share = (mean_context - shortest) / (longest - shortest)
        alpha = self.alpha(chunk, num_decodes, share, longest, cached)
        t = t_mean + alpha * (t_max - t_mean)
        if t < 0:
            raise self._negative(self._bucket(chunk, num_decodes, share, longest, cached), alpha, t, t_mean, t_max)
        return t

    def _negative(self, key: tuple[float, ...] | None, alpha: float, t: float, t_mean: float,
                  t_max: float) -> KvsimError:
        """The error for an α below -t_mean / (t_max - t_mean), which makes the step's attention time `t` negative
        (a step of negative time stopped SimPy with a traceback). A negative α is not refused as it is read: the
        measured bundles hold one in 11 to 18 % of their buckets (skewed batches timed a little faster than the
        uniform one, 1 or 2 samples each), harmless until one this far below zero is reached."""
        field = bucket_name(key) if key is not None and key in self.table else DEFAULT_KEY
        field = self.names.get(field, field)  # a bundle's own name of it
        return KvsimError(f"profile {self.where}: {field}: alpha={alpha:g} makes a step's attention {t:.3g} s, below "
                          f"zero (t_mean + alpha * (t_max - t_mean), t_mean={t_mean:.3g} s, t_max={t_max:.3g} s); "
                          "no batch attends in negative time: refit or drop that alpha")

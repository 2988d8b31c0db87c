"""The calibrated latency model: step time interpolated from a profile measured on a real GPU.

A profile (`scenarios/calibration/*.csv`, schema `kvsim.latency.PROFILE_COLUMNS`, written by
`kvsim calibrate`) holds per-layer timings of the Triton paged-attention kernels and of the
model's GEMMs. For a step:

    gemm     Σ over ops (qkv, o, gate_up, down) of t_op(T) · layers + t_lm_head(S)
             piecewise linear in the token count T between measured points
    decode   t_dec(batch, mean context) · layers
             bilinear in (log2 batch, log2 context) over the measured grid
    prefill  t_pre(work) · layers, piecewise linear in log-log over the measured chunks,
             work = Σ new · (past + (new + 1) / 2) query-key pairs
    + the roofline's copies, per-step overhead and swap (no kernel measures those)

Measured times are made monotone first (a running maximum along each axis), so the model
never predicts a shorter step for more work. A term whose inputs fall outside the measured
range falls back to the roofline's estimate of that term, with one logged warning per term.
"""

from __future__ import annotations

import bisect
import csv
import logging
import math
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.errors import KvsimError
from kvsim.latency import PROFILE_COLUMNS, RooflineLatency, StepPlan

if TYPE_CHECKING:
    from kvsim.config import EngineConfig, ModelSpec

log = logging.getLogger(__name__)
LAYER_GEMMS = ("qkv", "o", "gate_up", "down")


def read_profile(path: Path) -> tuple[dict[str, str], list[dict[str, str]]]:
    """Metadata (`# key: value` lines) and rows of a profile CSV; a bad file is a `KvsimError`."""
    meta: dict[str, str] = {}
    lines = []
    try:
        text = path.read_text()
    except OSError as error:
        raise KvsimError(f"profile {path}: cannot read ({error.strerror})") from None
    for line in text.splitlines():
        if line.startswith("#"):
            key, _, value = line[1:].partition(":")
            meta[key.strip()] = value.strip()
        elif line.strip():
            lines.append(line)
    rows = list(csv.DictReader(lines))
    if not rows or tuple(rows[0]) != PROFILE_COLUMNS:
        raise KvsimError(f"profile {path}: expected the columns {','.join(PROFILE_COLUMNS)}")
    return meta, rows


class Interp1D:
    """Monotone piecewise-linear interpolation, optionally in log-log space; None outside the range."""

    def __init__(self, xs: Sequence[float], ys: Sequence[float], log_space: bool = False) -> None:
        points = sorted(zip(xs, ys, strict=True))
        self.log = log_space
        self.xs = [self._t(x) for x, _ in points]
        running, self.ys = 0.0, []
        for _, y in points:
            running = max(running, y)
            self.ys.append(self._t(running))

    def _t(self, v: float) -> float:
        return math.log(v) if self.log else v

    def __call__(self, x: float) -> float | None:
        tx = self._t(x)
        if tx < self.xs[0] - 1e-12 or tx > self.xs[-1] + 1e-12:
            return None
        i = min(max(bisect.bisect_right(self.xs, tx) - 1, 0), len(self.xs) - 2) if len(self.xs) > 1 else 0
        if len(self.xs) == 1:
            y = self.ys[0]
        else:
            x0, x1, y0, y1 = self.xs[i], self.xs[i + 1], self.ys[i], self.ys[i + 1]
            y = y0 + (y1 - y0) * (tx - x0) / (x1 - x0)
        return math.exp(y) if self.log else y


class Interp2D:
    """Bilinear interpolation on a full grid in (log2 a, log2 b), made monotone along both axes."""

    def __init__(self, points: dict[tuple[int, int], float]) -> None:
        self.a = sorted({a for a, _ in points})
        self.b = sorted({b for _, b in points})
        missing = [(a, b) for a in self.a for b in self.b if (a, b) not in points]
        if missing:
            raise KvsimError(f"profile: decode grid is not complete (missing batch, context {missing[0]})")
        grid = [[points[(a, b)] for b in self.b] for a in self.a]
        for i in range(len(self.a)):
            for j in range(len(self.b)):
                grid[i][j] = max(grid[i][j], grid[i - 1][j] if i else 0.0, grid[i][j - 1] if j else 0.0)
        self.grid = grid
        self.la = [math.log2(a) for a in self.a]
        self.lb = [math.log2(b) for b in self.b]

    @staticmethod
    def _cell(axis: list[float], v: float) -> tuple[int, float] | None:
        if v < axis[0] - 1e-12 or v > axis[-1] + 1e-12:
            return None
        if len(axis) == 1:
            return 0, 0.0
        i = min(max(bisect.bisect_right(axis, v) - 1, 0), len(axis) - 2)
        return i, min(max((v - axis[i]) / (axis[i + 1] - axis[i]), 0.0), 1.0)

    def __call__(self, a: float, b: float) -> float | None:
        ca, cb = self._cell(self.la, math.log2(a)), self._cell(self.lb, math.log2(b))
        if ca is None or cb is None:
            return None
        (i, fa), (j, fb) = ca, cb
        g = self.grid
        i1 = min(i + 1, len(self.a) - 1)
        j1 = min(j + 1, len(self.b) - 1)
        top = g[i][j] * (1 - fb) + g[i][j1] * fb
        bottom = g[i1][j] * (1 - fb) + g[i1][j1] * fb
        return top * (1 - fa) + bottom * fa


class CalibratedLatency:
    """Step time from a measured profile, with the roofline for what the profile does not cover."""

    def __init__(self, rows: list[dict[str, str]], meta: dict[str, str], model: ModelSpec,
                 engine: EngineConfig, roofline: RooflineLatency, name: str) -> None:
        tp = engine.tensor_parallel_size
        self.name = f"calibrated({name}: {meta.get('gpu', '?')})"
        self.roofline = roofline
        self.num_layers = model.num_layers
        shape = {"block_size": str(engine.block_size), "num_heads": str(max(1, model.num_attention_heads // tp)),
                 "num_kv_heads": str(max(1, model.num_kv_heads // tp)), "head_dim": str(model.head_dim)}
        attention = [r for r in rows if r["kind"] in ("decode", "prefill")
                     and all(r[k] == v for k, v in shape.items())]
        decode = {(int(r["batch"]), int(r["context_len"])): float(r["time_s"]) for r in attention
                  if r["kind"] == "decode"}
        prefill = [r for r in attention if r["kind"] == "prefill"]
        if not decode or not prefill:
            raise KvsimError(f"profile {name}: no attention rows for {shape}; calibrate with this model and block size")
        self.decode = Interp2D(decode)
        work = [_prefill_work(int(r["query_len"]), int(r["context_len"])) for r in prefill]
        self.prefill = Interp1D(work, [float(r["time_s"]) for r in prefill], log_space=True)
        self.gemms = {}
        for op in (*LAYER_GEMMS, "lm_head"):
            op_rows = [r for r in rows if r["kind"] == "gemm" and r["op"] == op]
            if not op_rows:
                raise KvsimError(f"profile {name}: no gemm rows for op {op}")
            self.gemms[op] = Interp1D([int(r["num_tokens"]) for r in op_rows], [float(r["time_s"]) for r in op_rows])
        self._warned: set[str] = set()

    @classmethod
    def from_csv(cls, path: Path, model: ModelSpec, engine: EngineConfig,
                 roofline: RooflineLatency) -> CalibratedLatency:
        meta, rows = read_profile(path)
        return cls(rows, meta, model, engine, roofline, path.stem)

    def _fallback(self, term: str, detail: str) -> None:
        if term not in self._warned:
            self._warned.add(term)
            log.warning("calibrated latency: %s outside the profile (%s); using the roofline for it", term, detail)

    def gemm_s(self, num_tokens: int, num_sampled: int) -> float:
        layer = [self.gemms[op](num_tokens) for op in LAYER_GEMMS]
        head = self.gemms["lm_head"](num_sampled) if num_sampled else 0.0
        if any(t is None for t in layer) or head is None:
            self._fallback("gemm", f"{num_tokens} tokens, {num_sampled} sampled")
            return self.roofline.gemm_s(num_tokens, num_sampled)
        return sum(layer) * self.num_layers + head  # type: ignore[arg-type]

    def decode_s(self, num_decode_seqs: int, sum_decode_context: int) -> float:
        if not num_decode_seqs:
            return 0.0
        t = self.decode(num_decode_seqs, sum_decode_context / num_decode_seqs)
        if t is None:
            self._fallback("decode attention", f"batch {num_decode_seqs}, mean context "
                                               f"{sum_decode_context / num_decode_seqs:.0f}")
            return self.roofline.decode_s(sum_decode_context)
        return t * self.num_layers

    def prefill_s(self, prefill_work: float, prefill_context: int) -> float:
        if prefill_work <= 0:
            return 0.0
        t = self.prefill(prefill_work)
        if t is None:
            self._fallback("prefill attention", f"work {prefill_work:.3g} query-key pairs")
            return self.roofline.prefill_s(prefill_work, prefill_context)
        return t * self.num_layers

    def step_time(self, plan: StepPlan) -> float:
        compute = 0.0
        if plan.num_tokens:
            decode_ctx = plan.sum_decode_context_tokens
            compute = (self.gemm_s(plan.num_tokens, plan.num_sampled)
                       + self.decode_s(plan.num_decode_seqs, decode_ctx)
                       + self.prefill_s(plan.attention_work - decode_ctx, plan.sum_context_tokens - decode_ctx)
                       + self.roofline.fixed_s(plan))
        return self.roofline.total_s(compute, plan)


def _prefill_work(query_len: int, context_len: int) -> float:
    """Query-key pairs of one causal chunk of `query_len` new tokens ending at `context_len`."""
    past = context_len - query_len
    return query_len * (past + (query_len + 1) / 2)

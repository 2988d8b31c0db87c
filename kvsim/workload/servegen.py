"""ServeGen's per-client workload model (a folder of `chunk-<client>-trace.csv` rates per 10-minute window
and `chunk-<client>-dataset.json` length distributions per window): requests sampled from it, seeded.
The row-per-request trace formats are `kvsim.workload.traces`'."""

from __future__ import annotations

import ast
import bisect
import csv
import math
from pathlib import Path
from typing import Any

import numpy as np

from kvsim.model.errors import KvsimError, shown
from kvsim.model.units import ascii_int, float_or_inf, read_number
from kvsim.model.yaml_io import load_json
from kvsim.workload.files import open_text
from kvsim.workload.traces import MAX_LENGTH, TraceRecord, bad_row


def read_servegen(path: Path, rng: np.random.Generator, start_s: float, duration_s: float,
                  clients: list[int] | None) -> list[TraceRecord]:
    """Sample requests from ServeGen's per-client model over [start_s, start_s + duration_s).

    Each client's `chunk-i-trace.csv` gives, per 600 s window, a rate and the coefficient of
    variation of gaps; arrivals are drawn from a gamma process with that rate and CV (the
    fitted Gamma/Weibull parameters are not used). Lengths come from `chunk-i-dataset.json`'s
    distributions for the latest window at or before the request, input and output drawn
    with the same uniform number as ServeGen's own sampler does.
    """
    if not path.is_dir():
        raise KvsimError(f"{path}: servegen needs the folder of chunk-*-trace.csv files")
    numbered = (ascii_int(p.name.split("-")[1]) for p in path.glob("chunk-*-trace.csv"))  # `chunk-²-…`: not one
    ids = clients if clients is not None else sorted(client for client in numbered if client is not None)
    if not ids:
        raise KvsimError(f"{path}: servegen needs at least one client (no chunk-<client>-trace.csv here, "
                         f"or clients={shown(clients)})")
    records, drawn = [], 0.0
    for client in ids:
        trace_file, data_file = path / f"chunk-{client}-trace.csv", path / f"chunk-{client}-dataset.json"
        if not trace_file.is_file() or not data_file.is_file():
            raise KvsimError(f"{path}: client {client} has no chunk-{client}-trace.csv / -dataset.json")
        pdfs = _servegen_pdfs(data_file)
        if not pdfs:
            raise KvsimError(f"{data_file}: no window has length distributions")
        windows: list[tuple[float, int]] = []  # (start, line) of the rows read, ascending
        with open_text(trace_file, newline="") as f:
            for line_no, row in enumerate(csv.reader(f), start=1):
                window, rate, cv = _servegen_window(row, trace_file, line_no)
                _refuse_overlap(windows, window, row[0], trace_file, line_no)
                lo, hi = max(window, start_s), min(window + SERVEGEN_WINDOW_S, start_s + duration_s)
                drawn += rate * max(hi - lo, 0.0)
                if drawn > SERVEGEN_MAX_DRAWS:  # each draw is a Python step: a slip of units never ends
                    # a count past an int64's digits as 6e+302, not 303 digits on the one error line
                    about = f"{drawn:,.0f}" if drawn < 2**63 else f"{drawn:.3g}"
                    raise bad_row(trace_file, line_no, f"rate={shown(row[1])}: the clients' rates would draw about "
                                                    f"{about} requests over [start_s, start_s + duration_s), "
                                                    f"more than kvsim samples ({SERVEGEN_MAX_DRAWS:,}); is it "
                                                    "requests per second?")
                if rate <= 0 or hi <= lo:
                    continue
                # a CV of 1e100 (shape 1e-200: gaps of 0) drew without end; 1e200's c² overflowed (a traceback). The
                # draws past the rate's count add up over the windows, as the rate's do (`drawn` holds both)
                before, draws = drawn, gamma_draws_to_cross(rate, cv, hi - lo)
                drawn += draws - rate * (hi - lo)
                if drawn > SERVEGEN_MAX_DRAWS:
                    so_far = f", {drawn:,.3g} with the windows before it" if before > rate * (hi - lo) else ""
                    raise bad_row(trace_file, line_no, f"cv={shown(row[2])}: gaps that vary this much take up to about "
                                                    f"{draws:,.3g} draws to cross a window{so_far}, more than "
                                                    f"kvsim samples ({SERVEGEN_MAX_DRAWS:,})")
                shape = 1.0 / max(cv, 1e-3) ** 2
                scale_s = 1.0 / (rate * shape) if rate * shape > 0 else math.inf  # 1e-320 · 1e-6 underflows
                if scale_s == math.inf:  # mean gaps past any float (a ZeroDivisionError, or NaN gaps that never
                    continue  # crossed the window at a small shape): no arrival here
                t = lo
                while True:
                    t += rng.gamma(shape, scale_s)
                    if t >= hi:
                        break
                    prompt, output = _servegen_lengths(pdfs, t, rng.random())
                    records.append(TraceRecord(t - start_s, prompt, output))
    if not records:
        raise KvsimError(f"{path}: no ServeGen request arrives in [start_s, start_s + duration_s) = "
                         f"[{start_s:g}, {start_s + duration_s:g}) s")
    records.sort(key=lambda r: r.arrival_s or 0.0)
    return records


SERVEGEN_WINDOW_S = 600.0  # each row of a `chunk-<client>-trace.csv`: a 10-minute window


def _refuse_overlap(windows: list[tuple[float, int]], start: float, raw: str, path: Path, line: int) -> None:
    """Add the window starting at `start` (line `line`) to `windows`, unless it overlaps one read before: a
    window given twice (two files pasted together) drew its arrivals twice, twice its rate, without a word."""
    i = bisect.bisect_left(windows, (start, line))
    near = [w for w in windows[max(i - 1, 0):i + 1] if abs(w[0] - start) < SERVEGEN_WINDOW_S]
    if near:
        raise bad_row(path, line, f"window={shown(raw)} overlaps line {near[0][1]}'s window from {near[0][0]:g} s "
                                  f"(each row is a {SERVEGEN_WINDOW_S:g}-s window of its own)")
    windows.insert(i, (start, line))


SERVEGEN_MAX_DRAWS = 10_000_000
"""The most requests a ServeGen model may draw (the whole published DeepSeek-R1 day, every client, is
about 1.4 million): a rate past it is a slip of units, and drawing it would not end."""


def gamma_draws_to_cross(rate: float, cv: float, span_s: float) -> float:
    """About how many gaps of mean 1/`rate` s and CV `cv` (gamma, shape k = 1/cv², scale θ = 1/(rate·k), as
    `read_servegen` draws them) it takes to cross a window of `span_s` from its start (inf where cv² overflows).

    Renewal theory: rate·span + (cv² − 1)/2 over a window long beside θ. Over a shorter one (z = span/θ < 1) at a
    small shape (k < 1e-3: a CV over about 32) fewer: the draws end at the latest at the first gap longer than the
    window, so they are at most 1/P(gap > span) = Γ(k)/Γ(k, z) ≈ 1/(k·E1(z)) (Γ(k) ≈ 1/k, Γ(k, z) → E1(z) as
    k → 0), E1(z) = −γ − ln z + Σ_{n≥1} (−1)^(n+1) z^n / (n·n!). A CV of 5,000 at 1 req/s over 600 s: z = 2.4e-5,
    about 2.5 million draws (the long-window count, 12.5 million, refused it)."""
    long_window = rate * span_s + max(cv * cv - 1.0, 0.0) / 2
    shape = 1.0 / (max(cv, 1e-3) * max(cv, 1e-3))  # cv ** 2 raises an OverflowError past 1e154; this is inf
    z = rate * shape * span_s
    if not (shape < 1e-3 and 0.0 < z < 1.0):
        return long_window
    series = sum((-1.0) ** (n + 1) * z**n / (n * math.factorial(n)) for n in range(1, 25))  # z < 1: converged
    return min(long_window, 1.0 / (shape * (-EULER_GAMMA - math.log(z) + series)))


EULER_GAMMA = 0.5772156649015329  # γ, the Euler–Mascheroni constant


def _servegen_window(row: list[str], path: Path, line: int) -> tuple[float, float, float]:
    """(window start s, rate req/s, CV) of a `chunk-<client>-trace.csv` row (an empty CV is 1, Poisson). Each
    must be a finite number, the rate and CV >= 0: a NaN or infinite one drew arrival gaps that never
    advanced the clock (a run that never ended), a negative rate skipped its window without a word."""
    if len(row) < 3:
        raise bad_row(path, line, f"expected window,rate,cv,... (got {shown(','.join(row))})")
    values = []
    for name, raw, minimum in (("window", row[0], -math.inf), ("rate", row[1], 0.0), ("cv", row[2] or "1", 0.0)):
        try:
            value = read_number(raw, float)
        except ValueError:
            raise bad_row(path, line, f"{name}={shown(raw)} is not a number") from None
        if not math.isfinite(value) or value < minimum:
            bound = "a finite number" if minimum == -math.inf else "a finite number >= 0"
            raise bad_row(path, line, f"{name}={shown(raw)} is not {bound}")
        values.append(value)
    return values[0], values[1], values[2]


def _servegen_pmf(raw: Any, path: Path, window: str, field: str) -> dict[int, float]:
    """One window's `{tokens: probability}` (a Python-dict string, as ServeGen writes it): token counts whole
    numbers >= 1, probabilities finite and >= 0 with a positive sum. A negative weight made the CDF run
    backwards, all-zero weights a NaN one, weights whose sum overflows (two of 1e308) a NaN past the first length
    (never drawn), integer weights summing past 2**63 a CDF that wrapped negative (int64), an integer past a float's
    range an OverflowError traceback, and a length of -100 or 10.7 tokens was drawn as 1 or 10, each without a
    word. The probabilities are returned as floats."""
    where = f"window {window} {field}"
    try:
        pmf = ast.literal_eval(raw)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as error:
        raise KvsimError(f"{path}: {where}={shown(raw)} is not a Python dict of tokens to probabilities "
                         f"({type(error).__name__})") from None
    if not isinstance(pmf, dict):
        raise KvsimError(f"{path}: {where}={shown(raw)} is not a dict of tokens to probabilities")
    probabilities = {}
    for tokens, weight in pmf.items():
        if isinstance(tokens, bool) or not isinstance(tokens, int) or not 1 <= tokens <= MAX_LENGTH:
            raise KvsimError(f"{path}: {where}: {shown(tokens)} tokens is not a whole number of tokens >= 1")
        number = isinstance(weight, (int, float)) and not isinstance(weight, bool)
        probability = float_or_inf(weight) if number else None
        if probability is None or not math.isfinite(probability) or probability < 0:
            raise KvsimError(f"{path}: {where}: {tokens} tokens has probability {shown(weight)}, not a finite "
                             "number >= 0")
        probabilities[tokens] = probability  # a float: an int's CDF was summed in int64, which wraps past 2**63
    total = sum(probabilities.values())
    if probabilities and not total > 0:
        raise KvsimError(f"{path}: {where}: every probability is 0")
    if total == math.inf:  # the CDF's running sum overflowed: inf / inf made NaN of the later lengths' share
        raise KvsimError(f"{path}: {where}: the probabilities sum past the largest float ({shown(raw)})")
    return probabilities


def _servegen_pdfs(path: Path) -> dict[float, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    try:
        with open_text(path) as f:
            raw = load_json(f.read())
        if not isinstance(raw, dict):
            raise TypeError("expected a JSON object of windows")
        out = {}
        for window, fields in raw.items():
            inputs = _servegen_pmf(fields["input_tokens"], path, window, "input_tokens")
            outputs = _servegen_pmf(fields["output_tokens"], path, window, "output_tokens")
            if not inputs or not outputs:
                continue  # a window with no recorded requests
            in_vals = np.array(sorted(inputs))
            out_vals = np.array(sorted(outputs))
            in_cdf = np.cumsum([inputs[v] for v in in_vals])
            out_cdf = np.cumsum([outputs[v] for v in out_vals])
            try:
                start = read_number(window, float)  # not `1_0`, which float() read as 10
            except ValueError:
                start = math.nan
            if not math.isfinite(start):
                raise KvsimError(f"{path}: window {window!r} is not a finite start time (s)")
            if start in out:  # `0` and `0.0`: the later one's lengths replaced the earlier's without a word
                raise KvsimError(f"{path}: window {window!r} starts at {start:g} s, as an earlier window does")
            out[start] = (in_vals, in_cdf / in_cdf[-1], out_vals, out_cdf / out_cdf[-1])
        return out
    except KvsimError:
        raise
    except (ValueError, KeyError, SyntaxError, TypeError, AttributeError, IndexError) as error:
        raise KvsimError(f"{path}: malformed ServeGen dataset ({error})") from None


def _servegen_lengths(pdfs, t: float, u: float) -> tuple[int, int]:
    window = max((w for w in pdfs if w <= t), default=min(pdfs))
    in_vals, in_cdf, out_vals, out_cdf = pdfs[window]
    prompt = int(in_vals[min(np.searchsorted(in_cdf, u), len(in_vals) - 1)])
    output = int(out_vals[min(np.searchsorted(out_cdf, u), len(out_vals) - 1)])
    return max(1, prompt), max(1, output)

"""Per-request records, columnar: one row appended as each request ends, the `Request` itself let go.

A scheduler hands every request that finishes or is rejected to `RequestRecords.add`; the
request's numbers are copied into typed columns (8 bytes a value, about 100 bytes a request)
and nothing keeps the `Request` (its content, block-hash memo and sequence ids) alive after
that. A run of a million requests therefore holds a million rows of numbers, not a million
objects. `columns()` returns the requests table in arrival (`request_id`) order, whatever
order they ended in (`kvsim.results.metrics.requests_frame` makes it a DataFrame; this module stays
pure Python + numpy, as the scheduler that fills it must). Reject reasons are kept only for
rejected requests (a dict by row).

Columns, with vLLM's metric names where one exists (see `kvsim.results.metrics`):
`request_id, arrival_s, first_scheduled_s, first_token_s, finish_s, ttft_s, tpot_s, e2e_s,
queue_s, prompt_tokens, output_tokens, num_samples, prefix_hit_tokens, num_preemptions,
status, reject_reason`, and `priority` (vLLM's request priority) when some request's is not 0:
a run without priorities writes the table it always wrote.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable

import numpy as np

from kvsim.workload.request import Request, RequestStatus

_STATUSES = tuple(RequestStatus)
_STATUS_CODE = {status: code for code, status in enumerate(_STATUSES)}
_TIMES = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s")
_INTS = (("request_id", "request_id"), ("prompt_tokens", "prompt_len"), ("output_tokens", "output_len"),
         ("num_samples", "num_samples"), ("prefix_hit_tokens", "num_prefix_hit_tokens"),
         ("num_preemptions", "num_preemptions"), ("priority", "priority"))


class RequestRecords:
    """Typed columns, one row per request handed to `add` (in the order they ended)."""

    __slots__ = ("_times", "_ints", "_status", "_reasons")

    def __init__(self) -> None:
        self._times = {name: array("d") for name in _TIMES}
        self._ints = {column: array("q") for column, _ in _INTS}
        self._status = array("b")
        self._reasons: dict[int, str] = {}  # row -> reject reason

    def __len__(self) -> int:
        return len(self._status)

    @property
    def status_codes(self) -> array:
        """The live status column, one code per row: it grows in place, so its `len` (a C call, cheaper
        than `len(records)`) stays the number of rows. A router reads it at every arrival."""
        return self._status

    def add(self, req: Request) -> None:
        """Copy `req`'s numbers into a new row (missing times are NaN)."""
        if req.reject_reason is not None:
            self._reasons[len(self._status)] = req.reject_reason
        for name, column in self._times.items():
            value = getattr(req, name)
            column.append(np.nan if value is None else value)
        for (_, attr), values in zip(_INTS, self._ints.values(), strict=True):
            values.append(getattr(req, attr))
        self._status.append(_STATUS_CODE[req.status])

    def extend(self, requests: Iterable[Request]) -> None:
        for req in requests:
            self.add(req)

    def count(self, status: RequestStatus) -> int:
        """Rows whose request ended with `status`."""
        return self._status.count(_STATUS_CODE[status])

    def columns(self) -> dict[str, np.ndarray]:
        """The requests table's columns, sorted by `request_id` (arrival order); see the module docstring."""
        order = np.argsort(np.frombuffer(self._ints["request_id"], dtype=np.int64), kind="stable") \
            if len(self) else np.zeros(0, dtype=np.int64)

        def column(values: array, dtype: type) -> np.ndarray:
            return np.frombuffer(values, dtype=dtype)[order] if len(values) else np.zeros(0, dtype=dtype)

        arrival, scheduled, first, finish = (column(self._times[name], np.float64) for name in _TIMES)
        ints = {name: column(values, np.int64) for name, values in self._ints.items()}
        output = ints["output_tokens"]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(output > 1, (finish - first) / (output - 1), np.nan)
        codes = column(self._status, np.int8)
        labels = np.array([s.value for s in _STATUSES], dtype=object)
        reasons = np.full(len(self), None, dtype=object)
        for row, reason in self._reasons.items():
            reasons[row] = reason
        table = {
            "request_id": ints["request_id"], "arrival_s": arrival, "first_scheduled_s": scheduled,
            "first_token_s": first, "finish_s": finish, "ttft_s": first - arrival, "tpot_s": tpot,
            "e2e_s": finish - arrival, "queue_s": scheduled - arrival, "prompt_tokens": ints["prompt_tokens"],
            "output_tokens": output, "num_samples": ints["num_samples"],
            "prefix_hit_tokens": ints["prefix_hit_tokens"], "num_preemptions": ints["num_preemptions"],
            "status": labels[codes] if len(codes) else np.zeros(0, dtype=object),
            "reject_reason": reasons[order] if len(order) else np.zeros(0, dtype=object),
        }
        if ints["priority"].any():
            table["priority"] = ints["priority"]
        return table

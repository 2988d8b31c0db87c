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
status, reject_reason`, `priority` (vLLM's request priority) when some request's is not 0, and
`client_queue_s` (a closed-loop client's wait for a free slot before `arrival_s`, the instant it sent the
request; `workload.max_concurrency`) when some request's is not 0, and `length_capped_tokens` (output tokens
asked for beyond max_model_len, which vLLM does not generate: it finishes the request with finish_reason "length")
when some request's is not 0: a run without any of them writes the table it always wrote.
"""

from __future__ import annotations

import struct
from array import array
from collections.abc import Iterable, Sequence

import numpy as np

from kvsim.workload.request import Request, RequestStatus

_STATUSES = tuple(RequestStatus)
_STATUS_CODE = {status: code for code, status in enumerate(_STATUSES)}
_TIMES = ("arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "client_queue_s")
# the integer columns; `add` takes them from the request's request_id, prompt_len, output_len, num_samples,
# num_prefix_hit_tokens, num_preemptions, priority and num_length_capped_tokens, in this order
_INTS = ("request_id", "prompt_tokens", "output_tokens", "num_samples", "prefix_hit_tokens", "num_preemptions",
         "priority", "length_capped_tokens")
# a row's times and integers as the bytes of its typed rows (`array.frombytes`): the same doubles and
# int64s as appending value by value stores, in one call (hot: every request that ends)
_PACK_TIMES = struct.Struct(f"@{len(_TIMES)}d").pack
_PACK_INTS = struct.Struct(f"@{len(_INTS)}q").pack


# written when some value is not 0
OPTIONAL_COLUMNS = {"priority": np.int64, "client_queue_s": np.float64, "length_capped_tokens": np.int64}
_COLUMN_ORDER = ("request_id", "arrival_s", "first_scheduled_s", "first_token_s", "finish_s", "ttft_s", "tpot_s",
                 "e2e_s", "queue_s", "prompt_tokens", "output_tokens", "num_samples", "prefix_hit_tokens",
                 "num_preemptions", "status", "reject_reason", *OPTIONAL_COLUMNS)  # the table's, see the docstring


def concat_request_columns(tables: Sequence[dict[str, np.ndarray]], consume: bool = False) -> dict[str, np.ndarray]:
    """Several engines' request tables (`RequestRecords.columns`, maybe with columns of the caller's after
    them) as one, rows in the given order. An optional column (`OPTIONAL_COLUMNS`) that one engine's table
    has and another's lacks (its requests were all 0) is 0 on the other's rows; the columns keep the order
    one engine writes them in, the caller's after them. `consume`: each column is taken out of its table as
    it is joined (memory: one column more than the tables, not twice as much)."""
    names = list(dict.fromkeys(name for table in tables for name in table))
    record = [n for n in names if n in _COLUMN_ORDER]
    ordered = sorted(record, key=_COLUMN_ORDER.index) + [n for n in names if n not in _COLUMN_ORDER]
    num_rows = [len(table["request_id"]) for table in tables]

    def column(table: dict[str, np.ndarray], name: str, n: int) -> np.ndarray:
        if name in table:
            return table.pop(name) if consume else table[name]
        assert name in OPTIONAL_COLUMNS, f"a request table without its {name!r} column"
        return np.zeros(n, dtype=OPTIONAL_COLUMNS[name])
    return {name: np.concatenate([column(t, name, n) for t, n in zip(tables, num_rows, strict=True)])
            for name in ordered}


class RequestRecords:
    """Typed rows, one per request handed to `add` (in the order they ended): its times (`_TIMES`)
    and integers (`_INTS`) row after row in two flat arrays, made columns by `columns()`."""

    __slots__ = ("_times", "_ints", "_status", "_reasons")

    def __init__(self) -> None:
        self._times = array("d")  # len(_TIMES) values a row
        self._ints = array("q")  # len(_INTS) values a row
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
        arrival, scheduled, first, finish = req.arrival_s, req.first_scheduled_s, req.first_token_s, req.finish_s
        self._times.frombytes(_PACK_TIMES(  # in `_TIMES` order
            np.nan if arrival is None else arrival, np.nan if scheduled is None else scheduled,
            np.nan if first is None else first, np.nan if finish is None else finish, req.client_queue_s))
        self._ints.frombytes(_PACK_INTS(req.request_id, req.prompt_len, req.output_len, req.num_samples,
                                        req.num_prefix_hit_tokens,
                                        req.num_preemptions + req.num_prior_preemptions, req.priority,
                                        req.num_length_capped_tokens))
        self._status.append(_STATUS_CODE[req.status])

    def ends(self, start: int) -> list[tuple[int, bool, float]]:
        """(request_id, finished, finish_s) of each row from `start` on, in the order the requests ended
        (finish_s is NaN for a rejected request): how a client learns which replies have come."""
        width, ints, times = len(_INTS), self._ints, self._times
        finished, finish = _STATUS_CODE[RequestStatus.FINISHED], _TIMES.index("finish_s")
        return [(ints[row * width], self._status[row] == finished, times[row * len(_TIMES) + finish])
                for row in range(start, len(self._status))]

    def add_preemption(self, request_id: int) -> bool:
        """One more preemption on the row of `request_id`, a request that has ended (searched from the
        last row back: it ended lately, `kvsim.sched.async_steps.AsyncSteps.preempt_finishing`); False, nothing
        changed, where these records hold no such row (a data-parallel rank's sibling wrote it)."""
        width, ints = len(_INTS), self._ints
        for row in range(len(self._status) - 1, -1, -1):
            if ints[row * width] == request_id:  # `_INTS`' first: the request id
                ints[row * width + _INTS.index("num_preemptions")] += 1
                return True
        return False

    def extend(self, requests: Iterable[Request]) -> None:
        for req in requests:
            self.add(req)

    def count(self, status: RequestStatus) -> int:
        """Rows whose request ended with `status`."""
        return self._status.count(_STATUS_CODE[status])

    def columns(self) -> dict[str, np.ndarray]:
        """The requests table's columns, sorted by `request_id` (arrival order); see the module docstring."""
        if len(self):
            times = np.frombuffer(self._times, dtype=np.float64).reshape(-1, len(_TIMES))
            int_rows = np.frombuffer(self._ints, dtype=np.int64).reshape(-1, len(_INTS))
        else:
            times, int_rows = np.zeros((0, len(_TIMES))), np.zeros((0, len(_INTS)), dtype=np.int64)
        order = np.argsort(int_rows[:, 0], kind="stable")  # request_id, `_INTS`' first
        arrival, scheduled, first, finish, client_queue = (times[order, i] for i in range(len(_TIMES)))
        ints = {name: int_rows[order, i] for i, name in enumerate(_INTS)}
        output = ints["output_tokens"]
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = np.where(output > 1, (finish - first) / (output - 1), np.nan)
        codes = np.frombuffer(self._status, dtype=np.int8)[order] if len(self) else np.zeros(0, dtype=np.int8)
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
        optional = {"priority": ints["priority"], "client_queue_s": client_queue,
                    "length_capped_tokens": ints["length_capped_tokens"]}
        table.update((name, values) for name, values in optional.items() if values.any())
        return {name: table[name] for name in _COLUMN_ORDER if name in table}

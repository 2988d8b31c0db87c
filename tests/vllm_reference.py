"""What the second implementations of vLLM's v1 scheduler (tests/test_async_reference.py,
tests/test_spec_reference.py, tests/test_priority_reference.py) share: a request's state as vLLM keeps it, on a
bare block count, and how a test hands the same arrivals to kvsim's scheduler. Written from vLLM's code
(vllm/v1/request.py, vllm/v1/core/sched/scheduler.py), not from kvsim's."""

from __future__ import annotations

from dataclasses import dataclass

from kvsim.sched.base import Scheduler
from tests.conftest import make_request


@dataclass(eq=False)
class RefRequest:
    """vLLM's `Request`, as far as a block count needs it: `computed` is `num_computed_tokens`, `placeholders`
    async scheduling's tokens of the step in flight (sampled and drafts, counted computed), `output` the tokens
    its processed outputs appended, `drafts` the drafts proposed for its next verify."""

    rid: int
    arrival_s: float
    priority: int
    prompt: int
    max_tokens: int
    computed: int = 0
    placeholders: int = 0
    output: int = 0
    drafts: int = 0
    blocks: int = 0
    running: bool = False
    finished: bool = False

    @property
    def num_tokens(self) -> int:
        return self.prompt + self.output


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def arrive(sched: Scheduler, rid: int, arrival_s: float, prompt: int, max_tokens: int, priority: int) -> None:
    """Hand kvsim's scheduler the request the reference admits to its waiting queue."""
    req = make_request(rid, arrival_s, prompt, max_tokens)
    req.priority = priority
    assert sched.add(req)

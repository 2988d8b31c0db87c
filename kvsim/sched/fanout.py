"""vLLM v1's parallel sampling: a request with n > 1 samples runs as n independent child requests, and
its one row is written when the last of them finishes. Pure Python.

vLLM v1 fans a request out before its engine core sees it (vllm/v1/engine/llm_engine.py and
async_llm.py `add_request`: "Fan out child requests (for n>1)", one `ParentRequest`,
vllm/v1/engine/parallel_sampling.py): child `i` is a copy of the request with `n = 1`, request id
`f"{i}_{parent}"`, the parent's arrival time and priority, added to the engine core in index order. The
scheduler then knows nothing of the parent: each child is admitted, counted by `max_num_seqs`,
preempted and finished on its own, like any single-sample request. There is no fork and no
copy-on-write: what the children share is what the prefix cache gives them.

    prompt 40 tokens, block size 16, n = 3, prefix caching on (vLLM v1's default)

    child 0   [A ][B ][c0]      computes 40: allocate_slots caches A and B as soon as it allocates them
    child 1   [A ][B ][c1]      hits A, B (32 tokens), computes 8 into a block of its own
    child 2   [A ][B ][c2]      the same: 5 blocks held, 40 + 8 + 8 = 56 prompt tokens computed

* Blocks are cached when they are allocated, not when computed: `KVCacheManager.allocate_slots` calls
  `coordinator.cache_blocks(request, min(computed + new, request.num_tokens))`
  (vllm/v1/core/kv_cache_manager.py), so a child admitted later in the very step that admits child 0
  already hits child 0's full prompt blocks (kvsim's allocators register a block as it fills:
  `PagedAllocator._mark_written`). With a chunked prefill only the chunks allocated so far are there.
* A hit never covers the prompt's last token: `get_computed_blocks` looks up at most
  `request.num_tokens - 1` tokens, so every child computes at least the prompt's last block, and a
  prompt that ends on a block boundary (32 tokens) hits one block less (16 tokens each).
* A partial last block is never shared: only full blocks are hashed, so each child computes the
  prompt's tail into a block of its own.
* With prefix caching off (`get_computed_blocks` returns no hit) every child computes the whole prompt.

The children's content (`sample_content`) makes that happen in kvsim's prefix cache: the prompt's
blocks hash alike for all of them, each child's own output apart.

A child's prompt tail is prefill work beyond the request's one prompt, in the steps' time; it is not
among `kvsim plan`'s recomputed tokens, which count only what a preemption's dropped KV costs
(`Request.num_recomputed`: a child never preempted recomputes nothing). A tail of one token (a prompt of
k·block_size + 1 tokens) is a one-token query after cached ones, which a step counts as a decode, as
vLLM's attention backends split batches by query length.

The parent's row (`SampleGroups.ended`) is the client's view: vLLM's `OutputProcessor` hands a parent's
outputs to its one collector (`ParentRequest.get_outputs`), streamed child by child (`output_kind`
DELTA, as `vllm bench serve` streams) or all at once when the last child finishes (FINAL_ONLY), and
the parent finishes when no child is left. So the row's first token is the first child's first token,
its finish the last child's finish (TTFT, E2E and TPOT follow from those, `output_tokens` still per
sample); `first_scheduled_s` is the first child's; `num_preemptions` sums the children's (the summary's
`num_preemptions` counts each child's); `prefix_hit_tokens` is the first child's hit, the one the
prompt found on arrival (the siblings' hits on it are in the summary's prefix-cache counters, one
query per child, as vLLM counts them). vLLM's own Prometheus latency histograms are per child; the
requests table keeps one row per user request. Steps count children: `num_running` and
`num_waiting` are vLLM's `num_requests_running` / `num_requests_waiting`, which see only children.

Beam search is not fanned out (vLLM v1 runs it outside the engine core; kvsim forks beams as v0 does).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kvsim.workload.content import Content, SegmentContent
from kvsim.workload.request import MAX_SAMPLES, Request, RequestStatus

if TYPE_CHECKING:
    from kvsim.results.records import RequestRecords


def fans_out(req: Request) -> bool:
    """Whether vLLM v1 runs `req` as child requests: parallel sampling (n > 1), not beam search."""
    return req.num_samples > 1 and not req.beam


CHILD_ID_STRIDE = 2**40  # more than any run's request ids: a child id keeps its parent's whole


def child_request_id(parent_id: int, index: int) -> int:
    """Child `index`'s request id: negative, so it never meets a user request's (ids ≥ 0) or its sequence
    ids (the lowest, −2**48 · 256, still an int64), ordered by index first, then by parent: vLLM's
    `f"{index}_{parent}"` ids sort so (for n ≤ 10), so a priority queue's ties (equal priority and arrival)
    go to every parent's child 0 before any child 1, and among parents to the earlier request, as a plain
    request's tie goes to the lower request id."""
    assert 0 <= parent_id < CHILD_ID_STRIDE and 0 <= index < MAX_SAMPLES
    return (index - MAX_SAMPLES) * CHILD_ID_STRIDE + parent_id


def parent_request_id(child_id: int) -> int:
    """The parent of a child request id (`child_request_id`'s inverse, without the index)."""
    assert child_id < 0
    return child_id % CHILD_ID_STRIDE


def request_label(request_id: int) -> str:
    """A request id as a message shows it: a user request's as is, a child's as its parent's and its index
    (`3 (sample 1)`, vLLM's `1_3`), not the negative number only kvsim uses."""
    if request_id >= 0:
        return str(request_id)
    return f"{parent_request_id(request_id)} (sample {request_id // CHILD_ID_STRIDE + MAX_SAMPLES})"


def sample_content(parent: Request, index: int) -> Content | None:
    """Child `index`'s content: the prompt's, so its full blocks hash as its siblings' do, and an output of
    its own (`Content.branch` at the prompt's end). Child 0 keeps the request's; a later one's segment output
    is renamed `(output id, index)`; its token ids are the prompt's, then its child request id for every
    output token (a placeholder no real token id equals: kvsim has no tokens for another sample's output), so
    that a preempted child finds the blocks of its own output again, as vLLM's hashes of its generated tokens
    let it."""
    content = parent.content
    if index == 0 or content is None:
        return content
    if isinstance(content, SegmentContent):
        return content.branch(parent.prompt_len, (content.segments[-1][0], index))
    return content.branch(parent.prompt_len, child_request_id(parent.request_id, index))


def make_child(parent: Request, index: int) -> Request:
    """Child `index` of `parent`: one sample, with the parent's lengths, arrival and priority."""
    return Request(child_request_id(parent.request_id, index), parent.arrival_s, parent.prompt_len,
                   parent.output_len, sample_content(parent, index), priority=parent.priority)


@dataclass(slots=True, eq=False)
class SampleGroup:
    """A parent request and its children, until the last child finishes (vLLM's `ParentRequest`)."""

    parent: Request
    children: list[Request]
    num_finished: int = 0


@dataclass(slots=True)
class SampleGroups:
    """The parents whose children run now, by parent request id; what turns a finished child into its
    parent's row. Owned by the v1 scheduler (`kvsim.sched.v1.V1Scheduler`)."""

    groups: dict[int, SampleGroup] = field(default_factory=dict)
    # the records of the engines sharing these groups (a data-parallel group's ranks: `data_parallel_fan_out`),
    # where a parent's row may be written (by the rank whose child ends last)
    row_records: list[RequestRecords] = field(default_factory=list)

    def fan_out(self, parent: Request) -> list[Request]:
        """The n children of `parent`, in index order (the order vLLM adds them to the engine core)."""
        assert fans_out(parent) and parent.request_id not in self.groups
        children = [make_child(parent, index) for index in range(parent.num_samples)]
        self.groups[parent.request_id] = SampleGroup(parent, children)
        return children

    def ended(self, done: list[Request]) -> list[Request]:
        """The requests whose rows `done` (requests that just finished) completes: a plain request's own, and
        a parent's when its last child is among them (its times and counts set from its children: see the
        module docstring); a child whose siblings still run has no row yet."""
        rows = []
        for req in done:
            if req.request_id >= 0:
                rows.append(req)
                continue
            group = self.groups[parent_request_id(req.request_id)]
            group.num_finished += 1
            if group.num_finished == len(group.children):
                del self.groups[group.parent.request_id]
                rows.append(_finish_parent(group))
        return rows

    def row_id(self, req: Request) -> int | None:
        """The request id of the row that counts `req`'s preemptions now: its own; for a child its parent's
        if that row is written, None while siblings run (the row will sum the children's counts)."""
        if req.request_id >= 0:
            return req.request_id
        parent_id = parent_request_id(req.request_id)
        return None if parent_id in self.groups else parent_id

    def check_invariants(self) -> None:
        """Each group's finished count matches its children's states; raises AssertionError if not."""
        for parent_id, group in self.groups.items():
            assert group.parent.request_id == parent_id and len(group.children) == group.parent.num_samples
            finished = sum(c.status is RequestStatus.FINISHED for c in group.children)
            assert finished == group.num_finished < len(group.children), f"request {parent_id}: children miscounted"


def _finish_parent(group: SampleGroup) -> Request:
    """Set the parent's row from its finished children (module docstring) and return it."""
    parent, children = group.parent, group.children
    first = children[0]
    parent.status = RequestStatus.FINISHED
    parent.first_scheduled_s = min(c.first_scheduled_s for c in children if c.first_scheduled_s is not None)
    parent.first_token_s = min(c.first_token_s for c in children if c.first_token_s is not None)
    parent.finish_s = max(c.finish_s for c in children if c.finish_s is not None)
    parent.num_output_tokens = first.num_output_tokens
    parent.num_preemptions = sum(c.num_preemptions for c in children)
    parent.num_prefix_hit_tokens = first.num_prefix_hit_tokens
    parent.content = None
    return parent

"""What a disaggregated fleet refuses before any engine is built (and, once built, decode instances that a multi-turn
workload needs answering alike), and how its instances step (`kvsim.fleet.disagg`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from kvsim.model.config import load_model
from kvsim.model.errors import KvsimError
from kvsim.workload.scenario import Scenario

if TYPE_CHECKING:
    from kvsim.sched.base import Scheduler


def check_disaggregable(scenario: Scenario, specs: list[Scenario]) -> None:
    """Refuse, before any engine is built, what a disaggregated fleet does not model: an instance whose
    engine is not paged and v1 (vLLM v1's connectors), n > 1 samples or beam search; and what vLLM does not
    run: instances of different models or KV cache dtypes, whose caches are not each other's (NixlConnector
    refuses such a peer at its handshake: the compatibility hash covers the model and the cache dtype), or of block
    sizes its handshake cannot pair (`_check_block_sizes`). Instances on different GPUs are a real deployment and
    pass. Each refusal is one `KvsimError`."""
    assert isinstance(scenario.replicas, list)
    roles = [group.kv_role for group in scenario.replicas for _ in range(group.count)]

    def cache(spec: Scenario) -> tuple[dict[str, Any], str]:  # the model's shapes and the KV dtype it stores
        model = load_model(spec.model)
        return model.model_dump(exclude={"name"}), model.dtype if spec.engine.kv_cache_dtype == "auto" \
            else spec.engine.kv_cache_dtype

    first_model, first_dtype = cache(specs[0])
    for spec, role in zip(specs, roles, strict=True):
        model, kv_dtype = cache(spec)
        differs = ((f"model={spec.model}", f"model={specs[0].model}") if model != first_model else
                   (f"KV cache dtype {kv_dtype}", f"KV cache dtype {first_dtype}") if kv_dtype != first_dtype else None)
        if differs is not None:
            mine, theirs = differs
            raise KvsimError(f"replicas ({spec.name}, {role}): {mine}, but ({specs[0].name}, {roles[0]}) has "
                             f"{theirs}: a disaggregated fleet's instances hand each other their KV cache, so they "
                             "serve one model with one KV cache dtype")
        if spec.engine.allocator != "paged" or spec.engine.scheduler != "v1":
            _refuse_engine(spec, role)
        if spec.engine.async_scheduling:
            raise KvsimError(f"replicas ({spec.name}, {role}): engine.async_scheduling=true: a disaggregated "
                             "instance is modelled stepping synchronously (no async scheduling beside a KV "
                             "connector); leave it unset or false")
    _check_block_sizes(specs, roles, mla=load_model(specs[0].model).mla is not None)
    if scenario.workload.n != 1:
        raise KvsimError(f"workload.n={scenario.workload.n}: vLLM's prefill/decode disaggregation serves one sample "
                         "a request (the prefill instance fans n > 1 out into n requests, but the kv_transfer_params "
                         "it returns name one request's blocks, so the decode instance can pull only those: "
                         "vllm-project/vllm pull request 38900); send n requests of n=1 instead")
    if scenario.workload.beam_width is not None:
        raise KvsimError(f"workload.beam_width={scenario.workload.beam_width}: a disaggregated fleet models "
                         "single-sequence requests only (vLLM v1 runs beam search as requests of its own, "
                         "outside the engine)")


def check_decode_alike(specs: Sequence[Scenario], schedulers: Sequence[Scheduler], decode: Sequence[int]) -> None:
    """KvsimError naming the first decode instance (`decode`: indices into `specs` and `schedulers`, the built
    instances) that may answer a turn otherwise than the first: a multi-turn conversation's next turn (open timing)
    may arrive while a turn prefills, before the decode router picks the instance that answers it, so its reply
    (none if refused, else cut at that instance's max_model_len) must be the same whichever it picks
    (`kvsim.fleet.disagg_pools.Disaggregation.reply_len`). A decode instance (paged, v1, one sample a request)
    refuses a turn whose prompt reaches its max_model_len or whose KV (`Request.kv_len`, under max_model_len) its
    pool cannot hold (`reject_reason`), so two answer alike exactly where their max_model_len and the longest KV
    each pool holds below it (`_longest_kv`) are the same: pools of other sizes or block sizes that both hold
    max_model_len − 1 tokens, or the same number of tokens, refuse the same turns."""
    def limits(d: int) -> tuple[int, int, int]:
        scheduler = schedulers[d]
        return scheduler.limits.max_model_len, scheduler.alloc.num_total_slots, specs[d].engine.block_size

    def answers(d: int) -> tuple[int, int]:
        return schedulers[d].limits.max_model_len, _longest_kv(schedulers[d])

    first = decode[0]
    for d in decode[1:]:
        if answers(d) != answers(first):
            (mine, slots, size), (theirs, first_slots, first_size) = limits(d), limits(first)
            raise KvsimError(
                f"replicas ({specs[d].name}, kv_consumer): max_model_len {mine}, a KV pool of {slots:,} tokens in "
                f"blocks of {size}, but ({specs[first].name}, kv_consumer) has {theirs}, {first_slots:,} and "
                f"{first_size}: with workload.multi_turn a conversation's next turn may arrive while a turn "
                "prefills, before the decode router picks the instance that answers it (or refuses it, or cuts "
                "its reply at its max_model_len), so the decode instances must answer alike: give them one "
                "max_model_len and pools that hold a sequence that long")


def _longest_kv(scheduler: Scheduler) -> int:
    """The most KV slots (`Request.kv_len`, at most max_model_len − 1: a prompt and a reply cut there, less the last
    token) one request may need and still be served by `scheduler`'s pool: `request_slots` grows with the length,
    so every shorter one is held too (bisection)."""
    alloc = scheduler.alloc
    low, high = 0, scheduler.limits.max_model_len - 1
    while low < high:
        mid = (low + high + 1) // 2
        if alloc.request_slots(mid, mid, 1) <= alloc.num_total_slots:
            low = mid
        else:
            high = mid - 1
    return low


def _check_block_sizes(specs: list[Scenario], roles: Sequence[str | None], mla: bool) -> None:
    """Refuse a prefill and a decode instance whose block sizes vLLM's NixlConnector cannot pair: the decode
    instance reads the prefill instance's blocks into its own, and its handshake asserts that its block size is a
    multiple of the prefill's (`TransferTopology.block_size_ratio`), and equal when it reads from more prefill
    ranks than it has (prefill TP above decode TP, without MLA; `_validate_remote_agent_handshake`). Each
    distinct (block size, TP) of a pool is checked once, by its first instance."""
    def shapes(role: str) -> dict[tuple[int, int], Scenario]:
        found: dict[tuple[int, int], Scenario] = {}
        for spec, its_role in zip(specs, roles, strict=True):
            if its_role == role:
                found.setdefault((spec.engine.block_size, spec.engine.tensor_parallel_size), spec)
        return found

    for (p_size, p_tp), producer in shapes("kv_producer").items():
        for (d_size, d_tp), consumer in shapes("kv_consumer").items():
            if d_size % p_size:
                why = (f"decode instance's only when the decode block size is a multiple of the prefill's; give the "
                       f"decode instances a block_size of {p_size} or more")
            elif d_size != p_size and p_tp > d_tp and not mla:
                why = (f"decode instance's from several prefill ranks (tensor_parallel_size {p_tp} there, {d_tp} "
                       "here) only between equal block sizes; give both the same block_size")
            else:
                continue
            raise KvsimError(f"replicas ({consumer.name}, kv_consumer): engine.block_size={d_size}, but "
                             f"({producer.name}, kv_producer) has engine.block_size={p_size}: vLLM's NixlConnector "
                             f"reads a prefill instance's blocks into a {why}")


def synchronous(spec: Scenario) -> Scenario:
    """An instance's scenario with vLLM's default async scheduling off: kvsim models disaggregated
    instances stepping synchronously (`check_disaggregable` refuses `engine.async_scheduling: true`)."""
    return spec.model_copy(update={"engine": spec.engine.model_copy(update={"async_scheduling": False})})


def _refuse_engine(spec: Scenario, role: str | None) -> NoReturn:
    raise KvsimError(f"replicas ({spec.name}, {role}): engine.allocator={spec.engine.allocator}, engine.scheduler="
                     f"{spec.engine.scheduler}: disaggregation needs paged and v1 (vLLM v1's connectors)")

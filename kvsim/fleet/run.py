"""Any scenario to its one result: the single entry point the API (`kvsim.simulate`), the CLI and the
planners call, so none of them tells the kinds of run apart.

    kv_transfer_config set ──▶ kvsim.fleet.disagg.simulate_disagg         (prefill/decode pools)
    autoscaler set         ──▶ kvsim.fleet.autoscaled.simulate_autoscaled (replicas scaled in the run)
    replicas set           ──▶ kvsim.fleet.driver.simulate_fleet          (replicas behind a router)
    otherwise              ──▶ kvsim.engine.simulate.simulate             (one engine, or a DP group)

Each returns a `kvsim.results.run_result.RunResult`. A fleet's modules are imported only when a fleet
runs (a single engine's `kvsim run` never loads them).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvsim.engine.loop import ProgressFn
    from kvsim.model.engine_config import EngineConfig
    from kvsim.results.run_result import RunResult
    from kvsim.results.step_writer import StepsFormat
    from kvsim.workload.scenario import Scenario


def simulate_scenario(scenario: Scenario, check: bool = False, progress: ProgressFn | None = None,
                      out_dir: str | Path | None = None, steps_format: StepsFormat = "auto",
                      memory_limit_bytes: int | None = None) -> RunResult:
    """Simulate `scenario`, whatever its kind (module docstring); `out_dir`: write the run there
    (`RunResult.write`'s files and rules; a single engine and a static fleet stream their steps into it as
    they run). `memory_limit_bytes` refuses up front what cannot fit (every kind of run)."""
    from kvsim.workload.scenario import expect_scenario

    expect_scenario(scenario)
    if scenario.kv_transfer_config is not None or scenario.autoscaler is not None:
        if scenario.kv_transfer_config is not None:
            from kvsim.fleet.disagg import simulate_disagg

            result = simulate_disagg(scenario, check=check, progress=progress, memory_limit_bytes=memory_limit_bytes)
        else:
            from kvsim.fleet.autoscaled import simulate_autoscaled

            result = simulate_autoscaled(scenario, check=check, progress=progress,
                                         memory_limit_bytes=memory_limit_bytes)
        if out_dir is not None:
            result.write(out_dir, steps_format)
        return result
    if scenario.is_fleet:
        from kvsim.fleet.driver import simulate_fleet

        return simulate_fleet(scenario, check=check, progress=progress, out_dir=out_dir, steps_format=steps_format,
                              memory_limit_bytes=memory_limit_bytes)
    from kvsim.engine.simulate import simulate

    return simulate(scenario, check=check, progress=progress, memory_limit_bytes=memory_limit_bytes, out_dir=out_dir,
                    steps_format=steps_format)


def lone_routers(scenario: Scenario) -> list[str]:
    """A line for each router `scenario` sets (another than its default) over one replica, where it has nothing to
    choose: `replicas: 1` (or groups of one replica; an autoscaler's fleet may grow) behind `router`, a
    disaggregated fleet's `prefill_router` over one kv_producer or `decode_router` over one kv_consumer. `kvsim run`
    and `kvsim.simulate` say them; `kvsim plan` does not (its candidates' smallest fleet is often one replica, the
    router set for the larger ones)."""
    from kvsim.workload.fleet_layout import KVTransferConfig, Router

    if scenario.replicas is None:
        return []  # one engine: a router is refused (`Scenario`)
    groups = scenario.replicas if isinstance(scenario.replicas, list) else []
    transfer = scenario.kv_transfer_config
    if transfer is not None:
        pools = [("prefill_router", "kv_producer", "prefill instance"), ("decode_router", "kv_consumer",
                                                                          "decode instance")]
        return [f"kv_transfer_config.{name}.policy={router.policy} routes over one {what} (one replica with "
                f"kv_role={role}): every request goes to it, and the router has nothing to choose"
                for name, role, what in pools
                if (router := getattr(transfer, name)) != KVTransferConfig.model_fields[name].default
                and sum(g.count for g in groups if g.kv_role == role) == 1]
    size = sum(g.count for g in groups) if groups else scenario.replicas
    if size != 1 or scenario.router == Router() or scenario.autoscaler is not None:  # an autoscaler scales out
        return []
    given = "replica groups of one replica in all" if groups else "replicas=1"
    return [f"router.policy={scenario.router.policy} routes over one replica ({given}): every request goes to it, "
            "and the router has nothing to choose"]


def unread_by_setting(scenario: Scenario) -> dict[str, str]:
    """Engine settings no engine of the run reads, by setting (`_engine_unread`: `EngineConfig.unread_settings`,
    given the model each engine serves and the workload), each with its line. In a fleet each replica group's
    engine is asked: a setting a group gives itself is said with the group (key `replicas[1].slab_placement`, line
    `replicas[1]: engine.slab_placement=...`) when that group does not read it; one the scenario's `engine` section
    gives is said once (the first group's line), when no group reads it (a group whose allocator, prefix caching or
    model reads it makes it a setting that runs, not a dropped one). Settings are compared, not lines: two groups
    may say why differently (`swap_space`: "scheduler v1 never swaps", "scheduler static never swaps").
    A fleet's `router.policy=affinity` (a prompt goes where its prefix went) is said too where no replica caches
    prefixes: it routes to caches that hold nothing, and only its load bound spreads the load."""
    if not scenario.is_fleet:
        return _engine_unread(scenario)
    from kvsim.fleet.driver import replica_groups

    groups = scenario.replicas if isinstance(scenario.replicas, list) else None
    own_lines: dict[str, str] = {}
    inherited: list[dict[str, str]] = []  # per group, the settings it takes from the scenario's engine
    replicas = replica_groups(scenario)
    for g, (replica, _count) in enumerate(replicas):
        own = groups[g].engine if groups is not None else {}
        said = _engine_unread(replica)
        own_lines |= {f"replicas[{g}].{field}": f"replicas[{g}]: {line}"
                      for field, line in said.items() if field in own}
        inherited.append({field: line for field, line in said.items() if field not in own})
    common = {field: line for field, line in inherited[0].items() if all(field in other for other in inherited)}
    if scenario.router.policy == "affinity" and not any(_keeps_prefixes(r.engine) for r, _count in replicas):
        common["router.policy"] = ("router.policy=affinity has no prefix to follow: no replica caches prefixes "
                                   "(engine.enable_prefix_caching=false without an engine.kv_offload tier, or a "
                                   "slab allocator), so no routed prompt finds its prefix cached; "
                                   "least_outstanding balances the load")
    return common | own_lines


def _keeps_prefixes(engine: EngineConfig) -> bool:
    """Whether a replica keeps prefixes a later prompt can find: the paged pool's prefix cache, or an offload
    tier, which stores and loads blocks with prefix caching off too."""
    return engine.allocator == "paged" and (engine.enable_prefix_caching or engine.has_offload_tier)


def _engine_unread(scenario: Scenario) -> dict[str, str]:
    """`EngineConfig.unread_settings` of the scenario's engine, given its model, and given its workload a v0
    `swap_space` that no preemption swaps into: with `preemption_mode` unset vLLM v0 swaps only a request of several
    sequences (`_preempt`: recompute when `get_max_num_running_seqs() == 1`), and with `workload.n` 1 and no beam
    search every request is one (the engine alone cannot tell: its default swaps n > 1); and a `gpu_link` that no
    collective crosses: with tensor_parallel_size 1 there is no all-reduce, and an MoE exchanges its experts' tokens
    over the link only across a data-parallel group (`kvsim.model.moe_cost`); `latency.overlap_swap` (swap transfers
    hidden behind the step's compute) where no preemption swaps, for the reasons `swap_space` is; and
    `disable_hybrid_kv_cache_manager` where every KV layer, the drafter's included, is of one kind: the flag
    unifies only a pool of several (`kvsim.model.kv_layout.layer_kinds`, vLLM's `unify_hybrid_kv_cache_specs`),
    so Llama's full attention and Mistral's one sliding window are allocated as they were."""
    from kvsim.model.config import load_model
    from kvsim.model.drafter import draft_model
    from kvsim.model.engine_config import SWAP_SPACE_GIB
    from kvsim.model.kv_layout import layer_kinds

    engine, workload, model = scenario.engine, scenario.workload, load_model(scenario.model)
    unread = engine.unread_settings(model)
    if engine.disable_hybrid_kv_cache_manager:
        hybrid = engine.model_copy(update={"disable_hybrid_kv_cache_manager": False})
        kinds = set(layer_kinds(model, hybrid, draft_model(model, engine.speculative_config)))
        if len(kinds) == 1:
            kind, window = kinds.pop()
            words = {"full": "full attention", "mla": "MLA", "sliding_window": f"a sliding window of {window} tokens",
                     "chunked_local": f"chunked local attention of {window} tokens"}[kind]
            drafter = " and its drafter's" if engine.speculative_config is not None and \
                engine.speculative_config.method != "ngram" else ""
            unread["disable_hybrid_kv_cache_manager"] = (
                f"engine.disable_hybrid_kv_cache_manager=true is unread: every KV layer of {model.name}{drafter} has "
                f"{words}, so the pool has one kind of layer, which the flag leaves as it is (it unifies several)")
    if scenario.gpu_link is not None and engine.tensor_parallel_size == 1 and not (
            model.moe is not None and engine.data_parallel_size > 1):
        sizes = "tensor_parallel_size=1 runs" if model.moe is None else "tensor_ and data_parallel_size=1 run"
        unread["gpu_link"] = f"gpu_link (kind {scenario.gpu_link.kind}) is unread: {sizes} no collective over it"
    never_swaps = engine.never_swaps or (
        "v0 preempts a single sequence by recompute (preemption_mode unset), and workload.n=1 sends no other"
        if engine.preemption_mode is None and workload.n == 1 and workload.beam_width is None else None)
    if never_swaps is not None and engine.swap_space != SWAP_SPACE_GIB:
        unread["swap_space"] = f"engine.swap_space={engine.swap_space:g} is unread: {never_swaps}"
    if never_swaps is not None and scenario.latency.overlap_swap:
        unread["latency.overlap_swap"] = f"latency.overlap_swap=true is unread: {never_swaps}"
    return unread

"""A fleet's layout in a scenario file: replica groups, the router, a disaggregated fleet's KV transfer and
an autoscaler, validated once (`kvsim.workload.scenario.Scenario` holds them; `kvsim.fleet` runs them).

    replicas: [{count: 4}, {count: 2, gpu: h100-80gb, engine: {max_num_seqs: 64}}]
    router: {policy: affinity, load_bound: 1.25}
    kv_transfer_config: {kv_link: rdma}   # with groups of kv_role kv_producer / kv_consumer
    autoscaler: {metric: num_requests_waiting, target: 4, max_replicas: 16}
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from kvsim.model.config import MAX_FIXED_COST_S
from kvsim.model.engine_config import MAX_ENGINES, EngineConfig
from kvsim.model.errors import close_match, from_validation_error
from kvsim.model.spec import Label, Settings

PREFIX_CACHING = "enable_prefix_caching"


class ReplicaGroup(Settings):
    """`count` identical replicas; model, GPU and engine settings default to the scenario's own.

    `engine` lists only the settings that differ from the scenario's `engine` section.
    """

    count: int = Field(default=1, gt=0, le=MAX_ENGINES)
    name: Label | None = None  # a blank one is refused (Label): '' was taken as not given, the scenario's, unnamed
    model: str | None = Field(default=None, min_length=1)
    gpu: str | None = Field(default=None, min_length=1)
    engine: dict[str, Any] = Field(default_factory=dict)
    kv_role: Literal["kv_producer", "kv_consumer"] | None = Field(
        default=None, exclude_if=lambda role: role is None,
        description="vLLM's kv_role in a disaggregated fleet: kv_producer (prefill), kv_consumer (decode)")


def group_speculates(engine: EngineConfig, group: ReplicaGroup) -> bool:
    """Whether `group`'s replicas speculate (draft tokens): its own `speculative_config` where its engine gives one
    (`null`: none), else the scenario `engine`'s, as a group's engine is the scenario's with its settings on top."""
    return group.engine.get("speculative_config", engine.speculative_config) is not None


def settled_groups(data: Any) -> Any:
    """A raw scenario (`Scenario`'s fields) with its replica groups checked and their prefix caching settled.

    A bad group is reported by its own field (`replicas.1.count`, not "not an int", the union's first branch).
    A group whose engine names another scheduler than the scenario's engine, without `enable_prefix_caching`,
    is given it: the scenario engine's where that engine gives it (the user's value wins, as an engine given
    both keeps it), else the group's scheduler's default (vLLM's: on for v1, off for v0; an engine given
    only the scheduler takes it). Written into the group, the value survives a dump (`scenario.yaml`, whose
    engine gives every field): run again, the fleet is the same. A group that allocates slabs, which reads no
    caching, is given only the engine's value: with none, it takes its scheduler's default as a default (a value
    written would be said unread, a setting no one gave), which a dump leaves out (`Scenario.dump_into`).
    Before, the group always took its scheduler's default, so a v0 group dropped the scenario's
    `enable_prefix_caching: true` and a v1 group turned on the caching a v0 scenario's false had turned off.

    A scenario engine given as an `EngineConfig` (Python) gives the fields it was built with (`model_fields_set`:
    a v0 engine's default `enable_prefix_caching: false` is not one)."""
    if not isinstance(data, dict) or not isinstance(data.get("replicas"), list):
        return data
    groups = data["replicas"]
    for i, group in enumerate(groups):
        if isinstance(group, dict):
            try:
                ReplicaGroup(**group)
            except ValidationError as error:
                raise from_validation_error(error, f"replicas.{i}") from None
    engine = data.get("engine", {})
    if isinstance(engine, EngineConfig):
        engine = engine.model_dump(include=engine.model_fields_set)
    if not isinstance(engine, dict):
        return data  # refused as the engine's own field
    scheduler = engine.get("scheduler", EngineConfig.model_fields["scheduler"].default)
    settled = []
    for group in groups:
        fields = group.model_dump(exclude_unset=True) if isinstance(group, ReplicaGroup) else group
        own = fields.get("engine") if isinstance(fields, dict) else None
        if isinstance(own, dict) and own.get("scheduler", scheduler) != scheduler and PREFIX_CACHING not in own:
            try:
                value = engine[PREFIX_CACHING] if PREFIX_CACHING in engine else None \
                    if own.get("allocator", engine.get("allocator", "paged")) != "paged" else \
                    EngineConfig.model_validate({"scheduler": own["scheduler"]}).enable_prefix_caching
            except ValidationError:  # no such scheduler: refused naming the group (`kvsim.fleet.driver`)
                value = None
            if value is not None:
                group = {**fields, "engine": {**own, PREFIX_CACHING: value}}
        settled.append(group)
    return {**data, "replicas": settled}


class Router(Settings):
    """How a fleet's router picks a replica for each arriving request (see `kvsim.fleet.router`).

    `affinity` sends a request where the longest prefix of its blocks was last routed (a
    conversation's earlier turns, a shared system prompt), unless that replica's outstanding
    requests exceed both `load_bound` × the fleet's mean (+1) and the least loaded replica's
    by `load_slack` or more: then it goes to the least loaded. So does a request whose match
    covers less than `match_threshold` of its prompt.
    """

    policy: Literal["round_robin", "least_outstanding", "least_kv", "affinity"] = "round_robin"
    load_bound: float = Field(default=1.25, ge=1.0)
    load_slack: int = Field(default=8, ge=0, description="outstanding requests above the least loaded")
    match_threshold: float = Field(default=0.25, ge=0, le=1, description="least prompt fraction to follow")

    @model_validator(mode="after")
    def _knobs_read_by_affinity(self) -> Router:
        """`load_bound`, `load_slack` and `match_threshold` steer the affinity policy only: beside another
        policy (`{policy: round_robin, load_bound: 3}`) one was dropped without a word. The defaults (written in
        every scenario) pass."""
        self.refuse_unread("policy", dict.fromkeys(("load_bound", "load_slack", "match_threshold"), ("affinity",)),
                           "{:g}".format)
        return self


KV_CONNECTORS = ("SharedStorageConnector", "P2pNcclConnector", "LMCacheConnectorV1", "LMCacheMPConnector",
                 "NixlConnector", "MultiConnector", "OffloadingConnector", "DecodeBenchConnector")
"""The connectors vLLM's `KVConnectorFactory` registers by name (vllm/distributed/kv_transfer/kv_connector/
factory.py, `register_connector` calls at vllm-project/vllm a4cd9d0), in its order."""


class KVTransferConfig(Settings):
    """vLLM's `--kv-transfer-config` for a disaggregated fleet (`kvsim.fleet.disagg`): replica groups with
    `kv_role: kv_producer` form the prefill pool, `kv_consumer` the decode pool.

    `kv_link` names a link preset (`kvsim.fleet.kv_transfer.LINK_PRESETS`: nvlink, pcie, rdma);
    `kv_link_bandwidth_bytes_per_s` and `kv_link_latency_s` replace its figures. Each decode instance
    receives over its own link, shared by the transfers into it. `kv_connector` is recorded only; it must be a
    connector vLLM registers (`KV_CONNECTORS`).
    """

    kv_connector: Label = "NixlConnector"  # recorded only; a blank one was recorded as the connector's name
    kv_link: Literal["nvlink", "pcie", "rdma"] = "rdma"
    kv_link_bandwidth_bytes_per_s: float | None = Field(default=None, ge=1)  # see config.py
    kv_link_latency_s: float | None = Field(default=None, ge=0, le=MAX_FIXED_COST_S)
    prefill_router: Router = Router(policy="least_outstanding")
    decode_router: Router = Router(policy="least_outstanding")

    @field_validator("kv_connector")
    @classmethod
    def _registered_connector(cls, name: str) -> str:
        """vLLM refuses a name its registry lacks ("Unsupported connector type") unless `kv_connector_module_path`
        names a module that defines it, a field kvsim does not take: `Bogus` was run as "recorded only"."""
        if name not in KV_CONNECTORS:
            raise ValueError(f"vLLM registers no such connector{close_match(name, list(KV_CONNECTORS))}; "
                             f"known: {', '.join(KV_CONNECTORS)}")
        return name


class AutoscalerConfig(Settings):
    """An autoscaled fleet (`kvsim.fleet.autoscaled`): Kubernetes HPA's rule and names, in snake case
    (`kvsim.fleet.autoscaler` states the rule and takes this policy as it is). `replicas` (an int) is the
    count at the start, clamped to [min_replicas, max_replicas]. `slo_ttft_s` / `slo_tpot_s` only score the
    run (attainment per `slo_window_s` of arrivals), they do not steer it."""

    metric: Literal["num_requests_waiting", "kv_cache_usage_perc"] = "num_requests_waiting"  # vLLM's names
    target: float = Field(default=4.0, gt=0)  # the metric's per-replica target value
    min_replicas: int = Field(default=1, ge=1)
    # at most MAX_ENGINES, as `replicas`; a replica is built when first started, its memory checked up front
    max_replicas: int = Field(default=16, le=MAX_ENGINES)
    tolerance: float = Field(default=0.1, ge=0, lt=1)
    # at least 1 ms: a period as small as 1e-300 s no longer moves the clock forward (t + period == t),
    # so the run would sync forever at one instant; slo_window_s likewise numbers windows in int64
    sync_period_s: float = Field(default=15.0, ge=0.001)
    scale_up_window_s: float = Field(default=0.0, ge=0)
    scale_down_window_s: float = Field(default=300.0, ge=0)
    # the HPA's scaling policies (behavior.scaleUp / scaleDown.policies, selectPolicy Max), its defaults: per
    # `scale_up_period_s` at most the larger of `scale_up_pods` more and `scale_up_percent` % more replicas;
    # per `scale_down_period_s` at most `scale_down_percent` % fewer (100: all)
    scale_up_pods: int = Field(default=4, ge=0)
    scale_up_percent: float = Field(default=100.0, ge=0)
    scale_up_period_s: float = Field(default=15.0, gt=0)
    scale_down_percent: float = Field(default=100.0, ge=0, le=100)
    scale_down_period_s: float = Field(default=15.0, gt=0)
    startup_s: float = Field(default=120.0, ge=0)
    slo_ttft_s: float = Field(default=2.0, gt=0)
    slo_tpot_s: float = Field(default=0.1, gt=0)
    slo_window_s: float = Field(default=300.0, ge=0.001)

    @field_validator("target")
    @classmethod
    def _fraction_target(cls, target: float, info: Any) -> float:
        if info.data.get("metric") == "kv_cache_usage_perc" and target > 1:
            raise ValueError("kv_cache_usage_perc is a fraction in (0, 1]")
        return target

    @field_validator("scale_up_percent")
    @classmethod
    def _can_scale_up(cls, percent: float, info: Any) -> float:
        if percent == 0 and info.data.get("scale_up_pods") == 0:
            raise ValueError("0 with scale_up_pods=0: the policies would never let the fleet grow")
        return percent

    @field_validator("max_replicas")
    @classmethod
    def _can_scale(cls, max_replicas: int, info: Any) -> int:
        min_replicas = info.data.get("min_replicas", 1)
        if max_replicas < min_replicas:
            raise ValueError(f"below min_replicas={min_replicas}")
        if max_replicas == min_replicas:
            raise ValueError(f"equals min_replicas, so the policy can never scale (a static fleet is "
                             f"replicas: {max_replicas} without autoscaler)")
        return max_replicas

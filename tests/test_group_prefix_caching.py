"""A replica group naming another scheduler keeps the scenario's explicit `enable_prefix_caching`.

vLLM's engine takes `--enable-prefix-caching` / `--no-enable-prefix-caching` as given and only fills in a
default when it is not given (`EngineArgs.enable_prefix_caching = None`, set by `_set_default_args_v1`:
on for the v1 engine; V0 left it off). A group that names only another scheduler is an engine given that
scheduler and the scenario's other flags, so the scenario's explicit value is among them.
"""

import pytest

import kvsim
from kvsim.fleet.driver import replica_scenarios
from kvsim.workload.scenario import Scenario, resolve_scenario


def caching(engine, group_engine):
    """(first replica's, second replica's) enable_prefix_caching for a fleet of a plain group and a group with
    `group_engine`, and the same after the scenario is dumped and read back (as its scenario.yaml is run again)."""
    workload = resolve_scenario(None).model_dump(mode="json")["workload"]  # a scenario file, not --set overrides
    scenario = resolve_scenario({"engine": engine, "workload": workload,
                                 "replicas": [{"count": 1}, {"count": 1, "engine": group_engine}]})
    again = resolve_scenario(scenario.model_dump(mode="json"))
    return tuple(tuple(r.engine.enable_prefix_caching for r in replica_scenarios(s)) for s in (scenario, again))


@pytest.mark.parametrize("engine, group_engine, expected", [
    ({"enable_prefix_caching": True}, {"scheduler": "v0"}, (True, True)),  # was (True, False): dropped
    ({"scheduler": "v0", "enable_prefix_caching": False}, {"scheduler": "v1"}, (False, False)),  # was (False, True)
    ({}, {"scheduler": "v0"}, (True, False)),  # nothing given: each scheduler's default
    ({"scheduler": "v0"}, {"scheduler": "v1"}, (False, True)),
    ({"enable_prefix_caching": True}, {"scheduler": "v0", "enable_prefix_caching": False}, (True, False)),  # group's
])
def test_an_explicit_value_wins_over_the_group_scheduler_default_and_survives_a_dump(engine, group_engine, expected):
    assert caching(engine, group_engine) == (expected, expected)


def test_a_python_engine_config_gives_what_it_was_built_with():
    from kvsim.model.engine_config import EngineConfig
    for engine, expected in [(EngineConfig(enable_prefix_caching=True), (True, True)), (EngineConfig(), (True, False))]:
        scenario = Scenario(engine=engine, workload=resolve_scenario(None).workload,
                            replicas=[{"count": 1}, {"count": 1, "engine": {"scheduler": "v0"}}])
        assert tuple(r.engine.enable_prefix_caching for r in replica_scenarios(scenario)) == expected


@pytest.mark.parametrize(("engine", "expected"), [
    ({"scheduler": "v0"}, (False, True)),  # v0's default is no setting given: the v1 group takes v1's
    ({"scheduler": "v0", "enable_prefix_caching": False}, (False, False)),  # given: the v1 group keeps it
])
def test_a_python_v0_engine_config_gives_prefix_caching_only_where_built_with_it(engine, expected):
    """A v0 `EngineConfig`'s default `enable_prefix_caching: false` was in its `model_fields_set` (the validator
    wrote it), so `settled_groups` dropped every v0 engine's false, a value given as well as the default."""
    from kvsim.model.engine_config import EngineConfig

    scenario = Scenario(engine=EngineConfig(**engine), workload=resolve_scenario(None).workload,
                        replicas=[{"count": 1}, {"count": 1, "engine": {"scheduler": "v1"}}])
    assert tuple(r.engine.enable_prefix_caching for r in replica_scenarios(scenario)) == expected


def test_the_v0_group_caches_the_shared_prefix_the_user_asked_it_to():
    # Every prompt starts with one 512-token system prompt: the v0 replica, told to cache, hits it from its second
    # request on (round robin gives it requests 1, 3, 5, ...).
    replicas = [{"count": 1}, {"count": 1, "engine": {"scheduler": "v0"}}]
    summary = kvsim.simulate(None, workload__num_requests=12, engine__enable_prefix_caching=True, replicas=replicas,
                             workload__shared_prefix={"tokens": 512, "fraction": 1.0}).summary
    assert [row["prefix_cache_hit_rate"] > 0 for row in summary["per_replica"]] == [True, True]

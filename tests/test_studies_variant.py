"""Report variants of a hybrid (sliding-window) model: the slab baselines store full KV per layer."""

from kvsim.engine.simulate import simulate
from kvsim.report.studies import variant
from kvsim.workload.scenario import make_scenario


def tiny_gpt_oss():
    return make_scenario({"name": "t", "model": "gpt-oss-20b", "gpu": "h100-80gb",
                          "engine": {"max_model_len": 2048},
                          "workload": {"num_requests": 4, "prompt_len": {"dist": "fixed", "value": 64},
                                       "output_len": {"dist": "fixed", "value": 8}}})


def test_slab_variant_of_a_hybrid_model_runs_with_full_attention_kv():
    slab = variant(tiny_gpt_oss(), "engine.allocator=slab-max")
    assert slab.engine.disable_hybrid_kv_cache_manager
    assert simulate(slab).summary["num_finished"] == 4  # vLLM's check refused this before the fix


def test_paged_variant_keeps_the_hybrid_manager():
    paged = variant(tiny_gpt_oss(), "engine.allocator=paged")
    assert not paged.engine.disable_hybrid_kv_cache_manager
    assert simulate(paged).summary["num_finished"] == 4

"""The vllm.LLM keyword arguments the colocated engine adds to the user's engine_kwargs.vllm (no vLLM needed)."""
from hybridrl.rollout.vllm_engine import llm_extra_kwargs


def test_defaults_turn_off_custom_all_reduce_and_the_all_reduce_fusion_pass():
    kw = llm_extra_kwargs(None, record_routing=False, moe=False, cudagraph_capture_sizes=[8, 1, 8, 64])
    assert kw["disable_custom_all_reduce"] is True
    assert kw["compilation_config"] == {"cudagraph_capture_sizes": [1, 8, 64],
                                        "pass_config": {"fuse_allreduce_rms": False}}
    assert "moe_backend" not in kw and "enable_return_routed_experts" not in kw


def test_the_users_values_win_and_their_other_passes_stay():
    user = {"disable_custom_all_reduce": False,
            "compilation_config": {"max_cudagraph_capture_size": 128,
                                   "pass_config": {"fuse_allreduce_rms": True, "fuse_norm_quant": True}}}
    kw = llm_extra_kwargs(user, record_routing=True, moe=True, cudagraph_capture_sizes=[1, 8])
    assert kw["disable_custom_all_reduce"] is False
    assert kw["compilation_config"] == {"max_cudagraph_capture_size": 128,
                                        "pass_config": {"fuse_allreduce_rms": True, "fuse_norm_quant": True}}
    assert kw["enable_return_routed_experts"] is True and kw["moe_backend"] == "triton"
    assert user["compilation_config"]["pass_config"] == {"fuse_allreduce_rms": True, "fuse_norm_quant": True}


def test_eager_engines_get_no_capture_sizes():
    kw = llm_extra_kwargs({"moe_backend": "flashinfer"}, record_routing=False, moe=True, cudagraph_capture_sizes=None)
    assert kw["compilation_config"] == {"pass_config": {"fuse_allreduce_rms": False}}
    assert kw["moe_backend"] == "flashinfer"


def test_rollout_expert_parallel_asks_vllm_for_whole_experts_per_rank():
    on = llm_extra_kwargs(None, record_routing=False, moe=True, cudagraph_capture_sizes=None, expert_parallel=True)
    off = llm_extra_kwargs(None, record_routing=False, moe=True, cudagraph_capture_sizes=None)
    assert on["enable_expert_parallel"] is True and "enable_expert_parallel" not in off

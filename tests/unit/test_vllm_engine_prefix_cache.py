"""The colocated vLLM engine and its prefix cache across weight syncs (a stand-in records the calls; no vLLM needed)."""


def test_a_weight_sync_drops_the_prefix_cache_only_where_the_kv_cache_stayed_awake():
    """vLLM keys prefix blocks by token ids alone: after new weights, a KV cache that did not sleep
    (rollout.free_cache_engine=false) would serve a repeated prompt's prefix from the old weights."""
    from hybridrl.rollout.vllm_engine import VLLMRolloutEngine

    class LLM:  # records what the engine asks of vllm.LLM
        def __init__(self):
            self.calls = []

        def wake_up(self, tags=None):
            self.calls.append(("wake_up", tuple(tags or ())))

        def sleep(self, level=1):
            self.calls.append(("sleep", level))

        def reset_prefix_cache(self):
            self.calls.append(("reset_prefix_cache",))
            return True

    engine = VLLMRolloutEngine.__new__(VLLMRolloutEngine)
    engine.llm, engine._asleep, engine._kv_awake = LLM(), False, True

    engine.finish_weight_sync()  # awake since it was built: the cache may hold prefixes of the old weights
    engine.wake_up(["weights"])  # free_cache_engine=false: the next push wakes the (awake) weights only
    engine.finish_weight_sync()
    assert [c[0] for c in engine.llm.calls] == ["reset_prefix_cache", "wake_up", "reset_prefix_cache"]
    engine.llm.calls.clear()
    engine.sleep()  # free_cache_engine=true: sleeping drops the cache, so the sync after it has nothing to drop
    engine.wake_up(["weights"])
    engine.finish_weight_sync()
    engine.wake_up(["kv_cache"])
    assert engine.llm.calls == [("sleep", 2), ("wake_up", ("weights",)), ("wake_up", ("kv_cache",))]
    engine.finish_weight_sync()  # awake again: a sync now must drop it
    assert engine.llm.calls[-1] == ("reset_prefix_cache",)

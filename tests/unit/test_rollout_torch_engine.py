"""The built-in torch rollout engine against references computed with the transformers model itself:
greedy = step-by-step argmax of full forwards (no cache); log-probs = teacher-forced log-probs of the
generated sequences under the same processed distribution (fp32, < 1e-5)."""
import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

from hybridrl.config.schema.rollout import RolloutConfig, SamplingConfig
from hybridrl.hybrid.checks import tensor_checksum
from hybridrl.protocol import DataProto
from hybridrl.rollout.base import ROLLOUT_ENGINES, SamplingParams
from hybridrl.rollout.sampling import RowSampler, processed_log_probs, sampling_from_config
from hybridrl.rollout.torch_engine import TorchRolloutEngine, WeightLoadError

VOCAB, EOS, PAD = 96, 1, 0
LENGTHS = (3, 9, 6, 1)  # prompt lengths, left-padded to 9


def llama_config(**kw) -> LlamaConfig:
    base = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=False, eos_token_id=EOS,
                pad_token_id=PAD, initializer_range=0.1)  # wider than default: peaked distributions, so top-p cuts
    base.update(kw)
    return LlamaConfig(**base)


def reference_model(cfg, seed=0):
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()


def engine_for(model, **kw) -> TorchRolloutEngine:
    eng = TorchRolloutEngine(model.config, **kw)
    eng.load_weights(model.state_dict().items())
    eng.finish_weight_sync()
    return eng


def make_prompts(lengths=LENGTHS, seed=1) -> DataProto:
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, width - n:] = torch.randint(2, VOCAB, (n,), generator=g)
        mask[i, width - n:] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               {"uid": [f"p{i}" for i in range(len(lengths))]})


def real_prompt(prompts: DataProto, i: int) -> list[int]:
    return prompts.batch["input_ids"][i][prompts.batch["attention_mask"][i].bool()].tolist()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # tiny matmuls on 2 shared cores: intra-op threads only contend (70x slower seen under load)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def llama():
    return reference_model(llama_config())


@pytest.fixture(scope="module")
def engine(llama):
    return engine_for(llama)


# ------------------------------------------------------------------------------------------ references
def reference_processed(logits: torch.Tensor, s: SamplingParams) -> torch.Tensor:
    """Written apart from the engine's: ascending sort and `cumsum <= 1 - p`, as vLLM does."""
    x = logits.double()
    if s.greedy:
        return torch.log_softmax(x, -1)
    x = x / s.temperature
    if s.top_k > 0:
        kth = x.sort(-1, descending=True).values[..., s.top_k - 1 : s.top_k]
        x = torch.where(x < kth, torch.full_like(x, float("-inf")), x)
    if s.top_p < 1:
        asc, idx = x.sort(-1)
        cum = torch.softmax(asc, -1).cumsum(-1)
        remove = cum <= 1 - s.top_p
        remove[..., -1] = False
        x = x.scatter(-1, idx, asc.masked_fill(remove, float("-inf")))
    return torch.log_softmax(x, -1)


def teacher_forced(model, prompt: list[int], response: list[int], s: SamplingParams) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0]
    steps = logits[len(prompt) - 1 : len(prompt) - 1 + len(response)]
    return reference_processed(steps, s).gather(-1, torch.tensor(response)[:, None])[:, 0]


# ------------------------------------------------------------------------------------------ generation
def test_greedy_equals_stepwise_argmax_of_full_forwards(llama, engine):
    prompts = make_prompts()
    s = SamplingParams(max_tokens=16, do_sample=False, ignore_eos=True)
    out = engine.generate(prompts, s)
    for i in range(len(LENGTHS)):
        seq = real_prompt(prompts, i)
        for _ in range(s.max_tokens):
            with torch.no_grad():
                seq.append(int(llama(torch.tensor([seq])).logits[0, -1].argmax()))
        assert out.batch["responses"][i].tolist() == seq[-s.max_tokens:], f"prompt {i}"
    ref_lp = torch.stack([teacher_forced(llama, real_prompt(prompts, i), out.batch["responses"][i].tolist(), s)
                          for i in range(len(LENGTHS))])
    assert (out.batch["rollout_log_probs"] - ref_lp).abs().max() < 1e-5


@pytest.mark.parametrize("top_k,top_p", [(20, 0.8), (-1, 0.8), (-1, 1.0)])
def test_sampled_log_probs_equal_teacher_forced(llama, engine, top_k, top_p):
    s = SamplingParams(n=4, temperature=0.7, top_k=top_k, top_p=top_p, max_tokens=24, seed=5)
    prompts = make_prompts()
    out = engine.generate(prompts, s)
    worst, cut = 0.0, 0
    for row in range(len(out)):
        length = int(out.batch["response_mask"][row].sum())
        resp = out.batch["responses"][row, :length].tolist()
        ref = teacher_forced(llama, real_prompt(prompts, row // s.n), resp, s)
        assert torch.isfinite(ref).all(), "a sampled token lies outside the top-k/top-p set"
        worst = max(worst, float((out.batch["rollout_log_probs"][row, :length] - ref).abs().max()))
        assert not out.batch["rollout_log_probs"][row, length:].any()
        with torch.no_grad():
            logits = llama(torch.tensor([real_prompt(prompts, row // s.n) + resp])).logits[0]
        cut += int(torch.isinf(reference_processed(logits, s)).sum())
    assert worst < 1e-5, worst
    if top_k > 0 or top_p < 1:
        assert cut > 0  # the filters were exercised
    print(f"max |engine - teacher-forced| log-prob (top_k={top_k}, top_p={top_p}): {worst:.2e}")


def test_n_samples_are_grouped_by_prompt(engine):
    s = SamplingParams(n=4, temperature=1.0, max_tokens=6, seed=0, ignore_eos=True)
    prompts = make_prompts()
    out = engine.generate(prompts, s)
    assert len(out) == len(LENGTHS) * 4
    assert list(out.non_tensor_batch["uid"]) == [f"p{i}" for i in range(len(LENGTHS)) for _ in range(4)]
    assert torch.equal(out.batch["prompts"], prompts.batch["input_ids"].repeat_interleave(4, 0))
    group = out.batch["responses"][:4]
    assert len({tuple(r.tolist()) for r in group}) > 1  # the n samples of a prompt differ


def test_same_seed_same_samples_independent_of_batch(engine):
    s = SamplingParams(n=2, temperature=1.0, max_tokens=8, seed=11)
    prompts = make_prompts()
    a, b = engine.generate(prompts, s), engine.generate(prompts, s)
    assert torch.equal(a.batch["responses"], b.batch["responses"])
    c = engine.generate(prompts, s.with_(seed=12))
    assert not torch.equal(a.batch["responses"], c.batch["responses"])
    first = engine.generate(prompts[:1], s)  # the first prompt alone: same rows, same draws
    assert torch.equal(first.batch["responses"], a.batch["responses"][:2])


class CharTokenizer:
    """decode() only: token t -> '<t>' (stop strings may then span tokens)."""

    eos_token_id = EOS
    pad_token_id = PAD

    def decode(self, tokens, skip_special_tokens=False):
        return "".join(f"<{t}>" for t in tokens)


def test_stops_on_eos_stop_ids_and_stop_strings(llama):
    eng = engine_for(llama, tokenizer=CharTokenizer())
    prompts = make_prompts(lengths=(4,))
    free = eng.generate(prompts, SamplingParams(max_tokens=10, do_sample=False, ignore_eos=True))
    toks = free.batch["responses"][0].tolist()
    k = next(i for i in range(2, 10) if toks[i] not in toks[:i])  # first fresh token after two steps

    def stopped(**kw):
        out = eng.generate(prompts, SamplingParams(max_tokens=10, do_sample=False, **kw))
        n = int(out.batch["response_mask"][0].sum())
        assert out.batch["responses"][0, :n].tolist() == toks[:n]
        assert (out.batch["responses"][0, n:] == PAD).all()
        return n

    assert stopped(stop_token_ids=(toks[k],), ignore_eos=True) == k + 1  # the stop token is kept
    assert stopped(stop=(f"{toks[k - 1]}><{toks[k]}",), ignore_eos=True) == k + 1  # spans two tokens
    eos_engine = engine_for(llama, eos_token_ids=[toks[k]])
    out = eos_engine.generate(prompts, SamplingParams(max_tokens=10, do_sample=False))
    assert int(out.batch["response_mask"][0].sum()) == k + 1
    out = eos_engine.generate(prompts, SamplingParams(max_tokens=10, do_sample=False, ignore_eos=True))
    assert int(out.batch["response_mask"][0].sum()) == 10


def test_stop_strings_need_a_tokenizer(engine):
    with pytest.raises(ValueError, match="needs a tokenizer"):
        engine.generate(make_prompts(), SamplingParams(max_tokens=2, stop=("x",)))


def test_row_sampler_draws_from_the_processed_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]])
    s = SamplingParams(temperature=0.8, top_k=4, seed=3)
    lp = processed_log_probs(logits, s)
    rows = 4000
    sampler = RowSampler(s, rows)
    draws = torch.cat([sampler.draw(lp, torch.arange(rows)[i : i + 1]) for i in range(rows)])
    freq = torch.bincount(draws, minlength=5).double() / rows
    assert freq[3] == 0  # outside the top-4
    assert (freq - lp.exp()[0].double()).abs().max() < 0.03


# ------------------------------------------------------------------------------------------ weights
def test_load_weights_is_strict(llama):
    eng = TorchRolloutEngine(llama.config)
    with pytest.raises(RuntimeError, match="weights not loaded"):
        eng.generate(make_prompts(), SamplingParams(max_tokens=2))
    with pytest.raises(WeightLoadError, match="not a weight of LlamaForCausalLM"):
        eng.load_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(64, 32))])
    with pytest.raises(WeightLoadError, match="has shape"):
        eng.load_weights([("model.norm.weight", torch.zeros(16))])
    state = llama.state_dict()
    eng.load_weights((k, v) for k, v in state.items() if k != "model.norm.weight")
    with pytest.raises(WeightLoadError, match="model.norm.weight"):
        eng.finish_weight_sync()
    eng.load_weights(state.items())
    eng.finish_weight_sync()
    for name, t in state.items():
        assert torch.equal(eng.named_weights()[name], t)
    sums = eng.weight_checksums(list(state))
    assert all(sums[k] == float(tensor_checksum(v)) for k, v in state.items())  # bitwise: fp32 -> fp32


def test_tied_embeddings_take_either_name():
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True, eos_token_id=EOS)
    model = reference_model(cfg)
    eng = TorchRolloutEngine(cfg, pad_token_id=PAD)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    eng.load_weights(state.items())
    eng.finish_weight_sync()  # lm_head is the embedding: nothing missing
    assert eng.named_weights()["lm_head.weight"] is eng.named_weights()["model.embed_tokens.weight"]
    eng.load_weights(model.state_dict().items())  # both names, equal values: fine
    with pytest.raises(WeightLoadError, match="tied"):
        eng.load_weights([("lm_head.weight", torch.zeros(VOCAB, 32))])


def test_sleep_and_wake_guard_the_phase_order(llama):
    eng = engine_for(llama)
    eng.sleep(level=1)
    with pytest.raises(RuntimeError, match="asleep"):
        eng.generate(make_prompts(), SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="wake_up"):
        eng.load_weights(llama.state_dict().items())
    eng.wake_up()
    eng.generate(make_prompts(), SamplingParams(max_tokens=2))  # level 1 keeps the weights
    eng.sleep(level=2)
    eng.wake_up(["weights", "kv_cache"])
    with pytest.raises(RuntimeError, match="weights not loaded"):  # level 2 dropped them
        eng.generate(make_prompts(), SamplingParams(max_tokens=2))


def test_registered_and_config_sampling():
    assert ROLLOUT_ENGINES.get("torch") is TorchRolloutEngine
    cfg = RolloutConfig(prompt_length=8, response_length=5, temperature=0.9, top_p=0.95, top_k=40, n=4, seed=7,
                        val_kwargs=SamplingConfig(temperature=0.0, n=1, do_sample=False))
    train, val = sampling_from_config(cfg), sampling_from_config(cfg, validate=True)
    assert (train.n, train.temperature, train.top_p, train.top_k, train.max_tokens) == (4, 0.9, 0.95, 40, 5)
    assert val.greedy and val.n == 1 and val.max_tokens == 5
    assert sampling_from_config(cfg, step=1).seed != train.seed != sampling_from_config(cfg, replica=1).seed
    eng = TorchRolloutEngine.from_rollout_config(llama_config(), cfg, tokenizer=CharTokenizer())
    assert eng.weight_dtype == torch.float32 and eng.eos_token_ids == (EOS,) and eng.pad_token_id == PAD


@pytest.mark.parametrize("kind", ["qwen3_moe", "qwen2_moe", "mixtral"])
def test_moe_weights_take_their_checkpoint_names_and_land_in_the_fused_experts(kind, tmp_path):
    """transformers fuses each layer's experts into two 3-D parameters; checkpoints (and the actor's export)
    name them per expert. The engine takes the saved file's names and tensors, and then holds the model
    transformers loads from that file; each expert's checksum is that of the tensor it was sent."""
    import transformers
    from safetensors.torch import load_file

    common = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, num_experts_per_tok=2, eos_token_id=EOS, pad_token_id=PAD)
    cfg = {"qwen3_moe": lambda: transformers.Qwen3MoeConfig(num_experts=4, moe_intermediate_size=8, **common),
           "qwen2_moe": lambda: transformers.Qwen2MoeConfig(num_experts=4, moe_intermediate_size=8,
                                                            shared_expert_intermediate_size=12, **common),
           "mixtral": lambda: transformers.MixtralConfig(num_local_experts=4, **common)}[kind]()
    reference_model(cfg).save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    eng = TorchRolloutEngine(cfg)
    assert set(eng.named_weights()) == set(saved)
    eng.load_weights(saved.items())
    eng.finish_weight_sync()
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert all(torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), eng.model.state_dict().values()))
    sums = eng.weight_checksums(list(saved))
    assert all(sums[n] == float(tensor_checksum(t)) for n, t in saved.items())
    out = eng.generate(make_prompts(), SamplingParams(n=1, temperature=0.0, max_tokens=3))
    assert out.batch["responses"].shape == (len(LENGTHS), 3)


def test_recorded_routing_is_the_routing_of_a_full_forward(tmp_path):
    """record_routing: every token the engine ran (prompt and fed-back samples) with the experts a full
    forward of the finished sequences routes it to; -1 outside the attention mask and at each row's last
    token (never fed back)."""
    import transformers

    cfg = transformers.Qwen3MoeConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=24, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                                      num_experts_per_tok=2, moe_intermediate_size=8, eos_token_id=EOS,
                                      pad_token_id=PAD, initializer_range=0.3)
    from hybridrl.rollout.torch_engine import checkpoint_weights

    model = reference_model(cfg)
    eng = TorchRolloutEngine(cfg, record_routing=True)
    eng.load_weights(checkpoint_weights(model, cfg.model_type).items())  # the fused experts by checkpoint name
    out = eng.generate(make_prompts(), SamplingParams(n=2, temperature=1.0, max_tokens=5, seed=3))
    routed = out.batch["routed_experts"]
    ids, mask = out.batch["input_ids"], out.batch["attention_mask"].bool()
    assert routed.shape == (*ids.shape, 2, 2) and routed.dtype == torch.int16
    seen = []
    routers = [m for m in model.modules() if type(m).__name__.endswith("TopKRouter")]
    hooks = [r.register_forward_hook(lambda m, i, o: seen.append(o[2])) for r in routers]
    with torch.no_grad():
        model(input_ids=ids, attention_mask=out.batch["attention_mask"], position_ids=out.batch["position_ids"])
    for h in hooks:
        h.remove()
    full = torch.stack([s.reshape(*ids.shape, -1) for s in seen], dim=2)
    known = (routed >= 0).all(-1).all(-1)
    last = mask.cumsum(-1) == mask.sum(-1, keepdim=True)
    assert torch.equal(known, mask & ~(last & mask))  # all run tokens, not the final one of each row
    assert torch.equal(routed[known].sort(-1).values.long(), full[known].sort(-1).values)

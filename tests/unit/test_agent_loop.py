"""The agent loop: masks, per-turn tokenization, tools that fail, the shared budget, and the loss / KL terms
on a multi-turn batch checked against float64 math written here.

Most tests drive the loop with a scripted engine (a test double that answers each request with the next
scripted assistant text), so that tool calls happen on cue; the last tests run the built-in torch engine
through its per-request path and check its log-probs against teacher-forced transformers forwards."""
import asyncio
import time

import pytest
import torch

from hybridrl.agent import AgentLoop, AgentRollout, BaseInteraction, BaseTool, LoopSettings, ToolSchema
from hybridrl.agent.chat import ChatTurns
from hybridrl.agent.tools.calculator import CalculatorTool
from hybridrl.algos import ActorObjective, PolicyLossParams, apply_kl_penalty, build_kl_controller
from hybridrl.algos.advantages import AdvantageInputs, AdvantageParams, compute_advantage
from hybridrl.data.tokenizer import build_tiny_tokenizer
from hybridrl.protocol import DataProto
from hybridrl.rollout.base import RolloutEngine, SamplingParams, TokenOutput

CALC = ToolSchema("calculator", "arithmetic", {"type": "object", "properties": {"expression": {"type": "string"}}})


def call(expr: str) -> str:
    return '<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>' % expr


class ScriptedEngine(RolloutEngine):
    """Answers request k of each sample (told apart by its prompt) with script[k] + EOS; log-probs -0.01 * (i+1)."""

    def __init__(self, tokenizer, script, delay_s=0.0):
        self.tok, self.script, self.delay_s = tokenizer, script, delay_s
        self.requests: list[tuple[int, int]] = []  # (prompt length, max_tokens)
        self.turn: dict[int, int] = {}

    async def generate_tokens(self, prompt_ids, sampling):
        self.requests.append((len(prompt_ids), sampling.max_tokens))
        k = self.turn.get(0, 0)  # one conversation per engine
        self.turn[0] = k + 1
        await asyncio.sleep(self.delay_s)
        ids = self.tok(self.script[k], add_special_tokens=False)["input_ids"] + [self.tok.eos_token_id]
        finish = "stop" if len(ids) <= sampling.max_tokens else "length"
        ids = ids[: sampling.max_tokens]
        return TokenOutput(tuple(ids), tuple(-0.01 * (i + 1) for i in range(len(ids))), finish)

    def generate(self, prompts, sampling):
        raise NotImplementedError

    def load_weights(self, weights):
        raise NotImplementedError

    def weight_checksums(self, hf_names):
        raise NotImplementedError


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def prompt_batch(tok, texts):
    rows = [tok.apply_chat_template([{"role": "user", "content": t}], add_generation_prompt=True, tokenize=True)
            for t in texts]
    rows = [list(r["input_ids"]) if isinstance(r, dict) or hasattr(r, "keys") else list(r) for r in rows]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, r in enumerate(rows):
        ids[i, width - len(r):] = torch.tensor(r)
        mask[i, width - len(r):] = 1
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
                               {"raw_prompt": [[{"role": "user", "content": t}] for t in texts]})


def agent(tok, tools=None, interactions=None, **settings):
    s = LoopSettings(**{"response_length": 400, "max_assistant_turns": 5, **settings})
    tools = {"calculator": CalculatorTool({}, CALC)} if tools is None else tools
    return AgentRollout(AgentLoop(tok, s, tools, interactions or {}), tok.pad_token_id)


SCRIPT = [call("3*4"), call("12+5"), "The answer is 17"]


def three_turn_rollout(tok, n_prompts=1):
    engine = ScriptedEngine(tok, SCRIPT)
    roll = agent(tok)
    prompts = prompt_batch(tok, ["What is 3*4+5?"])
    out = roll.generate(engine, prompts, SamplingParams(n=1, max_tokens=400, seed=0))
    return out, prompts


def test_three_turns_mask_logprobs_and_whole_conversation_tokenization(tok):
    out, prompts = three_turn_rollout(tok)
    m = out.meta_info["metrics"]
    assert m["agent/turns_per_sample"] == 3 and m["agent/tool_calls_per_sample"] == 2 and m["agent/tool_errors"] == 0
    mask, resp = out.batch["response_mask"][0], out.batch["responses"][0]
    length = int(out.batch["attention_mask"][0, prompts.batch["input_ids"].shape[1]:].sum())
    gen = [tok(t, add_special_tokens=False)["input_ids"] + [tok.eos_token_id] for t in SCRIPT]
    # the template over the whole conversation, tools' answers included, is exactly prompt + response
    conv = [{"role": "user", "content": "What is 3*4+5?"}, {"role": "assistant", "content": SCRIPT[0]},
            {"role": "tool", "content": "12"}, {"role": "assistant", "content": SCRIPT[1]},
            {"role": "tool", "content": "17"}, {"role": "assistant", "content": SCRIPT[2]}]
    text = tok.apply_chat_template(conv, tokenize=False)
    assert text.endswith("<|im_end|>\n")
    whole = tok(text[:-1], add_special_tokens=False)["input_ids"]  # the last turn ends at its stop token
    prompt = prompts.batch["input_ids"][0][prompts.batch["attention_mask"][0].bool()].tolist()
    assert prompt + resp[:length].tolist() == whole
    # mask: 1 on the three generated turns exactly, 0 on the two tool turns between them, 0 on padding
    obs = [len(ChatTurns(tok).appended_ids([{"role": "tool", "content": v}])) for v in ("12", "17")]
    expect = [1] * len(gen[0]) + [0] * obs[0] + [1] * len(gen[1]) + [0] * obs[1] + [1] * len(gen[2])
    assert length == len(expect)
    assert mask[:length].tolist() == expect and mask[length:].sum() == 0
    lp = out.batch["rollout_log_probs"][0]
    want = [-0.01 * (i + 1) for g in gen for i in range(len(g))]
    assert torch.allclose(lp[mask.bool()], torch.tensor(want))
    assert (lp[~mask.bool()] == 0).all()
    assert out.batch["attention_mask"][0, -resp.shape[0]:][:length].all()
    pos = out.batch["position_ids"][0]
    assert (pos[1:] - pos[:-1])[-resp.shape[0]:].eq(1).all()  # positions run on through tool turns


def test_observation_tokens_carry_no_loss_and_no_kl(tok):
    out, _ = three_turn_rollout(tok)
    mask = torch.cat([out.batch["response_mask"]] * 2).double()  # two rows
    attended = torch.cat([out.batch["attention_mask"][:, -mask.shape[1]:]] * 2).bool()
    assert (attended & ~mask.bool()).any()  # observation tokens: attended to, but holes in the mask
    g = torch.Generator().manual_seed(0)
    shape = mask.shape
    old = -torch.rand(shape, generator=g, dtype=torch.float64) * 3
    log_prob = (old + (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5) * 0.1).requires_grad_(True)
    ref = old + (torch.rand(shape, generator=g, dtype=torch.float64) - 0.5) * 0.4
    adv = torch.randn(shape, generator=g, dtype=torch.float64)
    objective = ActorObjective("vanilla", PolicyLossParams(), use_kl_loss=True, kl_loss_type="low_var_kl",
                               kl_loss_coef=0.1)
    inputs = {"response_mask": mask, "old_log_probs": old, "advantages": adv, "ref_log_prob": ref}
    res = objective(log_prob, None, inputs)
    # float64 reference over the generated tokens only (no clip is active: |log ratio| < 0.05)
    on = mask.bool()
    ratio = torch.exp(log_prob.detach() - old)
    pg = (-adv * ratio)[on].sum() / on.sum()
    kl = ref - log_prob.detach()
    kld = (torch.exp(kl) - kl - 1).clamp(-10, 10)
    want = pg + 0.1 * kld[on].sum() / on.sum()
    assert abs(float(res.loss.detach()) - float(want)) < 1e-12
    res.loss.backward()
    assert (log_prob.grad[~on] == 0).all() and (log_prob.grad[on] != 0).all()
    # anything at the observation tokens leaves the objective unchanged
    moved = log_prob.detach().clone()
    moved[~on] += 5.0
    assert float(objective(moved, None, inputs).loss) == float(res.loss.detach())
    # KL in the reward: no penalty on observation tokens; GRPO advantages are 0 there
    scores = torch.zeros(shape, dtype=torch.float64)
    rewards, _ = apply_kl_penalty(scores, old, ref, mask, build_kl_controller("fixed", 0.5, None, None))
    assert (rewards[~on] == 0).all() and (rewards[on] != 0).all()
    scores[0, -1] = 1.0
    a = compute_advantage("grpo", AdvantageInputs(scores, mask, index=["u", "u"]), AdvantageParams())
    assert (a.advantages[~on] == 0).all()


class Raises(BaseTool):
    async def execute(self, instance_id, parameters, **kw):
        raise RuntimeError("tool bug")


class Hangs(BaseTool):
    async def execute(self, instance_id, parameters, **kw):
        await asyncio.sleep(3600)


class Blocks(BaseTool):
    async def execute(self, instance_id, parameters, **kw):
        time.sleep(3)  # blocks its thread: no await to cancel
        return "late", 0.0, {}


def test_tools_that_raise_hang_or_block_become_error_observations(tok):
    tools = {n: cls({}, ToolSchema(n)) for n, cls in (("raises", Raises), ("hangs", Hangs), ("blocks", Blocks))}
    script = ['<tool_call>{"name": "raises", "arguments": {}}</tool_call><tool_call>{"name": "hangs", "arguments": {}}'
              '</tool_call><tool_call>{"name": "blocks", "arguments": {}}</tool_call>',
              '<tool_call>{"name": "nope", "arguments": {}}</tool_call><tool_call>not json</tool_call>', "done"]
    roll = agent(tok, tools, tool_timeout_s=0.5, max_parallel_calls=3, max_tool_response_length=1000,
                 response_length=1000)
    start = time.perf_counter()
    out = roll.generate(ScriptedEngine(tok, script), prompt_batch(tok, ["go"]), SamplingParams(max_tokens=1000, seed=0))
    assert time.perf_counter() - start < 2.5  # the three calls ran concurrently and were cut at 0.5 s
    m = out.meta_info["metrics"]
    assert m["agent/tool_errors"] == 5 and m["agent/tool_timeouts"] == 2 and m["agent/turns_per_sample"] == 3
    text = tok.decode(out.batch["responses"][0], skip_special_tokens=True)
    for piece in ("tool 'raises' failed: RuntimeError: tool bug", "tool 'hangs' did not answer within 0.5s",
                  "tool 'blocks' did not answer", "unknown tool 'nope'", "tool call is not valid JSON"):
        assert piece in text, piece
    assert m["agent/finish_stop_fraction"] == 1.0


def test_turns_share_one_response_budget(tok):
    engine = ScriptedEngine(tok, [call("3*4"), "x" * 500])
    roll = agent(tok, response_length=120)
    out = roll.generate(engine, prompt_batch(tok, ["q"]), SamplingParams(max_tokens=120, seed=0))
    first = len(tok(SCRIPT[0], add_special_tokens=False)["input_ids"]) + 1
    obs = len(ChatTurns(tok).appended_ids([{"role": "tool", "content": "12"}]))
    (p1, m1), (p2, m2) = engine.requests
    assert m1 == 120 and m2 == 120 - first - obs and p2 == p1 + first + obs
    assert int(out.batch["attention_mask"][0, -120:].sum()) == 120  # filled to the budget, not past it
    assert out.meta_info["metrics"]["agent/finish_length_fraction"] == 1.0
    # an observation that would leave no room for another turn is not appended
    roll = agent(tok, response_length=first + obs)
    out = roll.generate(ScriptedEngine(tok, [call("3*4"), "y"]), prompt_batch(tok, ["q"]),
                        SamplingParams(max_tokens=first + obs, seed=0))
    assert int(out.batch["attention_mask"][0, -(first + obs):].sum()) == first
    assert out.meta_info["metrics"]["agent/turns_per_sample"] == 1


def test_max_assistant_turns_and_concurrent_samples(tok):
    engine_script = [call("1+1")] * 10
    roll = agent(tok, max_assistant_turns=2)
    out = roll.generate(ScriptedEngine(tok, engine_script), prompt_batch(tok, ["q"]), SamplingParams(max_tokens=400, seed=0))
    m = out.meta_info["metrics"]
    assert m["agent/turns_per_sample"] == 2 and m["agent/tool_calls_per_sample"] == 1
    assert m["agent/finish_max_assistant_turns_fraction"] == 1.0


class Echo(BaseInteraction):
    async def generate_response(self, instance_id, messages, **kw):
        return False, "ok", 0.5, {}


def test_interaction_turns_and_max_user_turns(tok):
    roll = agent(tok, tools={}, interactions={"echo": Echo({})}, max_user_turns=2)
    out = roll.generate(ScriptedEngine(tok, ["a", "b", "c", "d"]), prompt_batch(tok, ["q"]), SamplingParams(max_tokens=400, seed=0))
    m = out.meta_info["metrics"]
    assert m["agent/turns_per_sample"] == 3 and m["agent/user_turns_per_sample"] == 2
    assert m["agent/finish_max_user_turns_fraction"] == 1.0
    text = tok.decode(out.batch["responses"][0], skip_special_tokens=False)
    assert text.count("<|im_start|>user\nok<|im_end|>") == 2


# ---------------------------------------------------------------------------------------- the torch engine
@pytest.fixture(scope="module")
def tiny_engine(tok):
    from transformers import AutoModelForCausalLM, LlamaConfig

    from hybridrl.rollout.torch_engine import TorchRolloutEngine

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    eng = TorchRolloutEngine(cfg, tokenizer=tok)
    eng.load_weights(model.state_dict().items())
    eng.finish_weight_sync()
    return eng, model


def test_torch_engine_requests_do_not_depend_on_their_batch(tiny_engine, tok):
    eng, _ = tiny_engine
    s = SamplingParams(max_tokens=12, seed=7, ignore_eos=True)
    alone = asyncio.run(eng.generate_tokens([5, 6, 7], s))

    async def together():
        others = [eng.generate_tokens([9] * k, s.with_(seed=k, max_tokens=3 + k)) for k in range(1, 6)]
        return await asyncio.gather(eng.generate_tokens([5, 6, 7], s), *others)

    outs = asyncio.run(together())
    assert outs[0].token_ids == alone.token_ids and len(alone.token_ids) == 12
    assert max(abs(a - b) for a, b in zip(outs[0].log_probs, alone.log_probs)) < 1e-5
    assert [len(o.token_ids) for o in outs[1:]] == [4, 5, 6, 7, 8] and all(o.finish_reason == "length" for o in outs[1:])


def test_torch_engine_multi_turn_logprobs_match_teacher_forcing(tiny_engine, tok):
    eng, model = tiny_engine
    stops = tuple(range(5, len(tok), 3))  # short turns that end with a stop token
    roll = agent(tok, tools={}, interactions={"echo": Echo({})}, max_user_turns=2, response_length=60)
    prompts = prompt_batch(tok, ["hi", "hello there"])
    out = roll.generate(eng, prompts, SamplingParams(n=2, max_tokens=60, seed=3, stop_token_ids=stops))
    assert out.meta_info["metrics"]["agent/user_turns_per_sample"] > 0
    ids, attn = out.batch["input_ids"], out.batch["attention_mask"]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn, position_ids=out.batch["position_ids"]).logits.float()
    r = out.batch["responses"].shape[1]
    lp = torch.log_softmax(logits[:, -r - 1:-1], -1).gather(-1, out.batch["responses"][..., None])[..., 0]
    mask = out.batch["response_mask"].bool()
    assert (~mask & attn[:, -r:].bool()).any()  # there are user turns inside the responses
    assert (out.batch["rollout_log_probs"][mask] - lp[mask]).abs().max() < 1e-4
    assert (out.batch["rollout_log_probs"][~mask] == 0).all()

"""SFT data: which tokens of a multi-turn tool trace are trained, single-turn rows, the batch layout, the
calculator trace generator, and the SFT config's one validation pass.

The expected trained text is written out here by hand (ChatML pieces), never produced by the code under test."""
from __future__ import annotations

import json

import pytest

from hybridrl.data.readers import DataFileError
from hybridrl.data.sft_chat import ChatEncoder
from hybridrl.data.tokenizer import build_tiny_tokenizer
from tests.fixtures.data_helpers import write_rows

CALL = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "37*48"}}}
TOOL = {"type": "function", "function": {"name": "calculator", "description": "Evaluate arithmetic.",
                                         "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                                                        "required": ["expression"]}}}
TRACE = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "37*48="},
         {"role": "assistant", "content": "Let me compute.", "tool_calls": [CALL]},
         {"role": "tool", "content": "1776"}, {"role": "assistant", "content": "1776"}]
HERMES = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37*48"}}\n</tool_call>'

# A template that renders tools and tool_calls itself (as Qwen2.5's does), in a few lines of Jinja.
NATIVE_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t.function.name }};{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}[CALL {{ c.function.name }} {{ c.function.arguments.expression }}]"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def trained_and_untrained(tok, enc):
    ids, mask = enc.input_ids, enc.loss_mask
    assert len(ids) == len(mask)
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    untrained = tok.decode([i for i, m in zip(ids, mask) if not m])
    return trained, untrained, tok.decode(ids)


def test_tool_trace_trains_the_assistant_turns_only_chatml_without_tool_support(tok):
    enc = ChatEncoder(tok).encode(TRACE)
    trained, untrained, text = trained_and_untrained(tok, enc)
    # the template ignores tool_calls: the call is written in hermes format, as the agent loop parses it
    assistant_1 = "Let me compute.\n" + HERMES + "<|im_end|>"
    assistant_2 = "1776<|im_end|>"
    assert trained == assistant_1 + assistant_2
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n37*48=<|im_end|>\n<|im_start|>assistant\n"
                    + assistant_1 + "\n<|im_start|>tool\n1776<|im_end|>\n<|im_start|>assistant\n" + assistant_2 + "\n")
    # system prompt, user turn, tool output, the assistant headers and the "\n" after <|im_end|> are not trained
    assert untrained == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n37*48=<|im_end|>\n<|im_start|>"
                         "assistant\n\n<|im_start|>tool\n1776<|im_end|>\n<|im_start|>assistant\n\n")


def test_tools_go_into_the_system_message_when_the_template_ignores_them(tok):
    from hybridrl.agent.tool_prompt import hermes_tools_text

    enc = ChatEncoder(tok).encode(TRACE[1:], tools=[TOOL])
    trained, untrained, text = trained_and_untrained(tok, enc)
    assert text.startswith("<|im_start|>system\n" + hermes_tools_text([TOOL]) + "<|im_end|>\n<|im_start|>user\n37*48=")
    assert trained == "Let me compute.\n" + HERMES + "<|im_end|>" + "1776<|im_end|>"
    assert "calculator" not in untrained.split("<|im_start|>user")[1]  # the call itself is trained text


def test_a_template_that_renders_tools_and_calls_gets_them_and_its_rendering_is_trained(tok):
    enc = ChatEncoder(tok, chat_template=NATIVE_TEMPLATE).encode(TRACE[1:], tools=[TOOL])
    trained, untrained, text = trained_and_untrained(tok, enc)
    assert text.startswith("<|im_start|>system\nTOOLS:calculator;<|im_end|>\n<|im_start|>user\n37*48=<|im_end|>")
    assert trained == "Let me compute.[CALL calculator 37*48]<|im_end|>1776<|im_end|>"
    assert "<tool_call>" not in text


def test_parquet_roundtrip_nulls_and_string_arguments_are_read_as_the_same_trace(tok, tmp_path):
    from hybridrl.config.loader import load_config
    from hybridrl.config.schema.sft import SFTConfig
    from hybridrl.data.sft_dataset import SFTDataset

    as_string = [dict(m) for m in TRACE]
    as_string[2] = {**TRACE[2], "tool_calls": [{"type": "function", "function": {
        "name": "calculator", "arguments": json.dumps({"expression": "37*48"})}}]}
    paths = [write_rows([{"messages": TRACE}], str(tmp_path / "t.parquet")),  # absent fields come back as None
             write_rows([{"messages": as_string}], str(tmp_path / "t.jsonl"))]  # OpenAI's JSON-string arguments
    cfg = load_config(["data.max_length=400"], schema=SFTConfig).data
    ds = SFTDataset(paths, tok, cfg)
    assert ds.multiturn  # data.multiturn.enable=null: the messages column decides
    assert ds[0] == ds[1] == {"input_ids": ChatEncoder(tok).encode(TRACE).input_ids,
                              "loss_mask": ChatEncoder(tok).encode(TRACE).loss_mask}


def test_single_turn_rows_train_the_response_and_errors_name_row_and_key(tok, tmp_path):
    from hybridrl.config.loader import load_config
    from hybridrl.config.schema.sft import SFTConfig
    from hybridrl.data.sft_dataset import SFTDataset, collate_sft

    path = write_rows([{"question": "3+4=", "answer": "7"}, {"question": "10+1=", "answer": "11"}],
                      str(tmp_path / "qa.jsonl"))
    cfg = load_config(["data.max_length=40"], schema=SFTConfig).data
    ds = SFTDataset([path], tok, cfg)
    trained, _, text = trained_and_untrained(tok, type("E", (), ds[1])())
    assert text == "<|im_start|>user\n10+1=<|im_end|>\n<|im_start|>assistant\n11<|im_end|>\n"
    assert trained == "11<|im_end|>"
    batch = collate_sft([ds[0], ds[1]], tok.pad_token_id)
    n0, n1 = len(ds[0]["input_ids"]), len(ds[1]["input_ids"])
    assert batch.batch["input_ids"].shape == (2, max(n0, n1))
    assert batch.batch["responses"].shape == (2, max(n0, n1) - 1)
    assert batch.batch["response_mask"][0].tolist() == ds[0]["loss_mask"][1:] + [0] * (max(n0, n1) - n0)
    assert batch.batch["attention_mask"].sum(-1).tolist() == [n0, n1]

    assert (n0, n1) == (15, 17)
    short = load_config(["data.max_length=16"], schema=SFTConfig).data
    with pytest.raises(DataFileError, match=r"row 1: 17 tokens .*over data.max_length=16"):
        SFTDataset([path], tok, short)
    cut = SFTDataset([path], tok, load_config(["data.max_length=16", "data.truncation=left"], schema=SFTConfig).data)
    assert cut[1]["input_ids"] == ds[1]["input_ids"][-16:] and cut[0] == ds[0]
    wrong = load_config(["data.prompt_key=prompt"], schema=SFTConfig).data
    with pytest.raises(DataFileError, match="column 'prompt'.*data.prompt_key"):
        SFTDataset([path], tok, wrong)


def test_calculator_steps_of_worked_solutions():
    from hybridrl.data.gen_tool_traces import calculator_steps, check_trace, gsm_symbolic_trace

    cot = ("He works 6 days/week * 2 weeks/month = 12 days/month\n"
           "He earns £195/day * 12 days/month = £2340/month\n"
           "Robert was left with 72*0.5=36 pebbles.\n"
           "She needs 9 skeins per shawl + 4 skeins per hat = 13 skeins.\n"
           "No arithmetic here.\n#### 2340")
    steps = calculator_steps(cot)
    assert [(e, a) for _, e, a, _ in steps] == [("6*2", "12"), ("195*12", "2340"), ("72*0.5", "36"), ("9+4", "13")]
    messages = gsm_symbolic_trace("Q?", cot, "2340", use_tools=True)
    assert check_trace(messages, "2340")
    assert [m["role"] for m in messages] == ["user"] + ["assistant", "tool"] * 4 + ["assistant"]
    assert messages[-1]["content"] == "That is 13 skeins.\n#### 2340"
    bad = [dict(m) for m in messages]
    bad[2] = {"role": "tool", "content": "13"}
    assert not check_trace(bad, "2340")


def test_sft_config_reads_both_verl_spellings_and_names_the_key_to_fix(monkeypatch):
    from hybridrl.config.loader import ConfigError, load_config
    from hybridrl.config.schema.sft import SFTConfig
    from hybridrl.config.sft_validate import validate_sft
    from hybridrl.trainer.main_sft import without_group_choices

    monkeypatch.setenv("WORLD_SIZE", "2")
    base = ["trainer.device=cpu", "trainer.n_gpus_per_node=2", "data.train_batch_size=8"]
    run = validate_sft(load_config(base + ["model.partial_pretrain=/m", "data.multiturn.messages_key=conv",
                                           "data.micro_batch_size_per_gpu=2"], schema=SFTConfig))
    assert run.derived.model_path == "/m" and run.derived.layout.dp == 2
    assert run.derived.batch.mini_batch_per_dp == 4 and run.derived.batch.grad_accum == 2
    assert run.cfg.data.multiturn.messages_key == "conv"
    assert load_config(["data.messages_key=m2"], schema=SFTConfig).data.multiturn.messages_key == "m2"
    with pytest.raises(ConfigError, match=r"data.micro_batch_size_per_gpu=3 does not divide the 4 .*set it to 2"):
        validate_sft(load_config(base + ["model.path=/m", "data.micro_batch_size_per_gpu=3"], schema=SFTConfig))
    with pytest.raises(ConfigError, match="model.path is not set"):
        validate_sft(load_config(base, schema=SFTConfig))
    with pytest.raises(ConfigError, match=r"engine: tp\*pp\*cp = 4\*1\*1 = 4 does not divide the 2 ranks"):
        validate_sft(load_config(base + ["model.path=/m", "engine.tensor_model_parallel_size=4"], schema=SFTConfig))
    vpp = ["model.path=/m", "engine.pipeline_model_parallel_size=2", "engine.virtual_pipeline_model_parallel_size=2",
           "data.micro_batch_size_per_gpu=1"]  # exactly pp micro-batches deadlock (test_megatron_interleaved.py)
    with pytest.raises(ConfigError, match=r"hangs on exactly 2, .* gets 2; raise data.train_batch_size to >= 4"):
        validate_sft(load_config(base + vpp + ["data.train_batch_size=2"], schema=SFTConfig))
    assert validate_sft(load_config(base + vpp + ["data.train_batch_size=4"], schema=SFTConfig)).derived.layout.vpp == 2
    monkeypatch.setenv("WORLD_SIZE", "1")
    with pytest.raises(ConfigError, match="torchrun --nproc_per_node=2"):
        validate_sft(load_config(base + ["model.path=/m"], schema=SFTConfig))
    with pytest.raises(ConfigError, match="unknown key data.prompt_keys; did you mean data.prompt_key"):
        load_config(["data.prompt_keys=q"], schema=SFTConfig)
    assert without_group_choices(["engine=megatron", "optim=megatron", "engine.seed=3"]) == ["engine.seed=3"]
    with pytest.raises(ConfigError, match="engine=fsdp: hybridrl trains with the Megatron engine"):
        without_group_choices(["engine=fsdp"])

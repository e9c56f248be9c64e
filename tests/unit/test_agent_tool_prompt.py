"""Tool schemas in the prompt (data.tool_config_path): a template that renders `tools` gets them, one that ignores
them gets them in the system message in the hermes format the loop parses; prompt lengths count them; the key
follows multi_turn.tool_config_path and validation refuses prompts that declare tools nothing answers."""
import copy
import dataclasses
import json
import logging
import os

import pytest

from hybridrl.agent import load_tools, tool_prompt
from hybridrl.agent.parser import parse_hermes
from hybridrl.agent.tool_prompt import ToolPrompt, hermes_tools_text
from hybridrl.config.loader import CONFIG_DIR, load_config
from hybridrl.config.schema.data import DataConfig
from hybridrl.data import PromptTooLongError, RLHFDataset, build_tiny_tokenizer
from tests.fixtures.data_helpers import verl_row, write_rows

CALC = os.path.join(CONFIG_DIR, "tools", "calculator.yaml")
# a template that writes the tools itself (as Qwen's do), in its own words: the native path must use it as is
TOOLS_TEMPLATE = (
    "{% if tools %}{{ '<|im_start|>system\nTOOLS:' }}{% for t in tools %}{{ t['function']['name'] + ';' }}"
    "{% endfor %}{{ '<|im_end|>\n' }}{% endif %}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


@pytest.fixture(scope="module")
def schema():
    return load_tools(CALC)["calculator"].get_openai_tool_schema()


def dataset(tmp_path, tok, rows, **cfg):
    path = write_rows(rows, str(tmp_path / "d.parquet"))
    cfg.setdefault("max_prompt_length", 2048)
    return RLHFDataset([path], tok, DataConfig(return_full_prompt=True, tool_config_path=CALC, **cfg))


def test_template_that_renders_tools_gets_them(tmp_path, tok, schema):
    native = copy.deepcopy(tok)
    native.chat_template = TOOLS_TEMPLATE
    ds = dataset(tmp_path, native, [verl_row("3+4=")])
    assert ds.tool_prompt.native
    want = "<|im_start|>system\nTOOLS:calculator;<|im_end|>\n<|im_start|>user\n3+4=<|im_end|>\n<|im_start|>assistant\n"
    assert ds[0]["full_prompts"] == want
    assert native.apply_chat_template([{"role": "user", "content": "3+4="}], tools=[schema],
                                      add_generation_prompt=True, tokenize=False) == want


def test_template_that_ignores_tools_gets_them_in_the_system_message(tmp_path, tok, schema, caplog):
    tool_prompt._warned.clear()  # warned once per process: another test may have used the same file
    with caplog.at_level(logging.WARNING, logger="hybridrl.agent.tool_prompt"):
        ds = dataset(tmp_path, tok, [verl_row("3+4="),
                                     {**verl_row("5*6="), "prompt": [{"role": "system", "content": "Be brief."},
                                                                      {"role": "user", "content": "5*6="}]}])
    assert not ds.tool_prompt.native
    assert "does not render `tools`" in caplog.text and "data.tool_config_path=null" in caplog.text
    block = hermes_tools_text([schema])
    assert ds[0]["full_prompts"] == (f"<|im_start|>system\n{block}<|im_end|>\n<|im_start|>user\n3+4=<|im_end|>\n"
                                     "<|im_start|>assistant\n")
    assert ds[1]["full_prompts"].startswith(f"<|im_start|>system\nBe brief.\n\n{block}<|im_end|>\n<|im_start|>user\n5*6=")
    assert json.dumps(schema) in block  # the whole schema, parameters included
    # the format the block teaches is the one the loop's hermes parser reads
    text, calls = parse_hermes('<tool_call>\n{"name": "calculator", "arguments": {"expression": "5*6"}}\n</tool_call>')
    assert calls[0].name == "calculator" and calls[0].arguments == {"expression": "5*6"} and text == ""
    assert "<tool_call>" in block and "</tool_call>" in block and '"arguments"' in block
    # the messages the agent loop keeps for interactions are the data's own
    raw = RLHFDataset([write_rows([verl_row("3+4=")], str(tmp_path / "r.parquet"))], tok,
                      DataConfig(return_raw_chat=True, tool_config_path=CALC, max_prompt_length=2048))[0]["raw_prompt"]
    assert raw == [{"role": "user", "content": "3+4="}]


def test_prompt_lengths_count_the_schema(tmp_path, tok, schema):
    text = ToolPrompt(tok, [schema]).render([{"role": "user", "content": "3+4="}])
    with_tools = len(tok(text, add_special_tokens=False)["input_ids"])
    bare = 4 + 8  # data_helpers.TEMPLATE_OVERHEAD
    assert with_tools > bare + 100
    limit = (with_tools + bare) // 2
    with pytest.raises(PromptTooLongError, match="after the chat template"):
        dataset(tmp_path, tok, [verl_row("3+4=")], max_prompt_length=limit)
    ds = dataset(tmp_path, tok, [verl_row("3+4="), verl_row("1+1=")], max_prompt_length=with_tools,
                 filter_overlong_prompts=True)
    assert len(ds) == 2 and ds[0]["attention_mask"].sum() == with_tools
    assert len(RLHFDataset([write_rows([verl_row("3+4=")], str(tmp_path / "b.parquet"))], tok,
                           DataConfig(max_prompt_length=limit))) == 1  # without tools it fits


def test_directly_built_config_and_null_leave_prompts_alone(tmp_path, tok):
    path = write_rows([verl_row("3+4=")], str(tmp_path / "d.parquet"))
    assert RLHFDataset([path], tok, DataConfig(max_prompt_length=16)).tool_prompt is None  # unresolved link
    assert RLHFDataset([path], tok, DataConfig(max_prompt_length=16, tool_config_path=None)).tool_prompt is None


def test_key_follows_multi_turn_and_validation(tmp_path, capsys):
    from hybridrl.config.cli import load_run

    assert load_config([], config_name="agent_smollm2_calc").data.tool_config_path == "configs/tools/calculator.yaml"
    assert load_config([], config_name="agent_demo").data.tool_config_path is None  # set null there
    assert load_config(["data.tool_config_path=x.yaml"], config_name="agent_demo").data.tool_config_path == "x.yaml"
    base = ["--config-name", "agent_demo", "data.train_files=x.parquet", "actor_rollout_ref.model.path=m"]
    with pytest.raises(SystemExit):
        load_run(base + [f"data.tool_config_path={CALC}", "actor_rollout_ref.rollout.multi_turn.enable=false"])
    assert "multi_turn.enable=false: no tool would answer a call" in capsys.readouterr().err
    other = tmp_path / "other.yaml"
    text = open(CALC).read().replace("name: calculator", "name: abacus")
    other.write_text(text)
    with pytest.raises(SystemExit):
        load_run(base + [f"data.tool_config_path={other}"])
    assert "declares tool(s) ['abacus'] in the prompts" in capsys.readouterr().err
    _, run = load_run(base + [f"data.tool_config_path={CALC}"])
    assert run.cfg.data.tool_config_path == CALC
    assert dataclasses.is_dataclass(run.cfg.data)

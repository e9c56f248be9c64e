"""The shipped tools: the calculator refuses everything but arithmetic (and never calls eval), the Python
sandbox's limits hold with its friendly in-process messages (the kernel's layers: tests/unit/test_sandbox_redteam.py),
tool and interaction files load with errors that name the file and key, and the config validation refuses bad
multi_turn settings."""
import asyncio
import builtins
import os

import pytest

from hybridrl.agent import load_interactions, load_tools
from hybridrl.agent.parser import parse_hermes
from hybridrl.agent.tools.calculator import CalculatorError, evaluate
from hybridrl.agent.tools.python_sandbox import PythonSandboxTool, run_sandboxed
from hybridrl.config.loader import CONFIG_DIR


@pytest.mark.parametrize("expr,value", [("1+2*3", 7), ("-(4-7)**2", -9), ("7//2", 3), ("7/2", 3.5), ("2**-1", 0.5),
                                        ("(1+2)*(3+4)%5", 1), ("+3", 3), ("1.5*4", 6.0)])
def test_calculator_arithmetic(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr,msg", [("__import__('os')", "Call"), ("a+1", "Name"), ("(1).real", "Attribute"),
                                      ("9**9**9", "exponent"), ("2**101", "exponent"), ("10**59*10", "digits"),
                                      ("1/0", "division by zero"), ("'a'*3", "Constant"), ("1<2", "Compare"),
                                      ("1+" * 150 + "1", "limit"), ("(-8)**0.5", "real"), ("1e308*10", "finite")])
def test_calculator_refuses(expr, msg):
    with pytest.raises(CalculatorError, match=msg):
        evaluate(expr)


def test_calculator_never_calls_eval(monkeypatch):
    def no_eval(*a, **k):
        raise AssertionError("eval was called")
    monkeypatch.setattr(builtins, "eval", no_eval)
    assert evaluate("2*(3+4)") == 14


def test_hermes_parser():
    text = 'hi <tool_call>{"name": "c", "arguments": {"x": 1}}</tool_call> and <tool_call>{"name": "d", ' \
           '"arguments": "{\\"y\\": 2}"}</tool_call><tool_call>{bad</tool_call>'
    content, calls = parse_hermes(text)
    assert content == "hi  and"
    assert [(c.name, c.arguments, c.error is None) for c in calls] == [("c", {"x": 1}, True), ("d", {"y": 2}, True),
                                                                        ("", {}, False)]


def sandbox(code, **kw):
    return asyncio.run(run_sandboxed(code, **{"timeout_s": 2.0, "memory_mb": 256, "cpu_seconds": 2, **kw}))


def test_sandbox_runs_code_in_a_fresh_temp_dir():
    r = sandbox("import os\nopen('f.txt', 'w').write('x')\nprint(os.getcwd(), open('f.txt').read())")
    assert not r.error
    cwd, text = r.stdout.split()
    assert text == "x" and os.path.basename(cwd).startswith("hybridrl_py_") and not os.path.exists(cwd)


@pytest.mark.timeout(30)
def test_sandbox_infinite_loop_is_a_timeout_observation():
    r = sandbox("while True:\n    pass", timeout_s=1.0)
    assert r.timed_out and "time limit of 1s" in r.observation(500)


def test_sandbox_memory_bomb_is_an_error():
    r = sandbox("x = bytearray(2_000_000_000)")
    assert r.error and "MemoryError" in r.observation(500)


@pytest.mark.parametrize("code", ["import socket\nsocket.socket().connect(('127.0.0.1', 9))",
                                  "import _socket", "import urllib.request\nurllib.request.urlopen('http://127.0.0.1:9')"])
def test_sandbox_refuses_the_network(code):
    r = sandbox(code)
    assert r.error and "disabled in this sandbox" in r.observation(500), r.observation(500)


@pytest.mark.parametrize("code", ["import os\nos.system('true')", "import subprocess\nsubprocess.run(['true'])",
                                  "import os\nos.fork()"])
def test_sandbox_refuses_processes(code):
    r = sandbox(code)
    assert r.error and "disabled in this sandbox" in r.observation(500), r.observation(500)


def test_sandbox_refuses_writes_outside_its_dir(tmp_path):
    target = tmp_path / "evil.txt"
    r = sandbox(f"open({str(target)!r}, 'w').write('x')")
    assert r.error and "outside the sandbox" in r.observation(500) and not target.exists()


def test_sandbox_refuses_reads_outside_its_dir_unless_listed(tmp_path):
    (tmp_path / "secret.txt").write_text("visible")
    code = f"print(open({str(tmp_path / 'secret.txt')!r}).read())"
    assert "PermissionError" in sandbox(code).observation(500)
    assert sandbox(code, read_paths=(str(tmp_path),)).stdout.strip() == "visible"


def test_python_tool_observation():
    tool = load_tools(os.path.join(CONFIG_DIR, "tools", "python_sandbox.yaml"))["python"]
    assert isinstance(tool, PythonSandboxTool)
    text, _, metrics = asyncio.run(tool.execute("i", {"code": "print(6*7)"}))
    assert text == "42" and metrics["error"] == 0.0


def test_tool_file_errors_name_the_file_and_key(tmp_path):
    bad = tmp_path / "tools.yaml"
    bad.write_text("tools:\n  - class_name: no.such.module.Tool\n    tool_schema: {type: function, function: {name: x}}\n")
    with pytest.raises(ImportError, match=r"tools.yaml: tools\[0\].class_name=.*no.such.module.Tool"):
        load_tools(str(bad))
    with pytest.raises(FileNotFoundError, match="multi_turn.tool_config_path=.*nope.yaml"):
        load_tools(str(tmp_path / "nope.yaml"))
    bad.write_text("tools:\n  - class_name: hybridrl.agent.tools.calculator.CalculatorTool\n    tool_schema: {name: x}\n")
    with pytest.raises(ValueError, match="tool_schema: expected OpenAI function format"):
        load_tools(str(bad))
    bad.write_text("interaction:\n  - name: a\n    class_name: hybridrl.agent.tools.calculator.CalculatorTool\n")
    with pytest.raises(TypeError, match="must subclass hybridrl.agent.interaction.BaseInteraction"):
        load_interactions(str(bad))


def test_validation_refuses_bad_multi_turn_settings(tmp_path, capsys):
    from hybridrl.config.cli import load_run

    bad = tmp_path / "tools.yaml"
    bad.write_text("tools:\n  - class_name: no.such.Tool\n    tool_schema: {type: function, function: {name: x}}\n")
    base = ["--config-name", "agent_demo", "data.train_files=x.parquet", "actor_rollout_ref.model.path=m"]
    with pytest.raises(SystemExit):
        load_run(base + ["actor_rollout_ref.rollout.multi_turn.format=json",
                         "actor_rollout_ref.rollout.multi_turn.tool_response_truncate_side=top",
                         f"actor_rollout_ref.rollout.multi_turn.tool_config_path={bad}",
                         f"actor_rollout_ref.rollout.multi_turn.interaction_config_path={tmp_path / 'none.yaml'}"])
    msg = capsys.readouterr().err
    assert "actor_rollout_ref.rollout.multi_turn.format='json' is not one of hermes" in msg
    assert "tool_response_truncate_side='top'" in msg
    assert f"multi_turn.tool_config_path: ImportError: {bad}: tools[0].class_name=" in msg
    assert "interaction_config_path: FileNotFoundError" in msg and "none.yaml" in msg
    ok = os.path.join(CONFIG_DIR, "tools", "calculator.yaml")
    _, run = load_run(base + [f"actor_rollout_ref.rollout.multi_turn.tool_config_path={ok}"])
    assert run.cfg.actor_rollout_ref.rollout.multi_turn.enable

"""The LLM-as-judge reward against a local OpenAI-compatible stub server (http.server in a thread): the prompt from a
file, parsing, retries after server errors and garbled answers, timeouts, the cache (in memory and on disk), and
failed judgements counted and logged (or raised), never a silent zero."""
from __future__ import annotations

import dataclasses
import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from hybridrl.config.schema.reward import JudgeConfig
from hybridrl.model_rewards.judge import JudgeError, build_judge


class Stub:
    """Answers by prompt content: 'RESPONSE: good' -> '... 9/10', 'bad' -> 2; a script of failures per prompt."""

    def __init__(self):
        self.requests: list[dict] = []
        self.fail: dict[str, list[str]] = {}  # response text -> what to do on its next calls: 500 | garble | sleep
        self.lock = threading.Lock()

    def answer(self, body: dict) -> tuple[int, dict]:
        prompt = body["messages"][0]["content"]
        with self.lock:
            self.requests.append(body)
            key = prompt.rsplit("RESPONSE: ", 1)[-1].split("\n")[0]
            todo = self.fail.get(key, [])
            action = todo.pop(0) if todo else None
        if action == "500":
            return 500, {"error": "overloaded"}
        if action == "garble":
            return 200, {"choices": [{"message": {"content": "I cannot rate this."}}]}
        if action == "sleep":
            threading.Event().wait(1.0)
        score = {"good": 9, "bad": 2}.get(key, 5)
        return 200, {"choices": [{"message": {"content": f"Reasoning... Score: {score}/10"}}]}


@pytest.fixture
def server():
    stub = Stub()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            assert self.path == "/v1/chat/completions", self.path
            assert self.headers["Authorization"] == "Bearer sk-test"
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            code, payload = stub.answer(body)
            data = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield stub, f"http://127.0.0.1:{httpd.server_address[1]}/v1"
    httpd.shutdown()
    httpd.server_close()


def judge_for(tmp_path, url, monkeypatch, context=None, **changes):
    prompt = tmp_path / "judge.txt"
    prompt.write_text("Rate 0-10. {not a placeholder}\nQUESTION: {prompt}\nTRUTH: {ground_truth}\nRESPONSE: {response}\n")
    monkeypatch.setenv("JUDGE_KEY", "sk-test")
    cfg = JudgeConfig(enable=True, backend="endpoint", prompt_path=str(prompt), url=url, model="judge-1",
                      api_key_env="JUDGE_KEY", score_pattern=r"Score:\s*(\d+)", timeout_s=0.5, max_retries=2,
                      retry_backoff_s=0.01, concurrency=4)
    return build_judge(dataclasses.replace(cfg, **changes), **(context or {}))


def test_scores_parse_and_the_prompt_comes_from_the_file(server, tmp_path, monkeypatch):
    stub, url = server
    judge = judge_for(tmp_path, url, monkeypatch)
    scores, metrics = judge(["2+2=", "3+3="], ["good", "bad"], ["4", "6"])
    assert scores == pytest.approx([0.9, 0.2])
    assert metrics["judge/requests"] == 2 and metrics["judge/failed"] == 0 and metrics["judge/cache_hits"] == 0
    sent = sorted(r["messages"][0]["content"] for r in stub.requests)
    assert sent[0] == "Rate 0-10. {not a placeholder}\nQUESTION: 2+2=\nTRUTH: 4\nRESPONSE: good\n"
    assert {r["model"] for r in stub.requests} == {"judge-1"} and stub.requests[0]["max_tokens"] == 64


def test_retries_then_cache(server, tmp_path, monkeypatch):
    stub, url = server
    cache = tmp_path / "cache.jsonl"
    judge = judge_for(tmp_path, url, monkeypatch, cache_path=str(cache))
    stub.fail = {"good": ["500", "garble"], "bad": ["sleep"]}  # recovers on the 3rd / 2nd try (timeout 0.5 s)
    scores, metrics = judge(["q", "q"], ["good", "bad"], [None, None])
    assert scores == pytest.approx([0.9, 0.2])
    assert metrics["judge/failed"] == 0 and metrics["judge/retries"] == 3  # 2 after the first round, 1 after the second
    calls = len(stub.requests)
    scores, metrics = judge(["q"], ["good"], [None])  # the same request again: from the cache, no call
    assert scores == pytest.approx([0.9]) and metrics["judge/cache_hits"] == 1 and len(stub.requests) == calls
    fresh = judge_for(tmp_path, url, monkeypatch, cache_path=str(cache))  # a new run reads the cache file
    assert fresh(["q", "q"], ["good", "bad"], [None, None])[1]["judge/cache_hits"] == 2 and len(stub.requests) == calls


def test_failures_are_counted_and_logged_never_zero(server, tmp_path, monkeypatch, caplog):
    stub, url = server
    judge = judge_for(tmp_path, url, monkeypatch, max_retries=1)
    stub.fail = {"bad": ["500", "500"]}
    with caplog.at_level(logging.WARNING, logger="hybridrl.model_rewards.judge"):
        scores, metrics = judge(["q", "q"], ["good", "bad"], [None, None])
    assert scores[0] == pytest.approx(0.9) and scores[1] is None  # left out, not scored 0
    assert metrics["judge/failed"] == 1
    assert "sample 1" in caplog.text and "HTTP 500" in caplog.text
    strict = judge_for(tmp_path, url, monkeypatch, max_retries=0, on_failure="error")
    stub.fail = {"bad": ["garble"]}
    with pytest.raises(JudgeError, match="sample 1.*no match of score_pattern"):
        strict(["q", "q"], ["good", "bad"], [None, None])


def test_unreachable_endpoint_fails_every_sample(tmp_path, monkeypatch):
    judge = judge_for(tmp_path, "http://127.0.0.1:9/v1", monkeypatch, max_retries=1)
    scores, metrics = judge(["q"], ["good"], [None])
    assert scores == [None] and metrics["judge/failed"] == 1 and metrics["judge/retries"] == 1


def test_engine_backend_judges_with_the_rollout(tmp_path, monkeypatch):
    """The engine backend renders the judge prompt with the policy's chat template and parses what the job's rollout
    generates (here a function that answers '8' for prompts with 'good' in them)."""
    import torch

    from hybridrl.data.tokenizer import build_tiny_tokenizer
    from hybridrl.protocol import DataProto

    tok = build_tiny_tokenizer()
    asked = []

    def generate(batch):
        asked.append(batch)
        texts = [tok.decode(ids[m.bool()].tolist()) for ids, m in zip(batch.batch["input_ids"], batch.batch["attention_mask"])]
        answers = [tok("8" if "good" in t else "1", add_special_tokens=False)["input_ids"] for t in texts]
        return DataProto.from_dict({"responses": torch.tensor(answers), "response_mask": torch.ones(len(answers), 1)})

    judge = judge_for(tmp_path, None, monkeypatch, backend="engine", score_pattern=r"(\d+)",
                      context=dict(tokenizer=tok, generate=generate, max_prompt_length=200))
    scores, metrics = judge(["q", "q"], ["good", "bad"], [None, None])
    assert scores == pytest.approx([0.8, 0.1]) and metrics["judge/failed"] == 0
    assert asked[0].meta_info == {"greedy": True, "validate": True}
    short = judge_for(tmp_path, None, monkeypatch, backend="engine", max_retries=0,
                      context=dict(tokenizer=tok, generate=generate, max_prompt_length=10))
    scores, metrics = short(["q"], ["good"], [None])  # the prompt does not fit the engine: a counted failure
    assert scores == [None] and metrics["judge/failed"] == 1


def test_the_shipped_example_prompt_renders_and_parses():
    import os

    from hybridrl.model_rewards.judge import JudgeTemplate, LLMJudge

    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "rewards", "judge_prompt.txt")
    template = JudgeTemplate.from_file(path)
    text = template.render("2+2?", "4", "4")
    assert "Question:\n2+2?" in text and "Answer to grade:\n4" in text and "{" not in text
    judge = LLMJudge(JudgeConfig(enable=True, prompt_path=path), backend=lambda prompts: [], template=template)
    assert judge.parse("The sum is right.\nScore: 7") == pytest.approx(0.7)

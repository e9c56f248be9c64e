"""The `endpoint` judge backend: an OpenAI-compatible chat completions server (vLLM's `vllm serve`, SGLang, a
hosted API), over HTTP with the standard library.

One POST {url}/chat/completions per prompt, `concurrency` in flight, each with reward_model.judge.timeout_s;
the API key comes from the environment variable reward_model.judge.api_key_env (never from the config). A
failed request (connection refused, timeout, HTTP error, a body without choices[0].message.content) becomes
that prompt's Exception; LLMJudge retries it with backoff and counts what still fails.
"""
from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Sequence

from hybridrl.config.schema.reward import JudgeConfig

from .judge import Answer, register_judge_backend


class EndpointError(RuntimeError):
    """The endpoint refused or garbled one request."""


@register_judge_backend("endpoint")
class EndpointJudge:
    def __init__(self, cfg: JudgeConfig, **_: Any) -> None:
        self.url = str(cfg.url).rstrip("/") + "/chat/completions"
        self.cfg = cfg
        self.headers = {"Content-Type": "application/json"}
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ValueError(f"reward_model.judge.api_key_env={cfg.api_key_env}: that environment variable is not "
                                 "set (or empty) in the trainer's environment")
            self.headers["Authorization"] = f"Bearer {key}"

    def __call__(self, prompts: Sequence[str]) -> list[Answer]:
        if not prompts:
            return []
        with ThreadPoolExecutor(max_workers=min(self.cfg.concurrency, len(prompts))) as pool:
            return list(pool.map(self._one, prompts))

    def _one(self, prompt: str) -> Answer:
        body = json.dumps({"model": self.cfg.model, "messages": [{"role": "user", "content": prompt}],
                           "max_tokens": self.cfg.max_tokens, "temperature": self.cfg.temperature}).encode("utf-8")
        request = urllib.request.Request(self.url, data=body, headers=self.headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as reply:
                payload = json.loads(reply.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            return EndpointError(f"{self.url}: HTTP {e.code} {e.reason}")
        except (urllib.error.URLError, TimeoutError, OSError, ValueError) as e:
            return EndpointError(f"{self.url}: {type(e).__name__}: {getattr(e, 'reason', e)}")
        try:
            content = payload["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            return EndpointError(f"{self.url}: the reply has no choices[0].message.content: {str(payload)[:200]}")
        if not isinstance(content, str):
            return EndpointError(f"{self.url}: choices[0].message.content is {type(content).__name__}, not text")
        return content

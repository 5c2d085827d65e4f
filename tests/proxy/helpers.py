"""Helpers for proxy tests: configs over fake nodes, and a proxy served on loopback."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from proxy import NodeSpec, PolicyConfig, ProxyConfig, Role, create_app, running
from proxy.config.policy_config import Policy
from proxy.serving.app import ProxyState
from tests.fakes.fake_vllm import FakeVLLM


def config_for(nodes: dict[str, FakeVLLM], policy: Policy = Policy.LOCAL,
               **overrides: Any) -> ProxyConfig:
    """A ProxyConfig over the named fakes (names starting with p are P, d are D, r replicas)."""
    roles = {"p": Role.PREFILL, "d": Role.DECODE, "r": Role.REPLICA}
    specs = tuple(NodeSpec(fake.url, roles[name[0]]) for name, fake in nodes.items())
    policy_kw = {k: overrides.pop(k) for k in ("x", "table", "non_cached_tokens", "w_ttft",
                                               "w_tpot") if k in overrides}
    base = ProxyConfig(nodes=specs, policy=PolicyConfig(policy, **policy_kw), port=0,
                       health_interval=60.0)
    return replace(base, **overrides)


@dataclass(frozen=True)
class ProxyUnderTest:
    """A proxy served on loopback: a client for it, its URL and its typed state."""

    client: httpx.AsyncClient
    url: str
    state: ProxyState


@contextlib.asynccontextmanager
async def serve_proxy(config: ProxyConfig) -> AsyncIterator[ProxyUnderTest]:
    """Serve the proxy for config on a loopback port for the block."""
    app = create_app(config)
    async with running(app) as server, httpx.AsyncClient(base_url=server.url,
                                                         timeout=20) as client:
        yield ProxyUnderTest(client, server.url, app.extensions["ppd"])


def chat_body(*contents: str, **extra: Any) -> dict[str, Any]:
    """A chat body alternating user/assistant contents (starting with user)."""
    roles = ("user", "assistant")
    messages = [{"role": roles[i % 2], "content": c} for i, c in enumerate(contents)]
    return {"model": "fake-model", "messages": messages, "max_tokens": 16, **extra}


def reply_text(response: httpx.Response) -> str:
    """The assistant text of a chat response, streamed (SSE) or not."""
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        return str(response.json()["choices"][0]["message"]["content"])
    parts = []
    for event in response.text.split("\n\n"):
        if event.startswith("data: {"):
            for choice in json.loads(event[6:]).get("choices", []):
                parts.append(choice.get("delta", {}).get("content") or "")
    return "".join(parts)


class FakeClock:
    """A clock tests move by hand (`clock.now += 5`)."""

    def __init__(self, now: float = 0.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>"
            "{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}")


def make_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer trained on a few words, saved like a HF model directory (with a
    chat template, which the proxy's token definition ignores)."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=["[UNK]", "<s>"])
    tokenizer.train_from_iterator(["hello world how are you today friend"], trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config: dict[str, object] = {"bos_token": {"content": "<s>"}, "eos_token": "</s>"}
    config["chat_template"] = TEMPLATE
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory

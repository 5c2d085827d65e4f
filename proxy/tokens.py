"""Token accounting: how many tokens a prompt (or part of one) is, without torch/transformers.

`HFTokenCounter` reads a local Hugging Face tokenizer directory: `tokenizer.json` through the
`tokenizers` package and the chat template (`chat_template` in tokenizer_config.json, or
chat_template.jinja) rendered with jinja2 the way transformers does (sandboxed, trim_blocks,
lstrip_blocks, add_generation_prompt=True). `EstimateTokenCounter` is the fallback: about
4 characters per token plus a few tokens of template overhead per chat message.

On the hot path the router counts only what is new: D's held tokens come from the session
(vLLM's reported usage of the previous turn), and only the new messages are counted.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

import jinja2
import jinja2.sandbox
from tokenizers import Tokenizer

CHARS_PER_TOKEN = 4.0
MESSAGE_OVERHEAD_TOKENS = 4  # role markers and separators a chat template adds per message


class TokenCounter(Protocol):
    """Counts tokens of prompts as the served model would see them."""

    def count_text(self, text: str) -> int:
        """Tokens of a plain text (a completions prompt or a reply)."""
        ...

    def count_chat(self, messages: Sequence[dict[str, Any]]) -> int:
        """Tokens of chat messages rendered with the chat template and a generation prompt."""
        ...


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict)
                       and isinstance(p.get("text", ""), str))
    return "" if content is None else json.dumps(content)


class EstimateTokenCounter:
    """~4 characters per token, plus MESSAGE_OVERHEAD_TOKENS per chat message."""

    def count_text(self, text: str) -> int:
        """Estimated tokens of a text (0 for an empty one)."""
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    def count_chat(self, messages: Sequence[dict[str, Any]]) -> int:
        """Estimated tokens of chat messages."""
        return sum(self.count_text(_content_text(m.get("content"))) + MESSAGE_OVERHEAD_TOKENS
                   for m in messages)


class TokenizerError(ValueError):
    """A tokenizer directory cannot be used; the message says why."""


def _token_string(value: Any) -> str:
    # tokenizer_config.json stores special tokens as strings or as {"content": ...} objects.
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


class HFTokenCounter:
    """Exact counts from a local HF tokenizer directory (tokenizer.json + chat template)."""

    def __init__(self, directory: Path) -> None:
        path = Path(directory) / "tokenizer.json"
        if not path.is_file():
            raise TokenizerError(f"no tokenizer.json in {directory}")
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # the Rust library raises plain Exception subclasses
            raise TokenizerError(f"cannot load {path}: {exc}") from exc
        config_path = Path(directory) / "tokenizer_config.json"
        config: dict[str, Any] = {}
        if config_path.is_file():
            config = json.loads(config_path.read_text())
        self._special = {name: _token_string(config.get(name))
                         for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
        self._template = self._load_template(Path(directory), config)

    @staticmethod
    def _load_template(directory: Path, config: dict[str, Any]) -> jinja2.Template | None:
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: use "default"
            named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
            source = named.get("default") or next(iter(named.values()), None)
        jinja_file = directory / "chat_template.jinja"
        if source is None and jinja_file.is_file():
            source = jinja_file.read_text()
        if not isinstance(source, str):
            return None
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise_exception
        env.filters["tojson"] = lambda value, **kw: json.dumps(value, ensure_ascii=False, **kw)
        try:
            return env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"chat template of {directory} does not compile: {exc}") from exc

    @property
    def has_chat_template(self) -> bool:
        """Whether chat messages are rendered with the model's own template."""
        return self._template is not None

    def count_text(self, text: str) -> int:
        """Exact tokens of a text, without added special tokens."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_chat(self, messages: Sequence[dict[str, Any]]) -> int:
        """Tokens of messages rendered with the chat template (a generation prompt added).

        Without a template, or when the template rejects a partial list (some insist on a
        system or user message first), each message is counted as its text plus a fixed
        overhead.
        """
        if self._template is not None:
            try:
                text = self._template.render(messages=list(messages), add_generation_prompt=True,
                                             **self._special)
            except jinja2.TemplateError:
                pass
            else:
                return self.count_text(text)
        return sum(self.count_text(_content_text(m.get("content"))) + MESSAGE_OVERHEAD_TOKENS
                   for m in messages)


def token_counter(directory: Path | None) -> TokenCounter:
    """The counter for a configured tokenizer directory, or the estimate without one."""
    return EstimateTokenCounter() if directory is None else HFTokenCounter(directory)

"""The emulator's tokenizer: exact prompt token ids, and reply text of an exact token count.

Emulated nodes serve a model name (e.g. llama-3.1-8b) without its weights or its tokenizer (no
hub). They tokenize with the tiny model's byte-level BPE instead - trained here, on Python's
own docstrings (profiler/models/prepare.py), with the same ChatML template - saved once as a
tokenizer directory that `ppd proxy --tokenizer` reads too, so the proxy's counts, the usage a
node reports and the node's prefix cache all agree. Prompt lengths in tokens differ from the
real Llama tokenizer's by a few per cent on English prose; what matters for timing is that
every party counts the same tokens.

A chat prompt is rendered as ChatML (the tiny model's CHATML_TEMPLATE, written out here) and
encoded message by message: special tokens bracket each message and the tokenizer never merges
across them, so the ids of a conversation are the ids of its messages end to end. Each
message's ids are cached, so turn N tokenizes only its new messages - tokenizing a 5k-token
history cost 3-12 ms of CPU here, more than an H100 step.

Replies are drawn from "word tokens": vocabulary entries that are one space plus letters. Such
a token is a pre-tokenizer word on its own, so a reply of N word tokens re-encodes to exactly
the same N ids when the next turn sends it back in the history - as vLLM's prefix cache needs.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from profiler.models.prepare import CHATML_TEMPLATE, train_tiny_tokenizer
from profiler.models.prepare import cache_dir as ppd_cache_dir
from proxy.shared.tokens import content_text

TOKENIZER_VERSION = 1
_READY = ".ppd-emulator-tokenizer"
_BOS, _EOS = "<|endoftext|>", "<|im_end|>"
MIN_WORD_TOKENS = 64
MESSAGE_CACHE_SIZE = 4096  # encoded messages kept (a few conversations' histories each)


def tokenizer_dir(env: dict[str, str] | None = None) -> Path:
    """The emulator tokenizer's directory in the ppd cache, built on first use (~2 s)."""
    root = ppd_cache_dir(env) / "emulator" / f"tokenizer-v{TOKENIZER_VERSION}"
    if not (root / _READY).is_file():
        build_tokenizer(root)
    return root


def build_tokenizer(out: Path) -> Path:
    """Train the tiny BPE (deterministic) into `out`: tokenizer.json + tokenizer_config.json."""
    tokenizer = train_tiny_tokenizer()
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    tokenizer.save(str(staging / "tokenizer.json"))
    config = {"bos_token": _BOS, "eos_token": _EOS, "unk_token": _BOS, "pad_token": _BOS,
              "chat_template": CHATML_TEMPLATE, "model_max_length": 131072,
              "tokenizer_class": "PreTrainedTokenizerFast"}  # fmt: skip
    (staging / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    (staging / _READY).write_text("")
    try:
        os.replace(staging, out)
    except OSError:  # another process built it first (the target is a non-empty directory)
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return out


class Vocabulary:
    """Token ids of prompts (chat in the ChatML format) and synthetic replies."""

    def __init__(self, directory: Path) -> None:
        from tokenizers import Tokenizer

        file = Path(directory) / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"no tokenizer.json in {directory}")
        self.directory = Path(directory)
        self._tokenizer = Tokenizer.from_file(str(file))
        pieces = self._tokenizer.get_vocab()
        words = sorted(i for piece, i in pieces.items()
                       if len(piece) > 2 and piece[0] == "\u0120" and piece[1:].isalpha()
                       and piece[1:].isascii())  # fmt: skip
        # Keep only tokens that survive decode -> encode as themselves, alone and in a row.
        self.word_ids = [i for i in words if self._tokenizer.encode(
            self._tokenizer.decode([i, i]), add_special_tokens=False).ids == [i, i]]
        if len(self.word_ids) < MIN_WORD_TOKENS:
            raise ValueError(f"tokenizer {directory} has too few word tokens for replies")
        self._segments: OrderedDict[str, list[int]] = OrderedDict()

    def encode_text(self, text: str) -> list[int]:
        """Ids of a plain prompt, as vLLM's completions endpoint sees it (no special tokens)."""
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Ids of chat messages rendered as ChatML with a generation prompt."""
        ids: list[int] = []
        for message in messages:
            ids += self._segment(render_message(message))
        ids += self._segment(GENERATION_PROMPT)
        return ids

    def _segment(self, text: str) -> list[int]:
        ids = self._segments.get(text)
        if ids is None:
            ids = self.encode_text(text)
            self._segments[text] = ids
            if len(self._segments) > MESSAGE_CACHE_SIZE:
                self._segments.popitem(last=False)
        else:
            self._segments.move_to_end(text)
        return ids

    def reply_ids(self, n_tokens: int, seed: str) -> list[int]:
        """n_tokens word-token ids, deterministic per seed (a request's id and prompt)."""
        rng = random.Random(seed)
        return [rng.choice(self.word_ids) for _ in range(n_tokens)]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids; a reply's text re-encodes to the same ids."""
        return str(self._tokenizer.decode(list(ids)))


GENERATION_PROMPT = "<|im_start|>assistant\n"


def render_message(message: dict[str, Any]) -> str:
    """One message as CHATML_TEMPLATE renders it (the tiny model's template)."""
    return f"<|im_start|>{message.get('role')}\n{content_text(message.get('content'))}<|im_end|>\n"


def render_chat(messages: Sequence[dict[str, Any]]) -> str:
    """A conversation with the generation prompt, as CHATML_TEMPLATE renders it."""
    return "".join(render_message(m) for m in messages) + GENERATION_PROMPT

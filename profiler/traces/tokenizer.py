"""Token counting for traces and synthetic workloads.

`TextTokenizer` is the small protocol the loaders and generators need: count the tokens of a
text, and cut a text down to a number of tokens (which is how synthetic prompts reach an exact
token count). Two implementations:
- `HFTokenizer`: a local Hugging Face tokenizer directory (its tokenizer.json) through the
  `tokenizers` package - exact counts for the served model, no hub access;
- `ApproxTokenizer`: four characters per token, the usual rule of thumb, when no tokenizer is
  given. Counts are then estimates, and synthetic shapes are exact only for this estimate.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Protocol, runtime_checkable

CHARS_PER_TOKEN = 4


@runtime_checkable
class TextTokenizer(Protocol):
    """What trace loading and workload generation need from a tokenizer."""

    name: str

    def count(self, text: str) -> int:
        """Number of tokens in text (no special tokens)."""
        ...

    def truncate(self, text: str, n_tokens: int) -> str:
        """A prefix of text with at most n_tokens tokens (as close to n_tokens as possible)."""
        ...


class ApproxTokenizer:
    """ceil(characters / 4): an estimate for when the model's tokenizer is not at hand."""

    name = "approx-4-chars"

    def count(self, text: str) -> int:
        return math.ceil(len(text) / CHARS_PER_TOKEN)

    def truncate(self, text: str, n_tokens: int) -> str:
        return text[: max(n_tokens, 0) * CHARS_PER_TOKEN]


class HFTokenizer:
    """A Hugging Face fast tokenizer loaded from a local directory or tokenizer.json file."""

    def __init__(self, path: str | Path) -> None:
        from tokenizers import Tokenizer  # imported here: only commands given --tokenizer pay

        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json at {path} (give a model directory)")
        self._tokenizer = Tokenizer.from_file(str(file))
        self.name = str(path)

    def count(self, text: str) -> int:
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def count_batch(self, texts: list[str]) -> list[int]:
        """Counts for many texts at once (the Rust side parallelizes)."""
        encodings = self._tokenizer.encode_batch(texts, add_special_tokens=False)
        return [len(encoding.ids) for encoding in encodings]

    def truncate(self, text: str, n_tokens: int) -> str:
        ids = self._tokenizer.encode(text, add_special_tokens=False).ids
        if len(ids) <= n_tokens:
            return text
        return self._tokenizer.decode(ids[: max(n_tokens, 0)], skip_special_tokens=True)


def load_tokenizer(path: str | Path | None) -> TextTokenizer:
    """The tokenizer at path, or the 4-characters estimate when path is None."""
    return ApproxTokenizer() if path is None else HFTokenizer(path)

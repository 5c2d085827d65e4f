"""Fixtures: the emulator's tokenizer (built once, in a temporary directory) and its vocabulary."""

from __future__ import annotations

from pathlib import Path

import pytest

from profiler.emulate.tokenizer import Vocabulary, build_tokenizer


@pytest.fixture(scope="session")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("emulator") / "tokenizer")


@pytest.fixture(scope="session")
def vocab(tokenizer_path: Path) -> Vocabulary:
    return Vocabulary(tokenizer_path)

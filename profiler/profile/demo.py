"""`ppd demo`: the product's main job on a built-in default, start to finish on this machine.

Prepares SmolLM2-135M-Instruct, starts a 1P1D vLLM cluster on the CPU with the proxy in front,
replays the same built-in multi-turn conversations under policy `pd` (every turn P->D) and then
`local` (turn 2+ appended on the session's D), prints the two side by side, asks the model one
question for a real answer, and stops everything - also on Ctrl-C or SIGTERM.

The conversations ask about Python's own module documentation (shipped with Python, so nothing is
downloaded): turn 1 pastes a long document, later turns ask short questions about it, the shape
where appending on D should beat re-prefilling through P. Each run tags its conversations so
the second run finds no KV the first one left in any cache: both start cold.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from profiler.cluster.launcher import Cluster, default_cores, start_cluster
from profiler.cluster.plan import ClusterConfig, parse_layout
from profiler.cluster.procs import sigterm_as_interrupt
from profiler.models.prepare import ModelName, prepare_model
from profiler.replay import ReplayConfig, replay
from profiler.replay.metrics import summarize
from profiler.traces.conversation import Conversation, Turn
from proxy.policies import local as local_policy
from proxy.policies import pd as pd_policy

POLICIES = (pd_policy.NAME, local_policy.NAME)
SYSTEM_PROMPT = "You are a helpful assistant who answers briefly."
DOC_MODULES = ("re", "json", "argparse", "csv", "statistics", "http.cookies", "itertools",
               "unittest", "heapq", "random")
FOLLOW_UPS = (
    "Name one function or class from it and say what it does.",
    "Write a one-line Python example that uses it.",
    "Who would find this module most useful?",
    "Summarize our conversation in one sentence.",
)
QUESTIONS = ("What is the capital of France?", "And what is the capital of Germany?")
# (label, summary key, format) rows of the comparison table.
ROWS = (
    ("turn-1 TTFT mean (ms)", "turn1_ttft_ms_mean", "{:.0f}"),
    ("turn-2+ TTFT mean (ms)", "turn2plus_ttft_ms_mean", "{:.0f}"),
    ("turn-2+ TTFT p50 (ms)", "turn2plus_ttft_ms_p50", "{:.0f}"),
    ("TPOT mean (ms)", "tpot_ms_mean", "{:.1f}"),
    ("success rate", "success_rate", "{:.0%}"),
    ("requests", "n_requests", "{:d}"),
)

Say = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class DemoConfig:
    """The demo's knobs; the defaults are what `make demo` runs."""

    model: str = ModelName.SMOLLM2.value
    conversations: int = 6
    turns: int = 3
    qps: float = 0.2
    max_tokens: int = 32
    doc_chars: int = 5000
    base_port: int = 8100
    proxy_port: int = 8000
    state_dir: Path = Path(".ppd-cluster") / "demo"
    timeout_s: float = 180.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.conversations <= 100:
            raise ValueError("--conversations must be in [1, 100]")
        if not 2 <= self.turns <= 1 + len(FOLLOW_UPS):
            raise ValueError(f"--turns must be in [2, {1 + len(FOLLOW_UPS)}]")
        if self.qps <= 0 or self.max_tokens < 2 or self.doc_chars < 200:
            raise ValueError("--conversation-rate must be > 0, --max-tokens >= 2, "
                             "--doc-chars >= 200")


def module_document(name: str, max_chars: int) -> str:
    """A module's docstring plus its public functions' docstrings, cut at a line boundary."""
    module = importlib.import_module(name)
    parts = [module.__doc__ or ""]
    for attr, value in sorted(vars(module).items()):
        doc = getattr(value, "__doc__", None) if callable(value) else None
        if not attr.startswith("_") and isinstance(doc, str) and len(doc) > 80:
            parts.append(f"{attr}: {doc.strip()}")
    text = "\n\n".join(p.strip() for p in parts if p.strip())
    return text if len(text) <= max_chars else text[: text.rfind("\n", 0, max_chars)]


def demo_conversations(config: DemoConfig, run_tag: str) -> list[Conversation]:
    """The built-in conversations; run_tag opens every prompt, so runs share no cached KV."""
    conversations = []
    for i in range(config.conversations):
        name = DOC_MODULES[i % len(DOC_MODULES)]
        first = (f"Here is the documentation of Python's `{name}` module:\n\n"
                 f"{module_document(name, config.doc_chars)}\n\n"
                 "In two sentences, what is this module for?")
        users = [first, *FOLLOW_UPS[: config.turns - 1]]
        turns = tuple(Turn(user=u, reference_answer=None, n_out_tokens=config.max_tokens)
                      for u in users)
        conversations.append(Conversation(
            id=f"demo-{run_tag}-{i}", turns=turns, system=f"[{run_tag}] {SYSTEM_PROMPT}"))
    return conversations


def _replay(url: str, model: str, conversations: list[Conversation], config: DemoConfig
            ) -> dict[str, Any]:
    replay_config = ReplayConfig(
        target=url, qps=config.qps, duration_s=10 * len(conversations) / config.qps,
        max_conversations=len(conversations), model=model, max_tokens_cap=config.max_tokens,
        timeout_s=config.timeout_s, seed=config.seed,
    )
    result = asyncio.run(replay(conversations, replay_config))
    return summarize(result.records, result.wall_time_s)


def warm_up(cluster: Cluster, config: DemoConfig, say: Say) -> None:
    """Two P->D conversations, not measured: fresh servers are slow on their first requests
    (one-time kernel and allocator warm-up), which would count against whichever policy ran
    first."""
    url = cluster.start_proxy(pd_policy.NAME, port=config.proxy_port)
    say("warming up both nodes (not measured) ...")
    warm = DemoConfig(**{**_fields(config), "conversations": 2, "turns": 2})
    summary = _replay(url, cluster.model, demo_conversations(warm, run_tag="warm-up"), warm)
    if summary["n_failed"]:
        raise RuntimeError(f"warm-up failed: {summary['n_failed']} request(s); see the logs "
                           f"in {cluster.state_dir}")


def _fields(config: DemoConfig) -> dict[str, Any]:
    return {name: getattr(config, name) for name in config.__dataclass_fields__}


def replay_policy(cluster: Cluster, policy: str, config: DemoConfig, say: Say) -> dict[str, Any]:
    """Restart the proxy with `policy`, replay the conversations through it, summarize."""
    url = cluster.start_proxy(policy, port=config.proxy_port)
    conversations = demo_conversations(config, run_tag=f"run-{policy}-{config.seed}")
    say(f"replaying {len(conversations)} conversations x {config.turns} turns "
        f"under policy {policy} ...")
    started = time.monotonic()
    summary = _replay(url, cluster.model, conversations, config)
    say(f"  done in {time.monotonic() - started:.0f} s: {summary['n_success']}/"
        f"{summary['n_requests']} ok, routes {summary['routes']}")
    return summary


def comparison_table(summaries: dict[str, dict[str, Any]]) -> str:
    """Rows of ROWS, one column per policy, and local's change relative to pd."""
    header = f"{'':<24}" + "".join(f"{p:>12}" for p in summaries) + f"{'local vs pd':>14}"
    lines = [header, "-" * len(header)]
    for label, key, fmt in ROWS:
        values = [s.get(key) for s in summaries.values()]
        cells = "".join(f"{fmt.format(v) if v is not None else 'n/a':>12}" for v in values)
        change = ""
        pd_value, local_value = (summaries.get(p, {}).get(key) for p in POLICIES)
        if key.endswith(("_mean", "_p50")) and pd_value and local_value is not None:
            change = f"{(local_value - pd_value) / pd_value:+.0%}"
        lines.append(f"{label:<24}{cells}{change:>14}")
    return "\n".join(lines)


def ask(proxy_url: str, model: str, questions: Sequence[str]) -> list[tuple[str, str, str]]:
    """One chat through the proxy, a question per turn: (question, answer, route) per turn."""
    messages: list[dict[str, str]] = []
    answers = []
    for question in questions:
        messages.append({"role": "user", "content": question})
        body = {"model": model, "temperature": 0, "max_tokens": 48, "messages": messages}
        response = httpx.post(f"{proxy_url}/v1/chat/completions", json=body, timeout=120)
        response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        messages.append({"role": "assistant", "content": answer})
        answers.append((question, answer.strip(), response.headers.get("x-ppd-route", "?")))
    return answers


def run_demo(config: DemoConfig, say: Say) -> dict[str, dict[str, Any]]:
    """The whole demo; returns each policy's replay summary. Always stops what it started."""
    started = time.monotonic()
    if config.model in {m.value for m in ModelName}:
        say(f"preparing model {config.model} ...")
        prepare_model(config.model)
    cluster_config = ClusterConfig(
        model=config.model, layout=parse_layout("1P1D"), state_dir=config.state_dir,
        base_port=config.base_port, cores=default_cores(),
    )
    say(f"starting a 1P1D vLLM cluster on the CPU (logs in {config.state_dir}) ...")
    with start_cluster(cluster_config, say) as cluster:
        warm_up(cluster, config, say)
        summaries = {policy: replay_policy(cluster, policy, config, say) for policy in POLICIES}
        answers = ask(cluster.proxy_url, cluster.model, QUESTIONS)
        say("stopping the cluster ...")
    print()
    print(comparison_table(summaries))
    print()
    for question, answer, route in answers:
        print(f"Q: {question}\nA ({cluster.model}, route {route}): {answer}")
    pd_ttft, local_ttft = (summaries[p].get("turn2plus_ttft_ms_mean") for p in POLICIES)
    if pd_ttft and local_ttft is not None:
        verdict = "lower" if local_ttft < pd_ttft else "NOT lower"
        print(f"\nturn-2+ TTFT under local is {verdict} than under pd: "
              f"{local_ttft:.0f} ms vs {pd_ttft:.0f} ms "
              f"(demo took {time.monotonic() - started:.0f} s)")
    return summaries


def build_parser() -> argparse.ArgumentParser:
    d = DemoConfig()
    from profiler.cli import HelpFormatter

    p = argparse.ArgumentParser(prog="ppd demo", description=__doc__.split("\n\n")[0],
                                epilog="example:\n  ppd demo --model tiny --conversations 4",
                                formatter_class=HelpFormatter)
    p.add_argument("--model", default=d.model, help="smollm2, tiny or a model dir")
    p.add_argument("--conversations", type=int, default=d.conversations,
                   help="conversations per run (one run per policy)")
    p.add_argument("--turns", type=int, default=d.turns, help="turns per conversation")
    p.add_argument("--conversation-rate", "--qps", dest="qps", type=float, default=d.qps,
                   help="new conversations per second (--qps: its old name)")
    p.add_argument("--max-tokens", type=int, default=d.max_tokens, help="output tokens per turn")
    p.add_argument("--doc-chars", type=int, default=d.doc_chars,
                   help="length of the document pasted in turn 1 (characters)")
    p.add_argument("--base-port", type=int, default=d.base_port, help="first node port")
    p.add_argument("--proxy-port", type=int, default=d.proxy_port, help="the proxy's port")
    p.add_argument("--state", type=Path, default=d.state_dir, help="cluster state and logs")
    p.add_argument("--seed", type=int, default=d.seed, help="text and arrival seed")
    p.add_argument("--json", type=Path, default=None, metavar="FILE",
                   help="also write both runs' summaries to FILE")
    return p


def main(argv: list[str]) -> int:
    """`ppd demo`: prints progress on stderr, the comparison on stdout."""
    args = build_parser().parse_args(argv)
    config = DemoConfig(
        model=args.model, conversations=args.conversations, turns=args.turns, qps=args.qps,
        max_tokens=args.max_tokens, doc_chars=args.doc_chars, base_port=args.base_port,
        proxy_port=args.proxy_port, state_dir=args.state, seed=args.seed,
    )

    def say(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    with sigterm_as_interrupt():
        summaries = run_demo(config, say)
    if args.json is not None:
        args.json.write_text(json.dumps(summaries, indent=2, default=str) + "\n")
    return 0

"""One run: the fake backend, every target behind it, the load generator, and the table.

Targets: `direct` (the generator talks to the fake D itself), the proxy under each policy
(`pd`, `local`, `ppd`) on each stack, and the peers (`peers.py`: the vLLM project's Rust
router), each in its own process. All are started first and stay up for the whole run; each
row (single-turn or 4-turn conversations at one concurrency) is measured on every target in
turn, `rounds` times, so the machine's other load falls on all of them alike. The CPU time and
RSS of each proxy's whole process tree (workers and an embedded session store included) are
read (psutil) around each measurement. At the end each ppd proxy gets one run `long_factor`
times longer (4-turn, the `long_concurrency`), and its RSS after it is reported beside the RSS
after the short rows: a per-session leak shows up as growth.
"""

from __future__ import annotations

import json
import os
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import psutil

from benchmarks.proxy_overhead import peers
from proxy.policies import local as local_policy
from proxy.policies import pd as pd_policy
from proxy.policies import ppd as ppd_policy
from proxy.policies import registry
from proxy.policies.base import Need

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "tables" / "tiny-cpu-1p1d.csv"
POLICIES = (pd_policy.NAME, local_policy.NAME, ppd_policy.NAME)
FIXED = (pd_policy.NAME, local_policy.NAME)  # what a floor stack serves: no table to read


@dataclass(frozen=True)
class Plan:
    """What one run measures."""

    targets: tuple[str, ...] = ("direct", *POLICIES, *peers.PEERS)
    stacks: tuple[str, ...] = ("default",)
    concurrency: tuple[int, ...] = (1, 16, 64, 256)
    turns: tuple[int, ...] = (1, 4)
    duration: float = 3.0
    warmup: float = 0.5
    tokens: int = 16
    long_factor: int = 10
    long_concurrency: int = 64
    rounds: int = 1  # each row measured this many times, interleaved with the other targets
    # Another checkout of ppd (e.g. `git worktree add /tmp/before BASE`), measured as the stack
    # "baseline" in the same run: BEFORE and AFTER side by side on the same noisy machine.
    baseline: Path | None = None


@dataclass
class Row:
    """One measured row of the table."""

    target: str
    stack: str
    turns: int
    concurrency: int
    result: dict[str, Any]
    cpu_s_per_1k: float | None = None
    rss_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env(tree: Path = REPO) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args} exited with {proc.returncode} while starting")
        try:
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer in {timeout} s")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def backend(tokens: int) -> Iterator[tuple[str, str]]:
    """The fake P and D (two ports of one process); their base URLs."""
    p_port, d_port = free_port(), free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.proxy_overhead.backend", "--port", str(p_port),
         "--port", str(d_port), "--tokens", str(tokens)], cwd=REPO, env=_env())
    try:
        _wait_http(f"http://127.0.0.1:{d_port}/health", proc)
        yield f"http://127.0.0.1:{p_port}", f"http://127.0.0.1:{d_port}"
    finally:
        _stop(proc)


@contextmanager
def proxy(policy: str, stack: str, prefill: str, decode: str,
          baseline: Path | None = None) -> Iterator[tuple[str, int]]:
    """The proxy in its own process under policy and stack; its URL and pid."""
    port = free_port()
    args = ["--prefill", prefill, "--decode", decode, "--port", str(port), "--policy", policy,
            "--health-interval", "60"]
    if registry.get(policy).needs.table is Need.REQUIRED:
        args += ["--table", str(TABLE)]
    tree = REPO
    if stack == "baseline":
        if baseline is None:
            raise ValueError("stack baseline needs --baseline TREE")
        tree, stack = baseline, "default"
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.proxy_overhead.proxy_process", "--stack", stack,
         "--", *args], cwd=tree, env=_env(tree), stderr=subprocess.DEVNULL)
    try:
        _wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        _stop(proc)


@contextmanager
def peer(name: str, prefill: str, decode: str) -> Iterator[tuple[str, int]]:
    """Another project's proxy (`peers.PEERS`) in its own process; its URL and pid."""
    port = free_port()
    with peers.started(name, port, free_port(), prefill, decode) as proc:
        _wait_http(f"http://127.0.0.1:{port}/health", proc)
        yield f"http://127.0.0.1:{port}", proc.pid


class LoadGenerator:
    """The generator process; `run(job)` sends one job and waits for its result."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.proxy_overhead.loadgen"], cwd=REPO, env=_env(),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)

    def run(self, job: dict[str, Any]) -> dict[str, Any]:
        stdin, stdout = self._pipes()
        stdin.write(json.dumps(job) + "\n")
        stdin.flush()
        line = stdout.readline()
        if not line:
            raise RuntimeError("the load generator died")
        result: dict[str, Any] = json.loads(line)
        return result

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        return self._proc.stdin, self._proc.stdout

    def close(self) -> None:
        stdin, _ = self._pipes()
        stdin.close()
        self._proc.wait(10)


def _tree(pid: int) -> list[psutil.Process]:
    """The process and its descendants (workers, an embedded session store)."""
    process = psutil.Process(pid)
    return [process, *process.children(recursive=True)]


def _cpu_seconds(processes: list[psutil.Process]) -> dict[int, float]:
    spent: dict[int, float] = {}
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        spent[process.pid] = times.user + times.system
    return spent


def _rss_mb(processes: list[psutil.Process]) -> float:
    total = 0
    for process in processes:
        try:
            total += process.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total / 2**20


def measure(gen: LoadGenerator, url: str, pid: int | None, job: dict[str, Any]
            ) -> tuple[dict[str, Any], float | None, float | None]:
    """One job against url; the result, the CPU seconds per 1000 requests and the RSS (MB) of
    pid's whole process tree (None, None for `direct`)."""
    tree = _tree(pid) if pid is not None else []
    before = _cpu_seconds(tree)
    result = gen.run({"url": url, **job})
    if pid is None:
        return result, None, None
    tree = _tree(pid)  # a worker restarted meanwhile counts from zero
    after = _cpu_seconds(tree)
    cpu = sum(spent - before.get(child, 0.0) for child, spent in after.items())
    per_1k = 1000 * cpu / result["requests_total"] if result["requests_total"] else None
    return result, per_1k, _rss_mb(tree)


def _merge(rounds: list[tuple[dict[str, Any], float | None, float | None]]
           ) -> tuple[dict[str, Any], float | None, float | None]:
    """Rounds of one row as one: medians of the rates and percentiles, CPU over all requests."""
    results = [r for r, _, _ in rounds]
    if len(results) == 1:
        return rounds[0]

    def median(key: str) -> float | None:
        values = [r[key] for r in results if r[key] is not None]
        return statistics.median(values) if values else None

    merged = {**results[-1], "requests": sum(r["requests"] for r in results),
              "requests_total": sum(r["requests_total"] for r in results),
              "errors": sum(r["errors"] for r in results),
              "first_error": next((r["first_error"] for r in results if r["first_error"]), ""),
              "rounds_rps": [r["rps"] for r in results]}
    for key in ("rps", "ttft_p50_ms", "ttft_p99_ms", "gap_p99_ms"):
        merged[key] = median(key)
    cpus = [(cpu, r["requests_total"]) for r, cpu, _ in rounds if cpu is not None]
    cpu = (sum(c * n for c, n in cpus) / sum(n for _, n in cpus)
           if cpus and sum(n for _, n in cpus) else None)
    merged["rounds_cpu_s_per_1k"] = [c for c, _ in cpus]  # each round's, for its spread
    return merged, cpu, rounds[-1][2]


@dataclass(frozen=True)
class Target:
    """One thing the generator can talk to: its table names, URL and process (None: direct)."""

    name: str
    stack: str
    url: str
    pid: int | None


def _targets(plan: Plan, stack: ExitStack, prefill: str, decode: str) -> list[Target]:
    """Start every proxy and peer of the plan (all up at once); direct first."""
    targets = [Target("direct", "-", decode, None)] if "direct" in plan.targets else []
    for name in plan.targets:
        if name in peers.PEERS:
            url, pid = stack.enter_context(peer(name, prefill, decode))
            targets.append(Target(name, "-", url, pid))
            continue
        if name == "direct":
            continue
        for kind in plan.stacks:
            if kind.startswith("floor") and name not in FIXED:  # it has no policy
                continue
            url, pid = stack.enter_context(proxy(name, kind, prefill, decode, plan.baseline))
            targets.append(Target(name, kind, url, pid))
    return targets


def run(plan: Plan, progress: IO[str] | None = None) -> list[Row]:
    """Measure every row of the plan, interleaved: every target is up for the whole run and
    each (turns, concurrency) row is measured on all of them in turn, `plan.rounds` times, so
    a burst of load from elsewhere on the machine hits every target alike. Rows come back in
    target, stack, turns, concurrency order."""
    rows: list[Row] = []
    gen = LoadGenerator()
    job = {"warmup": plan.warmup, "duration": plan.duration, "tokens": plan.tokens}
    try:
        with backend(plan.tokens) as (prefill, decode), ExitStack() as stack:
            targets = _targets(plan, stack, prefill, decode)
            for turns in plan.turns:
                for conc in plan.concurrency:
                    measured: dict[Target, list[Any]] = {t: [] for t in targets}
                    for _ in range(plan.rounds):
                        for target in targets:
                            measured[target].append(measure(
                                gen, target.url, target.pid,
                                {**job, "turns": turns, "concurrency": conc}))
                    for target in targets:
                        result, cpu, rss = _merge(measured[target])
                        rows.append(Row(target.name, target.stack, turns, conc, result, cpu,
                                        rss))
                        if progress is not None:
                            print(f"  {target.name:<13} {target.stack:<16} turns {turns} conc "
                                  f"{conc:>3}: {result['rps']:>8.1f} req/s, "
                                  f"{result['errors']} errors", file=progress, flush=True)
            for target in targets:
                if target.pid is not None and target.name in POLICIES and plan.long_factor:
                    _long_run(gen, plan, job, target, rows)
    finally:
        gen.close()
    order = {name: i for i, name in enumerate(plan.targets)}
    stacks = {name: i for i, name in enumerate(plan.stacks)}
    rows.sort(key=lambda r: (order.get(r.target, -1), stacks.get(r.stack, -1), r.turns,
                             r.concurrency))
    return rows


def _long_run(gen: LoadGenerator, plan: Plan, job: dict[str, Any], target: Target,
              rows: list[Row]) -> None:
    """One run `long_factor` times a row's length on ppd: its RSS after it shows a leak."""
    long_job = {**job, "duration": plan.duration * plan.long_factor, "turns": max(plan.turns),
                "concurrency": plan.long_concurrency}
    result, _, rss = measure(gen, target.url, target.pid, long_job)
    for row in rows:
        if (row.target, row.stack) == (target.name, target.stack):
            row.extra = {"rss_long_mb": rss, "long_errors": result["errors"],
                         "long_requests": result["requests_total"]}

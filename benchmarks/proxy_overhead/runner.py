"""One run: the fake backend, each target behind it, the load generator, and the table.

Targets: `direct` (the generator talks to the fake D itself) and the proxy under each policy
(`pd`, `local`, `ppd`), each proxy in a fresh process. For every target the generator runs
single-turn and 4-turn conversations at each concurrency; the proxy's CPU time and RSS are
read (psutil) around each row. After its rows, each proxy gets one run `long_factor` times
longer (4-turn, the `long_concurrency`), and its RSS after it is reported beside the RSS after
the short rows: a per-session leak shows up as growth.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import psutil

REPO = Path(__file__).resolve().parents[2]
TABLE = REPO / "tables" / "tiny-cpu-1p1d.csv"
POLICIES = ("pd", "local", "ppd")


@dataclass(frozen=True)
class Plan:
    """What one run measures."""

    targets: tuple[str, ...] = ("direct", "pd", "local", "ppd")
    stacks: tuple[str, ...] = ("default",)
    concurrency: tuple[int, ...] = (1, 16, 64, 256)
    turns: tuple[int, ...] = (1, 4)
    duration: float = 3.0
    warmup: float = 0.5
    tokens: int = 16
    long_factor: int = 10
    long_concurrency: int = 64
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


def _wait_http(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
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
    if policy == "ppd":
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


def measure(gen: LoadGenerator, url: str, pid: int | None, job: dict[str, Any]
             ) -> tuple[dict[str, Any], float | None, float | None]:
    process = psutil.Process(pid) if pid is not None else None
    before = process.cpu_times() if process else None
    result = gen.run({"url": url, **job})
    if process is None or before is None:
        return result, None, None
    after = process.cpu_times()
    cpu = (after.user - before.user) + (after.system - before.system)
    per_1k = 1000 * cpu / result["requests_total"] if result["requests_total"] else None
    return result, per_1k, process.memory_info().rss / 2**20


def run(plan: Plan, progress: IO[str] | None = None) -> list[Row]:
    """Measure every row of the plan; rows in target, stack, turns, concurrency order."""
    rows: list[Row] = []
    gen = LoadGenerator()
    try:
        with backend(plan.tokens) as (prefill, decode):
            for target in plan.targets:
                stacks = ("-",) if target == "direct" else plan.stacks
                if target not in ("pd", "local"):  # the floor relays; it has no policy
                    stacks = tuple(stack for stack in stacks if stack != "floor")
                for stack in stacks:
                    rows += _target_rows(gen, plan, target, stack, prefill, decode, progress)
    finally:
        gen.close()
    return rows


def _target_rows(gen: LoadGenerator, plan: Plan, target: str, stack: str, prefill: str,
                 decode: str, progress: IO[str] | None) -> list[Row]:
    rows: list[Row] = []
    job = {"warmup": plan.warmup, "duration": plan.duration, "tokens": plan.tokens}

    def measure_rows(url: str, pid: int | None) -> None:
        for turns in plan.turns:
            for conc in plan.concurrency:
                result, cpu, rss = measure(gen, url, pid,
                                           {**job, "turns": turns, "concurrency": conc})
                rows.append(Row(target, stack, turns, conc, result, cpu, rss))
                if progress is not None:
                    print(f"  {target:<6} {stack:<16} turns {turns} conc {conc:>3}: "
                          f"{result['rps']:>8.1f} req/s, {result['errors']} errors",
                          file=progress, flush=True)

    if target == "direct":
        measure_rows(decode, None)
        return rows
    with proxy(target, stack, prefill, decode, plan.baseline) as (url, pid):
        measure_rows(url, pid)
        long_job = {**job, "duration": plan.duration * plan.long_factor, "turns": max(plan.turns),
                    "concurrency": plan.long_concurrency}
        result, _, rss = measure(gen, url, pid, long_job)
        for row in rows:
            row.extra = {"rss_long_mb": rss, "long_errors": result["errors"],
                         "long_requests": result["requests_total"]}
    return rows

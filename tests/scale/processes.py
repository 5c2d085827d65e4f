"""Real processes for scale-out tests: `ppd proxy` (one worker or several) and haproxy."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import TracebackType

import httpx

REPO = Path(__file__).resolve().parents[2]
HAPROXY_CFG = REPO / "deploy" / "haproxy.cfg"


def _env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**env, **extra}


class Process:
    """A child process with its output in a log file; `async with` starts and stops it."""

    def __init__(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> None:
        self.args = args
        self.log = log
        self.env = env or _env()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(self.args, stdout=out, stderr=subprocess.STDOUT,
                                            env=self.env, start_new_session=True)

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)

    def workers(self) -> list[int]:
        """The pids of the worker processes this process spawned (Linux /proc)."""
        assert self.process is not None
        found = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
                cmdline = (stat.parent / "cmdline").read_bytes()
            except (OSError, ValueError, IndexError):
                continue
            if ppid == self.process.pid and b"spawn_main" in cmdline:
                found.append(int(stat.parent.name))
        return sorted(found)

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    async def wait_http(self, url: str, want_workers: int = 1, timeout: float = 60.0) -> None:
        """Until url answers 200 (from `want_workers` distinct workers, over new connections)."""
        seen: set[str] = set()
        deadline = asyncio.get_running_loop().time() + timeout
        while asyncio.get_running_loop().time() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(f"{self.args[:4]} exited:\n{self.output()[-3000:]}")
            try:
                async with httpx.AsyncClient(timeout=2) as client:
                    response = await client.get(url)
                if response.status_code == 200:
                    seen.add(response.headers.get("x-ppd-worker", "0"))
                    if len(seen) >= want_workers:
                        return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.05)
        raise TimeoutError(f"{url} not ready ({sorted(seen)} seen):\n{self.output()[-3000:]}")

    async def __aenter__(self) -> Process:
        self.start()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.stop)


def ppd_proxy(args: list[str], log: Path) -> Process:
    """`ppd proxy ARGS` from this checkout."""
    return Process([sys.executable, "-m", "profiler.cli", "proxy", *args], log)


def haproxy(listen: str, replicas: list[str], log: Path) -> Process:
    """haproxy with deploy/haproxy.cfg, listening on `listen`, over two replicas host:port."""
    binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(binary).exists():
        raise RuntimeError("haproxy is not installed: run `make system-deps` (apt haproxy)")
    env = _env(PPD_LISTEN=listen, PPD_REPLICA_1=replicas[0], PPD_REPLICA_2=replicas[1])
    return Process([binary, "-db", "-f", str(HAPROXY_CFG)], log, env)

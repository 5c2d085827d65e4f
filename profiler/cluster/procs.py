"""Background server processes: start in their own process group, wait for HTTP, stop, tail logs.

Each server runs in a new session, so its pid is also its process-group id: stopping the group
takes vLLM's engine-core children along, and `ppd cluster down` can do it from another process
that only knows the pid from cluster.json.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

POLL_INTERVAL_S = 0.5
STOP_GRACE_S = 15.0
LOG_TAIL_LINES = 30


@dataclass(slots=True)
class ManagedProcess:
    """A server we started (process set) or found in a state file (process None)."""

    name: str
    url: str
    pid: int
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def exit_code(self) -> int | None:
        """The exit code if the server process has ended, else None."""
        if self.process is not None:
            return self.process.poll()
        return None if group_alive(self.pid) else -1


def spawn(name: str, url: str, argv: Sequence[str], env: Mapping[str, str], log: Path,
          cwd: Path | None = None) -> ManagedProcess:
    """Start `argv` in a new session with stdout and stderr appended to `log`."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        process = subprocess.Popen(
            list(argv), stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            env=dict(env), cwd=cwd, start_new_session=True,
        )
    return ManagedProcess(name, url, process.pid, log, process)


def port_free(host: str, port: int) -> bool:
    """True when nothing listens on host:port (so a server can bind it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def answers(client: httpx.Client, url: str) -> bool:
    """True when GET url returns 200."""
    try:
        return client.get(url).status_code == 200
    except httpx.HTTPError:
        return False


def wait_ready(procs: Sequence[ManagedProcess], path: str, timeout_s: float,
               on_ready: Callable[[ManagedProcess, float], None] | None = None) -> None:
    """Wait until every process answers GET url+path with 200.

    Raises StartupError naming the first process that exits or the ones still silent at the
    timeout, with the tail of that process's log.
    """
    started = time.monotonic()
    pending = list(procs)
    with httpx.Client(timeout=2.0) as client:
        while pending:
            for proc in list(pending):
                code = proc.exit_code()
                if code is not None:
                    raise StartupError(proc, f"exited with code {code} while starting")
                if answers(client, proc.url + path):
                    pending.remove(proc)
                    if on_ready is not None:
                        on_ready(proc, time.monotonic() - started)
            if pending and time.monotonic() - started > timeout_s:
                raise StartupError(
                    pending[0], f"did not answer {path} within {timeout_s:.0f} s"
                )
            if pending:
                time.sleep(POLL_INTERVAL_S)


class StartupError(Exception):
    """A server failed to come up; the message carries the tail of its log."""

    def __init__(self, proc: ManagedProcess, what: str) -> None:
        self.proc = proc
        super().__init__(
            f"{proc.name} ({proc.url}) {what}; last lines of {proc.log}:\n{tail(proc.log)}"
        )


def tail(log: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last `lines` lines of a log file ('' if it does not exist)."""
    try:
        with open(log, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def group_alive(pgid: int) -> bool:
    """True while any process of group `pgid` exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_group_leader(pid: int) -> bool:
    """True when `pid` runs and leads its own process group (as every server we start does).

    Guards `down` against a recycled pid: a stranger's pid is not a group leader we made.
    """
    try:
        return os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def stop(procs: Sequence[ManagedProcess], grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM every process group, wait up to `grace_s`, then SIGKILL what remains."""
    targets = [p for p in procs if p.process is not None or is_group_leader(p.pid)]
    for proc in targets:
        _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in targets):
        time.sleep(0.2)
    for proc in targets:
        if _alive(proc):
            _signal_group(proc.pid, signal.SIGKILL)
    for proc in targets:
        if proc.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.process.wait(timeout=5)


def _alive(proc: ManagedProcess) -> bool:
    if proc.process is not None:
        proc.process.poll()  # reap the leader, or its zombie keeps the group "alive"
    return group_alive(proc.pid)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so the cleanup in `finally` blocks runs either way."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

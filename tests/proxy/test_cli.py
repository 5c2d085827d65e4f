"""`ppd proxy` from the command line, and the in-process ServerThread runner."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

import httpx
import pytest

from profiler.cli import main as ppd_main
from proxy import NodeSpec, ProxyConfig, Role, ServerThread, create_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_help_lists_the_design_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        ppd_main(["proxy", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for flag in ("--host", "--port", "--prefill", "--decode", "--replica", "--cluster",
                 "--config", "--policy", "--x", "--table", "--w-ttft", "--w-tpot",
                 "--non-cached-tokens", "--tokenizer", "--discovery", "--heartbeat-timeout",
                 "--session-ttl", "--max-sessions", "--api-key", "--admin-key"):
        assert flag in out


def test_config_errors_are_one_line_and_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert ppd_main(["proxy", "--policy", "ppd", "--prefill", "http://p:1",
                     "--decode", "http://d:1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs --table" in err and "Traceback" not in err


def test_subprocess_serves_and_stops_cleanly_on_sigterm() -> None:
    port = free_port()
    dead_p, dead_d = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [sys.executable, "-m", "profiler.cli", "proxy", "--port", str(port),
         "--prefill", dead_p, "--decode", dead_d],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        health = None
        for _ in range(150):
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert health is not None and health.status_code == 503  # nodes are down
    finally:
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    assert process.returncode == 0, err


def test_server_thread_runs_the_app_for_sync_callers() -> None:
    config = ProxyConfig(nodes=(NodeSpec(f"http://127.0.0.1:{free_port()}", Role.PREFILL),
                                NodeSpec(f"http://127.0.0.1:{free_port()}", Role.DECODE)),
                         port=0)
    with ServerThread(create_app(config)) as server:
        response = httpx.get(server.url + "/v1/models", timeout=5)
    assert response.status_code == 200 and response.json()["data"] == []

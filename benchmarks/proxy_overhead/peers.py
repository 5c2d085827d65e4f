"""Other projects' proxies measured beside ppd: the vLLM project's Rust router, `vllm-router`.

`vllm-router` (PyPI, the `bench` extra) is a Rust (tokio + hyper) router with a vLLM P/D mode.
Two targets run it over the same fakes as ppd:

- `vllm-router`: `--vllm-pd-disaggregation --prefill P --decode D`, its P->D path. It sends P
  the request with `max_tokens: 1` and `kv_transfer_params.do_remote_decode`, then streams D's
  reply with P's `kv_transfer_params` - what the fake P/D (backend.py) answers and checks.
- `vllm-router-d`: its plain load-balancer mode with D as the only worker, one hop: the peer of
  ppd's local path (a continuation served by D alone), which has no P/D-mode counterpart.

Both run `--policy round_robin`: with one P and one D every policy picks the same nodes, and
the default, `cache_aware`, asks each node to `/tokenize` and `/v1/chat/completions/render`
every request first (two more legs per node; the fakes do not serve them). Its start-up health
wait polls every `--worker-startup-check-interval` s (30 by default), and its metrics server
needs a port of its own, so both are set here.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PEERS = ("vllm-router", "vllm-router-d")


def executable() -> str | None:
    """The `vllm-router` command the `bench` extra installs: beside this Python first (a venv
    used without activating it, as `make` does), else on PATH."""
    beside = Path(sys.executable).parent / "vllm-router"
    return str(beside) if beside.is_file() else shutil.which("vllm-router")


def installed() -> bool:
    """Whether `vllm-router` is installed."""
    return executable() is not None


def command(peer: str, port: int, metrics_port: int, prefill: str, decode: str) -> list[str]:
    """The command line that starts `peer` on port, in front of the fake P and D."""
    common = ["--host", "127.0.0.1", "--port", str(port), "--policy", "round_robin",
              "--prometheus-port", str(metrics_port), "--worker-startup-check-interval", "1",
              ]
    router = executable()
    if router is None:
        raise RuntimeError("vllm-router is not installed: pip install -e '.[bench]'")
    if peer == "vllm-router":
        return [router, "--vllm-pd-disaggregation", "--prefill", prefill, "--decode",
                decode, *common]
    if peer == "vllm-router-d":
        return [router, "--worker-urls", decode, *common]
    raise ValueError(f"unknown peer {peer!r}; one of {PEERS}")


@contextmanager
def started(peer: str, port: int, metrics_port: int, prefill: str, decode: str
            ) -> Iterator[subprocess.Popen[bytes]]:
    """The peer's process for the block (its log discarded), stopped after."""
    proc = subprocess.Popen(command(peer, port, metrics_port, prefill, decode),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

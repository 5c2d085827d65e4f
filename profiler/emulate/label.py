"""Whether a target (a proxy, or a node) is served by emulated nodes, for run metadata.

An emulated node's model card says `owned_by: ppd-emulated:PRESET`; a proxy lists its nodes at
/stats. Tables, replay summaries and plots made on emulated nodes carry the preset, so their
numbers are never mistaken for measurements of vLLM.
"""

from __future__ import annotations

import httpx

PREFIX = "ppd-emulated:"


def emulation_of(target: str, timeout_s: float = 5.0) -> str | None:
    """The preset timing the nodes behind `target` ("h100:llama-3.1-8b"), None if not emulated
    (or unknown: a target that cannot be asked is taken for real)."""
    base = target.rstrip("/")
    try:
        with httpx.Client(timeout=timeout_s) as client:
            urls = [base]
            stats = client.get(f"{base}/stats")
            if stats.status_code == 200:
                nodes = stats.json().get("nodes") or stats.json().get("backends") or []
                urls = [n["url"] for n in nodes if isinstance(n, dict) and "url" in n] or urls
            for url in urls:
                models = client.get(f"{url.rstrip('/')}/v1/models").json().get("data") or []
                for card in models:
                    owner = str(card.get("owned_by", ""))
                    if owner.startswith(PREFIX):
                        return owner.removeprefix(PREFIX)
    except (httpx.HTTPError, ValueError, TypeError, AttributeError, KeyError):
        return None
    return None


def emulated_backend(preset: str) -> str:
    """The `backend` a table's or run's metadata records for a run on emulated nodes."""
    return f"emulated ({preset}; ppd emulated nodes, not vLLM)"

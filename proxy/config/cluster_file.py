"""A cluster file (`--cluster cluster.json`): its nodes, each checked (`NodeSpec`), how long
its D nodes keep a turn's KV for a readback, and which step-cost file suits the cluster it
describes (`live_costs_hint`, for `--policy live`'s error messages).
"""

from __future__ import annotations

import contextlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.config.config_files import ConfigError, read_bounded
from proxy.shared.vocabulary import Node, Role

# A node URL goes into every request line and log line: whitespace or a control character
# there would split them (a CR/LF from a hand-edited cluster.json was a traceback).
_URL_UNSAFE = re.compile(r"[\x00-\x20\x7f]")
MAX_URL_CHARS = 2048


@dataclass(frozen=True, slots=True)
class NodeSpec(Node):
    """One backend as configured: its URL exactly as written and its role, checked."""

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"node URL must start with http:// or https://: {self.url!r}")
        if _URL_UNSAFE.search(self.url) or len(self.url) > MAX_URL_CHARS:
            raise ConfigError(f"node URL {self.url[:MAX_URL_CHARS]!r} holds a space or control "
                              f"character (CR, LF, NUL...) or is over {MAX_URL_CHARS} "
                              "characters")
        if self.url.rstrip("/").endswith("/v1"):
            # Given .../v1 the proxy would ask .../v1/health and .../v1/v1/chat/completions:
            # every node unhealthy, every request a 503.
            raise ConfigError(f"node URL {self.url!r} ends in /v1: give the server's base URL "
                              f"without /v1 (e.g. {self.url.rstrip('/')[:-3]}); the proxy adds "
                              "/v1/... and /health itself")


def _read_cluster_file(path: Path) -> Any:
    try:
        return json.loads(read_bounded(path, "cluster"))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"cluster file {path} is not valid JSON: {exc}") from exc


def cluster_readback_ttl(path: Path) -> float | None:
    """How long a cluster.json's D nodes keep a turn's KV for a readback (None: not offered)."""
    data = _read_cluster_file(path)
    ttl = data.get("kv_readback_ttl_s") if isinstance(data, dict) else None
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not ttl > 0:
        raise ConfigError(f"cluster file {path}: kv_readback_ttl_s must be a positive number "
                          f"of seconds or null, got {ttl!r}")
    return float(ttl)


def load_cluster_file(path: Path) -> list[NodeSpec]:
    """Nodes from a cluster.json (`{"nodes": [{"role": ..., "url": ...}, ...]}`)."""
    data = _read_cluster_file(path)
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list):
        raise ConfigError(f"cluster file {path} has no 'nodes' list")
    specs = []
    for node in nodes:
        try:
            specs.append(NodeSpec(url=str(node["url"]), role=Role(node["role"])))
        except ConfigError as exc:  # says what is wrong with the URL
            raise ConfigError(f"cluster file {path}: {exc}") from None
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"cluster file {path}: bad node {node!r} (needs role "
                              f"prefill|decode|replica and url)") from exc
    return specs


# The step-cost file shipped for the tiny model on vLLM-CPU (tables/README.md says how it was
# fitted); relative to a clone's root, where the README's commands run.
SHIPPED_TINY_CPU_COSTS = "tables/tiny-cpu-1p1d.costs.json"


def live_costs_hint(cluster: Path | None) -> str:
    """Which command makes a step-cost file for the cluster a cluster.json describes (or, with
    none, for any cluster): its emulated preset's `ppd sim live-costs`, the shipped file of the
    tiny model on vLLM-CPU, or a fit to measured runs."""
    doc: Any = None
    if cluster is not None:
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(Path(cluster).read_text())
    doc = doc if isinstance(doc, dict) else {}
    emulated = doc.get("emulated") if isinstance(doc.get("emulated"), dict) else None
    model = doc.get("model")
    if emulated is not None and emulated.get("cost"):
        return (f"for this emulated cluster, `ppd sim live-costs --cost {emulated['cost']} "
                f"--model {model} --link {emulated.get('link', 'nvlink')} --out "
                "live-costs.json` writes one (`ppd cluster up --with-proxy --policy live` "
                "does it itself)")
    if model == "tiny":
        return (f"for the tiny model on vLLM-CPU pass the shipped {SHIPPED_TINY_CPU_COSTS} "
                "(`ppd cluster up --with-proxy --policy live` passes it itself)")
    return ("an emulated preset's comes from `ppd sim live-costs --cost PRESET --model M "
            f"--out PATH`; the tiny model on vLLM-CPU has {SHIPPED_TINY_CPU_COSTS}; for other "
            "vLLM nodes fit a preset to measured runs (`ppd sim calibrate RUNS --out "
            "preset.json`), then `ppd sim live-costs --cost preset.json --model M --out PATH`")

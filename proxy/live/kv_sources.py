"""Where D/R nodes publish KV cache events: `--kv-events` flags and cluster.json entries.

    --kv-events http://127.0.0.1:8200=tcp://127.0.0.1:5557[,tcp://127.0.0.1:5558]
    cluster.json: {"nodes": [{"role": "decode", "url": "...",
                              "kv_events": "tcp://127.0.0.1:5557",
                              "kv_events_replay": "tcp://127.0.0.1:5558"}, ...]}

The second endpoint is vLLM's optional replay socket (`replay_endpoint` in its
--kv-events-config). A PUB endpoint that binds every interface (`tcp://*:5557`, as vLLM is
configured) is connected to on the node's own host.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from proxy.live.kv_subscriber import KvEventSource


class KvSourceError(ValueError):
    """A --kv-events value or cluster.json entry that names no usable endpoint."""


def _endpoint(raw: str, node_url: str, what: str) -> str:
    if not raw.startswith("tcp://") or ":" not in raw[6:]:
        raise KvSourceError(f"{what} {raw!r} for {node_url} must look like tcp://HOST:PORT")
    host, _, port = raw[6:].rpartition(":")
    if not port.isdigit():
        raise KvSourceError(f"{what} {raw!r} for {node_url} has no port number")
    if host in ("*", "0.0.0.0", "[::]", "::"):
        host = urlsplit(node_url).hostname or "127.0.0.1"
    return f"tcp://{host}:{port}"


def parse_flag(value: str) -> KvEventSource:
    """One `--kv-events URL=tcp://HOST:PORT[,tcp://HOST:PORT]` value."""
    url, sep, endpoints = value.partition("=")
    if not sep or not url or not endpoints:
        raise KvSourceError(f"--kv-events {value!r}: use NODE_URL=tcp://HOST:PORT"
                            "[,tcp://HOST:PORT for replay]")
    parts = endpoints.split(",")
    if len(parts) > 2:
        raise KvSourceError(f"--kv-events {value!r}: at most two endpoints (events, replay)")
    replay = _endpoint(parts[1], url, "replay endpoint") if len(parts) == 2 else None
    return KvEventSource(url.rstrip("/"), _endpoint(parts[0], url, "endpoint"), replay)


def from_cluster_file(path: Path) -> list[KvEventSource]:
    """The `kv_events` entries of a cluster.json's nodes (the file was read once already, so
    its errors have been reported; a node without the key has none)."""
    data = json.loads(path.read_text())
    sources = []
    for node in data.get("nodes", []):
        endpoint = node.get("kv_events") if isinstance(node, dict) else None
        if endpoint is None:
            continue
        url = str(node["url"]).rstrip("/")
        replay = node.get("kv_events_replay")
        sources.append(KvEventSource(url, _endpoint(str(endpoint), url, "kv_events"),
                                     _endpoint(str(replay), url, "kv_events_replay")
                                     if replay else None))
    return sources


def merge(sources: Iterable[KvEventSource]) -> tuple[KvEventSource, ...]:
    """One source per node: a later one (a flag) replaces an earlier (the cluster file)."""
    by_url = {source.url: source for source in sources}
    return tuple(by_url.values())

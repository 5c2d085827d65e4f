"""KV cache events on a cluster's D and R nodes (vLLM and emulated), for `--policy live`.

Each D/R node publishes vLLM's KV cache events (`--kv-events-config`): a ZMQ PUB socket on
its HTTP port + 2000 and a replay ROUTER on + 3000 (+ 1000 is the node's NIXL side channel,
`profiler.cluster.plan`), so the endpoints follow from the node's
URL alone and cluster.json can name them (`kv_events`, `kv_events_replay`; read by
`proxy.live.kv_sources`). vLLM binds its PUB socket only for an endpoint with a wildcard
(`tcp://*:PORT`; anything else it connects to), so the PUB listens on every interface; the
replay socket is bound on the node's own host. P nodes publish nothing: residency is about
what a session's D (or R) still holds.

It sits in emulate/, below cluster/: the emulated nodes publish where vLLM does, and
`ppd cluster up` (`profiler.cluster.plan`) configures vLLM from the same offsets.
"""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from proxy.shared.vocabulary import Role

EVENTS_PORT_OFFSET = 2000
REPLAY_PORT_OFFSET = 3000
TOPIC = "kv"
_PUBLISHERS = (Role.DECODE, Role.REPLICA)


def publishes(role: Role) -> bool:
    """Whether a node of this role publishes KV cache events (D and R do, P does not)."""
    return role in _PUBLISHERS


def kv_events_args(role: Role, host: str, port: int) -> list[str]:
    """vLLM flags that turn on KV cache events for a node (none for P)."""
    if not publishes(role):
        return []
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{port + EVENTS_PORT_OFFSET}",
              "replay_endpoint": f"tcp://{host}:{port + REPLAY_PORT_OFFSET}", "topic": TOPIC}
    return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


def kv_event_keys(role: Role, url: str) -> dict[str, str]:
    """The cluster.json keys that tell the proxy where a node's events are (none for P)."""
    parts = urlsplit(url)
    if not publishes(role) or parts.port is None:
        return {}
    host = parts.hostname or "127.0.0.1"
    return {"kv_events": f"tcp://{host}:{parts.port + EVENTS_PORT_OFFSET}",
            "kv_events_replay": f"tcp://{host}:{parts.port + REPLAY_PORT_OFFSET}"}

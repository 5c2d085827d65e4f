"""`ProxyConfig`: everything the proxy needs, built once at start-up and validated there.

Sources, lowest precedence first: built-in defaults, `--config FILE` (YAML or TOML; keys are
the flag names, `-` or `_`), then command-line flags. Nodes are the union of every source:
the config file's `prefill`/`decode`/`replica` lists, `--cluster FILE` (the cluster.json that
`ppd cluster up` writes) and the repeatable `--prefill/--decode/--replica URL` flags.
Unknown keys, unknown policies and impossible combinations are errors with a clear message.
"""

from __future__ import annotations

import argparse
import enum
import json
import math
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from proxy.route import Role
from proxy.table import DEFAULT_SUCCESS_MARGIN


class ConfigError(ValueError):
    """The configuration is invalid; the message says what to fix."""


class Policy(enum.StrEnum):
    """The routing policies (DESIGN "How a request flows")."""

    PD = "pd"
    LOCAL = "local"
    FIXED = "fixed"
    PPD = "ppd"
    THRESHOLD = "threshold"
    REPLICA = "replica"




@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One backend as configured: its URL exactly as written and its role."""

    url: str
    role: Role

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"node URL must start with http:// or https://: {self.url!r}")


@dataclass(frozen=True, slots=True)
class PolicyConfig:
    """Which policy decides routes, with its parameters."""

    kind: Policy = Policy.PD
    x: float | None = None
    table: Path | None = None
    w_ttft: float = 1.0
    w_tpot: float = 1.0
    non_cached_tokens: int | None = None
    success_margin: float = DEFAULT_SUCCESS_MARGIN

    def __post_init__(self) -> None:
        if self.kind is Policy.FIXED and self.x is None:
            raise ConfigError("policy fixed needs --x F (the share of turn 2+ run locally)")
        if self.x is not None and not (0.0 <= self.x <= 1.0):
            raise ConfigError(f"--x must be in [0, 1], got {self.x}")
        if self.kind is Policy.PPD and self.table is None:
            raise ConfigError("policy ppd needs --table PATH (a decision table, CSV or Parquet)")
        if self.kind is Policy.THRESHOLD and self.non_cached_tokens is None:
            raise ConfigError("policy threshold needs --non-cached-tokens N")
        if self.non_cached_tokens is not None and self.non_cached_tokens < 0:
            raise ConfigError("--non-cached-tokens must be >= 0")
        for name in ("w_ttft", "w_tpot"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be a finite number >= 0")
        if not (0.0 <= self.success_margin <= 1.0):
            raise ConfigError("success margin must be in [0, 1]")


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The proxy's whole configuration; pass it to `create_app`."""

    nodes: tuple[NodeSpec, ...] = ()
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    host: str = "127.0.0.1"
    port: int = 8000
    tokenizer: Path | None = None
    discovery: str | None = None
    heartbeat_timeout: float = 10.0
    session_ttl: float = 3600.0
    max_sessions: int = 100_000
    api_key: str | None = None
    admin_key: str | None = None
    backend_api_key: str | None = None  # sent to every vLLM node (servers run with --api-key)
    max_body_bytes: int = 16 * 1024 * 1024
    max_in_flight: int | None = None  # admission control: 429 beyond this many open requests
    request_timeout: float = 600.0
    connect_timeout: float = 5.0
    health_interval: float = 5.0
    load_window: float = 30.0

    def __post_init__(self) -> None:
        if not (0 <= self.port <= 65535):
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")
        positive = ("heartbeat_timeout", "session_ttl", "request_timeout", "connect_timeout",
                    "health_interval", "load_window")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0")
        if self.max_sessions < 1:
            raise ConfigError("--max-sessions must be >= 1")
        if self.max_body_bytes < 1:
            raise ConfigError("--max-body-bytes must be >= 1")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ConfigError("--max-in-flight must be >= 1")
        roles: dict[str, Role] = {}
        for node in self.nodes:
            if roles.setdefault(node.url, node.role) is not node.role:
                raise ConfigError(f"node {node.url} is listed with two roles "
                                  f"({roles[node.url]} and {node.role})")
        if self.discovery is not None and not self.discovery.startswith("tcp://"):
            raise ConfigError(f"--discovery must look like tcp://HOST:PORT, got {self.discovery!r}")
        if self.discovery is None and not self._servable():
            need = ("--replica" if self.policy.kind is Policy.REPLICA
                    else "at least one --prefill and one --decode")
            raise ConfigError(f"no route can be served: policy {self.policy.kind} needs {need} "
                              "(or --cluster FILE, or --discovery for registered nodes)")

    def _servable(self) -> bool:
        roles = {node.role for node in self.nodes}
        if self.policy.kind is Policy.REPLICA:
            return Role.REPLICA in roles
        return Role.PREFILL in roles and Role.DECODE in roles


# Flag name (underscored) -> converter, for keys a config file may carry.
_SCALARS: dict[str, Any] = {
    "host": str, "port": int, "policy": Policy, "x": float, "table": Path, "w_ttft": float,
    "w_tpot": float, "non_cached_tokens": int, "tokenizer": Path, "discovery": str,
    "heartbeat_timeout": float, "session_ttl": float, "max_sessions": int, "api_key": str,
    "admin_key": str, "backend_api_key": str, "max_body_bytes": int, "max_in_flight": int,
    "request_timeout": float,
    "connect_timeout": float, "health_interval": float, "load_window": float,
    "success_margin": float, "cluster": Path,
}
_NODE_KEYS = {"prefill": Role.PREFILL, "decode": Role.DECODE, "replica": Role.REPLICA}
_PATH_KEYS = {"table", "tokenizer", "cluster"}


def build_parser() -> argparse.ArgumentParser:
    """The `ppd proxy` argument parser (defaults are None so the config file can fill them)."""
    p = argparse.ArgumentParser(
        prog="ppd proxy",
        description="Route multi-turn LLM traffic across vLLM prefill (P) and decode (D) nodes.",
    )
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="port to listen on (default 8000)")
    for role in _NODE_KEYS:
        p.add_argument(f"--{role}", action="append", default=[], metavar="URL",
                       help=f"a {role} node's base URL (repeatable)")
    p.add_argument("--cluster", type=Path, metavar="FILE",
                   help="cluster.json written by `ppd cluster up` (nodes with role and url)")
    p.add_argument("--config", type=Path, metavar="FILE", help="YAML or TOML config file")
    p.add_argument("--policy", choices=[x.value for x in Policy], help="routing policy (pd)")
    p.add_argument("--x", type=float, help="policy fixed: share of turn 2+ run locally, in [0,1]")
    p.add_argument("--table", type=Path, metavar="PATH", help="policy ppd: decision table")
    p.add_argument("--w-ttft", type=float, metavar="W", help="policy ppd: TTFT weight (1.0)")
    p.add_argument("--w-tpot", type=float, metavar="W", help="policy ppd: TPOT weight (1.0)")
    p.add_argument("--success-margin", type=float, metavar="M",
                   help=f"policy ppd: success-rate margin (default {DEFAULT_SUCCESS_MARGIN})")
    p.add_argument("--non-cached-tokens", type=int, metavar="N",
                   help="policy threshold: local iff the uncached suffix has <= N tokens")
    p.add_argument("--tokenizer", type=Path, metavar="DIR",
                   help="local HF tokenizer dir (tokenizer.json + chat template)")
    p.add_argument("--discovery", metavar="tcp://HOST:PORT",
                   help="bind a ZMQ ROUTER here for node heartbeats")
    p.add_argument("--heartbeat-timeout", type=float, metavar="S",
                   help="drop a registered node after S seconds without heartbeat (10)")
    p.add_argument("--session-ttl", type=float, metavar="S", help="session idle TTL (3600)")
    p.add_argument("--max-sessions", type=int, metavar="N", help="LRU bound on sessions")
    p.add_argument("--api-key", metavar="K", help="require `Authorization: Bearer K`")
    p.add_argument("--admin-key", metavar="K",
                   help="key needed for the x-ppd-route forcing header and /sessions")
    p.add_argument("--backend-api-key", metavar="K",
                   help="send `Authorization: Bearer K` to the vLLM nodes (their --api-key)")
    p.add_argument("--max-body-bytes", type=int, metavar="N", help="request body limit (16 MiB)")
    p.add_argument("--max-in-flight", type=int, metavar="N",
                   help="answer 429 while N completion requests are open (default: no limit)")
    p.add_argument("--request-timeout", type=float, metavar="S",
                   help="upstream read timeout in seconds (600)")
    p.add_argument("--connect-timeout", type=float, metavar="S", help="upstream connect (5)")
    p.add_argument("--health-interval", type=float, metavar="S", help="health check period (5)")
    p.add_argument("--load-window", type=float, metavar="S",
                   help="sliding window of the turns-per-second load meter (30)")
    return p


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML or TOML config file into flag-named keys; unknown keys are errors."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc.strerror or exc}") from exc
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path} is not valid {path.suffix[1:] or 'YAML'}: "
                          f"{exc}") from exc
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name in _NODE_KEYS:
            urls = [value] if isinstance(value, str) else value
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ConfigError(f"config key {key!r} must be a URL or a list of URLs")
            out[name] = urls
        elif name in _SCALARS:
            try:
                out[name] = _SCALARS[name](value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"config key {key!r}: bad value {value!r}") from exc
            if name in _PATH_KEYS and not out[name].is_absolute():
                out[name] = path.parent / out[name]
        else:
            known = ", ".join(sorted([*_SCALARS, *_NODE_KEYS]))
            raise ConfigError(f"unknown key {key!r} in config file {path} (known: {known})")
    return out


def load_cluster_file(path: Path) -> list[NodeSpec]:
    """Nodes from a cluster.json (`{"nodes": [{"role": ..., "url": ...}, ...]}`)."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read cluster file {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise ConfigError(f"cluster file {path} is not valid JSON: {exc}") from exc
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list):
        raise ConfigError(f"cluster file {path} has no 'nodes' list")
    specs = []
    for node in nodes:
        try:
            specs.append(NodeSpec(url=str(node["url"]), role=Role(node["role"])))
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"cluster file {path}: bad node {node!r} (needs role "
                              f"prefill|decode|replica and url)") from exc
    return specs


def config_from_args(argv: Sequence[str]) -> ProxyConfig:
    """Parse `ppd proxy` arguments (plus the files they name) into a validated ProxyConfig."""
    args = build_parser().parse_args(list(argv))
    return config_from_namespace(args)


def config_from_namespace(args: argparse.Namespace) -> ProxyConfig:
    """Merge defaults, the config file and flags (in that order) into a ProxyConfig."""
    settings: dict[str, Any] = load_config_file(args.config) if args.config else {}
    for name in _SCALARS:
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = Policy(value) if name == "policy" else value
    nodes: list[NodeSpec] = []
    for name, role in _NODE_KEYS.items():
        nodes += [NodeSpec(url, role) for url in settings.pop(name, [])]
    cluster = settings.pop("cluster", None)
    if cluster is not None:
        nodes += load_cluster_file(cluster)
    for name, role in _NODE_KEYS.items():
        nodes += [NodeSpec(url, role) for url in getattr(args, name)]
    unique = tuple(dict.fromkeys(nodes))  # keep order, drop repeats
    policy_keys = {f.name for f in fields(PolicyConfig)} - {"kind"}
    policy = PolicyConfig(kind=settings.pop("policy", Policy.PD),
                          **{k: settings.pop(k) for k in list(settings) if k in policy_keys})
    return ProxyConfig(nodes=unique, policy=policy, **settings)

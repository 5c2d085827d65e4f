"""`ProxyConfig`: everything the proxy needs, built once at start-up and validated there.

Sources, lowest precedence first: built-in defaults, `--config FILE` (YAML or TOML; keys are
the flag names, `-` or `_`), then command-line flags. Nodes are the union of every source:
the config file's `prefill`/`decode`/`replica` lists, `--cluster FILE` (the cluster.json that
`ppd cluster up` writes) and the repeatable `--prefill/--decode/--replica URL` flags.
Unknown keys, unknown policies and impossible combinations are errors with a clear message.
"""

from __future__ import annotations

import argparse
import ipaddress
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml

from proxy.config.cluster_file import (
    NodeSpec,
    cluster_readback_ttl,
    live_costs_hint,
    load_cluster_file,
)
from proxy.config.config_files import ConfigError, load_yaml, read_bounded
from proxy.config.policy_config import PolicyConfig
from proxy.live import kv_sources
from proxy.live.kv_subscriber import KvEventSource
from proxy.live.load_meter import DEFAULT_LOAD_WINDOW_S
from proxy.live.residency import DEFAULT_KV_BLOCKS
from proxy.observability.logs import LogFormat, LogLevel
from proxy.policies import registry
from proxy.policies.base import Need
from proxy.sessions.ledger import DEFAULT_MAX_SESSIONS, DEFAULT_SESSION_TTL_S
from proxy.shared.limits import LimitError, Limits
from proxy.shared.options import add_flags, option, option_fields
from proxy.shared.redact import redacted_url
from proxy.shared.vocabulary import Role
from proxy.upstream.breaker import DEFAULT_COOLDOWN_S, DEFAULT_FAILURES

# /v1/responses' store (proxy.responses.store reads them here: config imports nothing of it).
DEFAULT_MAX_RESPONSES = 10_000
DEFAULT_RESPONSE_TTL_S = 24 * 3600.0
DEFAULT_MAX_RESPONSE_BYTES = 4 * 1024 * 1024


def _is_loopback_endpoint(endpoint: str) -> bool:
    """True iff a tcp://HOST:PORT endpoint is reachable from this host only."""
    host = endpoint.removeprefix("tcp://").rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # `*`, an interface or host name: other hosts may reach it
        return False


@dataclass(frozen=True, slots=True)
class ProxyConfig:
    """The proxy's whole configuration; pass it to `create_app`."""

    nodes: tuple[NodeSpec, ...] = ()
    policy: PolicyConfig = field(default_factory=PolicyConfig)
    kv_events: tuple[KvEventSource, ...] = ()  # --kv-events / cluster.json (policy live)
    limits: Limits = field(default_factory=Limits)  # bytes and counts read from outside
    host: str = option("127.0.0.1", "address to listen on")
    port: int = option(8000, "port to listen on")
    tokenizer: Path | None = option(
        None, "local HF tokenizer dir (its tokenizer.json) for exact token counts; without "
        "it ~4 characters per token", metavar="DIR")
    discovery: str | None = option(None, "bind a ZMQ ROUTER here for node heartbeats",
                                   metavar="tcp://HOST:PORT")
    discovery_token: str | None = option(
        None, "shared secret every heartbeat must carry (env PPD_DISCOVERY_TOKEN for "
        "`ppd register`)", metavar="T")
    discovery_insecure: bool = option(
        False, "let --discovery register nodes without --discovery-token (any process that "
        "reaches the socket, on loopback any local one, can then add nodes)")
    heartbeat_timeout: float = option(
        10.0, "drop a registered node after S seconds without a heartbeat", metavar="S")
    session_ttl: float = option(DEFAULT_SESSION_TTL_S, "forget a session idle for S seconds",
                                metavar="S")
    max_sessions: int = option(DEFAULT_MAX_SESSIONS, "LRU bound on the sessions kept", metavar="N")
    session_store: str = option(
        "memory", "where sessions live: memory (this process; with --workers N, a "
        "redis-server the proxy starts for its workers on a Unix socket), or Redis/Valkey "
        "shared by replicas on several machines", metavar="memory|redis://HOST:PORT/DB")
    max_responses: int = option(
        DEFAULT_MAX_RESPONSES, "/v1/responses: keep at most N stored responses and "
        "conversations (the oldest written go first; docs/responses.md)", metavar="N")
    response_ttl: float = option(
        DEFAULT_RESPONSE_TTL_S, "/v1/responses: forget a stored response S seconds after it "
        "was written (a conversation: after its last item)", metavar="S")
    max_response_bytes: int = option(
        DEFAULT_MAX_RESPONSE_BYTES, "/v1/responses: one stored response's chain (or one "
        "conversation's items) is at most N bytes; a longer one is refused (413)", metavar="N")
    workers: int = option(1, "serve with N processes on one port, sharing sessions through "
                          "--session-store", metavar="N")
    api_key: str | None = option(None, "require `Authorization: Bearer K` on completions",
                                 metavar="K")
    admin_key: str | None = option(
        None, "key needed for the x-ppd-route forcing header and /sessions", metavar="K")
    backend_api_key: str | None = option(
        None, "send `Authorization: Bearer K` to the vLLM nodes (their --api-key)", metavar="K")
    max_body_bytes: int = option(16 * 1024 * 1024, "request body limit in bytes", metavar="N")
    max_in_flight: int | None = option(
        None, "answer 429 while N completion requests are open", metavar="N")
    request_timeout: float = option(
        600.0, "the whole request's budget in seconds, stream included: past it the client "
        "gets a 504, or a streamed reply ends with an in-band error (also each upstream read's "
        "timeout)", metavar="S")
    connect_timeout: float = option(5.0, "upstream connect timeout in seconds", metavar="S")
    health_interval: float = option(5.0, "seconds between health checks", metavar="S")
    metrics_interval: float = option(
        1.0, "policy live: seconds between scrapes of every node's /metrics", metavar="S")
    kv_blocks: int | None = option(
        None, "policy live: every D/R node's KV cache capacity in blocks, bounding its "
        f"residency index (default: each node's vllm:cache_config_info num_gpu_blocks, else "
        f"{DEFAULT_KV_BLOCKS})", metavar="N")
    load_window: float = option(
        DEFAULT_LOAD_WINDOW_S, "sliding window of the turns-per-second load meter, seconds",
        metavar="S")
    shutdown_grace: float = option(
        30.0, "on SIGTERM/SIGINT, seconds open streams may take to finish before they are cut",
        metavar="S")
    breaker_failures: int = option(
        DEFAULT_FAILURES, "open a node's circuit after N completion failures in a row",
        metavar="N")
    breaker_cooldown: float = option(
        DEFAULT_COOLDOWN_S, "seconds an open circuit waits before one probe request",
        metavar="S")
    kv_readback_ttl: float | None = option(
        None, "seconds the D nodes keep a finished turn's KV for P to read back (vLLM's "
        "decoder_kv_blocks_ttl with bidirectional_kv_xfer; a cluster.json from `ppd cluster "
        "up` sets it); unset: no readback route (docs/readback.md)", metavar="S")
    log_level: LogLevel = option(LogLevel.INFO, "log level (info: one access line per request)")
    log_format: LogFormat = option(LogFormat.TEXT, "log format: text, or one JSON object a line")
    otlp_traces_endpoint: str | None = option(
        None, "export OpenTelemetry traces of every turn (decision, legs) to this OTLP "
        "collector, as vLLM's flag of the name (gRPC; OTEL_EXPORTER_OTLP_TRACES_PROTOCOL="
        "http/protobuf for HTTP); legs carry W3C traceparent", metavar="URL")

    def __post_init__(self) -> None:
        if self.otlp_traces_endpoint is not None and (
                not self.otlp_traces_endpoint.strip() or any(
                    c.isspace() for c in self.otlp_traces_endpoint)):
            raise ConfigError("--otlp-traces-endpoint must be a collector address such as "
                              f"http://127.0.0.1:4317, got {self.otlp_traces_endpoint!r}")
        if not (0 <= self.port <= 65535):
            raise ConfigError(f"--port must be in [0, 65535], got {self.port}")
        positive = ("heartbeat_timeout", "session_ttl", "request_timeout", "connect_timeout",
                    "health_interval", "load_window", "metrics_interval")
        for name in positive:
            if not getattr(self, name) > 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be > 0")
        if self.kv_readback_ttl is not None and not self.kv_readback_ttl > 0:
            raise ConfigError("--kv-readback-ttl must be > 0")
        if not self.shutdown_grace >= 0:
            raise ConfigError("--shutdown-grace must be >= 0")
        if self.breaker_failures < 1:
            raise ConfigError("--breaker-failures must be >= 1")
        if not self.breaker_cooldown >= 0:
            raise ConfigError("--breaker-cooldown must be >= 0")
        if self.max_sessions < 1:
            raise ConfigError("--max-sessions must be >= 1")
        if self.max_responses < 1 or self.max_response_bytes < 1 or not self.response_ttl > 0:
            raise ConfigError("--max-responses and --max-response-bytes must be >= 1, "
                              "--response-ttl > 0")
        _check_scale_out(self.session_store, self.workers, self.discovery)
        if self.max_body_bytes < 1:
            raise ConfigError("--max-body-bytes must be >= 1")
        if self.kv_blocks is not None and self.kv_blocks < 1:
            raise ConfigError("--kv-blocks must be >= 1")
        if self.max_in_flight is not None and self.max_in_flight < 1:
            raise ConfigError("--max-in-flight must be >= 1")
        roles: dict[str, Role] = {}
        for node in self.nodes:
            if roles.setdefault(node.url, node.role) is not node.role:
                raise ConfigError(f"node {node.url} is listed with two roles "
                                  f"({roles[node.url]} and {node.role})")
        spec = registry.get(self.policy.kind)
        if spec.needs.costs is Need.REQUIRED and registry.costs_path(self.policy) is None:
            raise ConfigError(f"policy {spec.name} needs --live-costs PATH (a step-cost file): "
                              f"{live_costs_hint(None)}")
        if self.discovery is not None and not self.discovery.startswith("tcp://"):
            raise ConfigError(f"--discovery must look like tcp://HOST:PORT, got {self.discovery!r}")
        if self.discovery is not None and not self.discovery_token \
                and not self.discovery_insecure:
            reach = ("other hosts" if not _is_loopback_endpoint(self.discovery)
                     else "every local process")
            raise ConfigError(f"--discovery {self.discovery} without --discovery-token: "
                              f"{reach} could register a node, and a node receives user "
                              "prompts. Set --discovery-token T (nodes register with "
                              "`ppd register --token T`), or pass --discovery-insecure")
        if self.discovery is None and not self._servable():
            need = ("--replica" if spec.replicas_only
                    else "at least one --prefill and one --decode")
            raise ConfigError(f"no route can be served: policy {self.policy.kind} needs {need} "
                              "(or --cluster FILE, or --discovery for registered nodes)")

    def _servable(self) -> bool:
        """The nodes listed can start the policy: one of each role of its first role set."""
        roles = {node.role for node in self.nodes}
        return set(registry.get(self.policy.kind).roles[0]) <= roles


def _check_scale_out(store: str, workers: int, discovery: str | None) -> None:
    if store != "memory" and not store.startswith(("redis://", "rediss://", "unix://")):
        raise ConfigError("--session-store must be memory or redis://HOST:PORT/DB "
                          f"(rediss://, unix:///PATH also work), got {redacted_url(store)!r}")
    if workers < 1:
        raise ConfigError("--workers must be >= 1")
    if workers > 1 and discovery is not None:
        raise ConfigError("--workers > 1 cannot be combined with --discovery (one discovery "
                          "socket per port); list the nodes, or run one worker per replica")


_NODE_KEYS = {role.value: role for role in Role}


def _path_keys() -> set[str]:
    """Keys whose relative paths in a config file are relative to the file: `cluster` and
    every option that is a path (the policies' files among them, whichever declares them)."""
    return {"cluster", *(o.key for o in (*option_fields(PolicyConfig),
                                          *option_fields(ProxyConfig)) if o.convert is Path)}


def _scalar_options() -> dict[str, Callable[[Any], Any]]:
    """Config-file key -> converter: every option of both dataclasses, plus `cluster`."""
    opts = [*option_fields(PolicyConfig), *option_fields(ProxyConfig), *option_fields(Limits)]
    return {**{o.key: o.convert for o in opts}, "cluster": Path}


class _RaisingParser(argparse.ArgumentParser):
    """A parser whose usage errors raise ConfigError instead of printing usage and exiting
    (for callers that check the proxy's flags on its behalf, `ppd cluster up`)."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_parser(*, exit_on_error: bool = True) -> argparse.ArgumentParser:
    """The `ppd proxy` argument parser (defaults are None so the config file can fill them);
    exit_on_error False: usage errors raise ConfigError."""
    p = (argparse.ArgumentParser if exit_on_error else _RaisingParser)(
        prog="ppd proxy",
        description="Route multi-turn LLM traffic across vLLM prefill (P) and decode (D) nodes.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  ppd proxy --prefill http://127.0.0.1:8100 --decode "
        "http://127.0.0.1:8200 \\\n      --policy ppd --table tables/tiny-cpu-1p1d.csv "
        "--admin-key ADMIN --port 8000",
    )
    for role in _NODE_KEYS:
        p.add_argument(f"--{role}", action="append", default=[], metavar="URL",
                       help=f"a {role} node's base URL, without /v1 (repeatable)")
    p.add_argument("--cluster", type=Path, metavar="FILE",
                   help="cluster.json written by `ppd cluster up` (nodes with role and url)")
    p.add_argument("--kv-events", action="append", default=[], metavar="URL=tcp://H:P[,tcp://H:P]",
                   help="policy live: where node URL publishes vLLM KV cache events (and its "
                   "replay socket); cluster.json's kv_events keys do the same (repeatable)")
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="YAML or TOML file whose keys are these flags' names; flags win")
    add_flags(p, PolicyConfig)
    add_flags(p, ProxyConfig)
    add_flags(p, Limits)
    return p


def load_config_file(path: Path) -> dict[str, Any]:
    """Read a YAML or TOML config file into flag-named keys; unknown keys are errors."""
    text = read_bounded(path, "config")
    try:
        raw = tomllib.loads(text) if path.suffix == ".toml" else load_yaml(text, path)
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {path} is not valid {path.suffix[1:] or 'YAML'}: "
                          f"{exc}") from exc
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config file {path} must hold a mapping of settings")
    scalars = _scalar_options()
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = str(key).replace("-", "_")
        if name in _NODE_KEYS:
            urls = [value] if isinstance(value, str) else value
            if not isinstance(urls, list) or not all(isinstance(u, str) for u in urls):
                raise ConfigError(f"config key {key!r} must be a URL or a list of URLs")
            out[name] = urls
        elif name in scalars:
            try:
                out[name] = scalars[name](value)
            except ConfigError as exc:  # says what the valid values are
                raise ConfigError(f"config key {key!r} in {path}: {exc}") from None
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"config key {key!r}: bad value {value!r}") from exc
            if name in _path_keys() and not out[name].is_absolute():
                out[name] = path.parent / out[name]
        else:
            known = ", ".join(sorted([*scalars, *_NODE_KEYS]))
            raise ConfigError(f"unknown key {key!r} in config file {path} (known: {known})")
    return out


def config_from_args(argv: Sequence[str], *, exit_on_error: bool = True) -> ProxyConfig:
    """Parse `ppd proxy` arguments (plus the files they name) into a validated ProxyConfig;
    exit_on_error False: a usage error raises ConfigError rather than exiting."""
    args = build_parser(exit_on_error=exit_on_error).parse_args(list(argv))
    return config_from_namespace(args)


def config_from_namespace(args: argparse.Namespace) -> ProxyConfig:
    """Merge defaults, the config file and flags (in that order) into a ProxyConfig."""
    settings: dict[str, Any] = load_config_file(args.config) if args.config else {}
    for name in _scalar_options():
        value = getattr(args, name, None)
        if value is not None:
            settings[name] = value
    nodes: list[NodeSpec] = []
    for name, role in _NODE_KEYS.items():
        nodes += [NodeSpec(url, role) for url in settings.pop(name, [])]
    cluster = settings.pop("cluster", None)
    kv_events = []
    if cluster is not None:
        nodes += load_cluster_file(cluster)
        kv_events += kv_sources.from_cluster_file(cluster)
        if settings.get("kv_readback_ttl") is None:
            settings["kv_readback_ttl"] = cluster_readback_ttl(cluster)
    try:
        kv_events += [kv_sources.parse_flag(value) for value in args.kv_events]
    except kv_sources.KvSourceError as exc:
        raise ConfigError(str(exc)) from None
    for name, role in _NODE_KEYS.items():
        nodes += [NodeSpec(url, role) for url in getattr(args, name)]
    unique = tuple(dict.fromkeys(nodes))  # keep order, drop repeats
    policy = PolicyConfig(**{o.name: settings.pop(o.key) for o in option_fields(PolicyConfig)
                             if o.key in settings})
    try:
        limits = Limits(**{o.name: settings.pop(o.key) for o in option_fields(Limits)
                           if o.key in settings})
    except LimitError as exc:
        raise ConfigError(str(exc)) from None
    spec = registry.get(policy.kind)
    if spec.needs.costs is Need.REQUIRED and registry.costs_path(policy) is None:
        raise ConfigError(f"policy {spec.name} needs --live-costs PATH (a step-cost file): "
                          f"{live_costs_hint(cluster)}")
    return ProxyConfig(nodes=unique, policy=policy, kv_events=kv_sources.merge(kv_events),
                       limits=limits, **settings)

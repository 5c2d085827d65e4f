"""Several emulated nodes in one process, one port each, sharing one event loop.

    python -m profiler.emulate.serve --emulate h100 --model llama-3.1-8b \
        --node prefill:8100 --node decode:8101 --node decode:8102

runs until SIGINT/SIGTERM; `ppd cluster up --emulate` starts it. In-process (tests, the
benchmark): `async with hosted(preset, [(Role.PREFILL, 0), ...]) as nodes: nodes[0].url`.
Nodes of one process find each other by engine id, so a D's KV pull uses its P's link.
With `--kv-events` D and R nodes publish vLLM's KV cache events where
`profiler.emulate.node_kv_events` puts a vLLM node's (HTTP port + 2000, replay + 3000; port 0:
ports the OS chooses, named by `HostedNode.kv_events`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
import threading
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from profiler.emulate.app import create_node_app
from profiler.emulate.kv_publisher import KvEventPublisher
from profiler.emulate.node_kv_events import EVENTS_PORT_OFFSET, REPLAY_PORT_OFFSET, publishes
from profiler.emulate.presets import Preset, resolve
from profiler.emulate.service import EmulatedNodeSpec, NodeService, Peers
from profiler.emulate.tokenizer import Vocabulary, tokenizer_dir
from profiler.engine.host import host_of
from proxy.serving.server import running
from proxy.shared.vocabulary import Node, Role


@dataclass(frozen=True, slots=True)
class HostedNode(Node):
    """An emulated node serving: where it answers, its role, and its request handling."""

    service: NodeService

    @property
    def kv_events(self) -> tuple[str, str | None] | None:
        """(PUB endpoint, replay endpoint) of a node that publishes KV events, else None."""
        publisher = self.service.publisher
        if publisher is None or publisher.endpoint is None:
            return None
        return publisher.endpoint, publisher.replay_endpoint


def node_specs(preset: Preset, served_model: str, nodes: Sequence[tuple[Role, int]],
               host: str = "127.0.0.1", report_cached_tokens: bool = False,
               readback_ttl_s: float | None = None) -> list[EmulatedNodeSpec]:
    """One EmulatedNodeSpec per (role, port); names are role-index as the launcher names nodes."""
    specs: list[EmulatedNodeSpec] = []
    modelled = host_of(preset.cost)
    node_side = modelled.node_side()  # the proxy and client in front pay the rest for real
    for role, port in nodes:
        index = sum(1 for s in specs if s.role is role)
        specs.append(EmulatedNodeSpec(
            f"{role.value}-{index}", role, served_model, preset.name,
            max_model_len=preset.max_model_len,
            kv_bytes_per_token=preset.model.kv_bytes_per_token,
            link_bandwidth_bytes_s=preset.link.bandwidth_bytes_per_s,
            link_latency_s=preset.link.latency_s, report_cached_tokens=report_cached_tokens,
            host=host, port=port, readback_ttl_s=readback_ttl_s,
            frontend_request_s=node_side.frontend_request_ms / 1000,
            frontend_per_token_s=node_side.frontend_per_token_us / 1e6,
            frontend_per_running_s=modelled.frontend_per_running_ms / 1000,
            frontend_service_s=modelled.frontend_service_ms / 1000,
            handoff_fixed_s=modelled.kv_handoff_ms / 1000,
            # NIXL's per-block descriptors, spread over the block's tokens
            handoff_per_token_s=(modelled.kv_per_token_us + modelled.kv_descriptor_us
                                 * modelled.descriptors_per_block
                                 / preset.config.block_size) / 1e6,
        ))  # fmt: skip
    return specs


@contextlib.asynccontextmanager
async def hosted(preset: Preset, nodes: Sequence[tuple[Role, int]], *,
                 served_model: str | None = None, host: str = "127.0.0.1",
                 vocab: Vocabulary | None = None, report_cached_tokens: bool = False,
                 kv_events: bool = False, readback_ttl_s: float | None = None
                 ) -> AsyncIterator[list[HostedNode]]:
    """Serve one emulated node per (role, port) (port 0: the OS chooses) for the block;
    with kv_events, D and R nodes publish their KV cache events."""
    vocab = vocab if vocab is not None else Vocabulary(tokenizer_dir())
    preset.warm()
    peers = Peers()
    specs = node_specs(preset, served_model or preset.model.name, nodes, host,
                       report_cached_tokens, readback_ttl_s)
    async with contextlib.AsyncExitStack() as stack:
        out: list[HostedNode] = []
        for spec in specs:
            publisher = _publisher(spec) if kv_events and publishes(spec.role) else None
            engine = preset.make_engine(spec.role,
                                        kv_events=publisher is not None)
            service = NodeService(spec, engine, vocab, peers, publisher)
            server = await stack.enter_async_context(
                running(create_node_app(service), host, spec.port))
            out.append(HostedNode(server.url, spec.role, service))
        yield out


def _publisher(spec: EmulatedNodeSpec) -> KvEventPublisher:
    if not spec.port:
        return KvEventPublisher(spec.host, 0, 0)
    return KvEventPublisher(spec.host, spec.port + EVENTS_PORT_OFFSET,
                            spec.port + REPLAY_PORT_OFFSET)


def _node_arg(text: str) -> tuple[Role, int]:
    role, _, port = text.partition(":")
    try:
        return Role(role), int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"bad node {text!r}: expected ROLE:PORT with ROLE prefill, decode or replica"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m profiler.emulate.serve",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--emulate", required=True, help="hardware preset (h100, linear, ...)")
    parser.add_argument("--model", required=True, help="model shape (llama-3.1-8b, tiny)")
    parser.add_argument("--max-model-len", type=int, default=None)
    parser.add_argument("--served-model-name", default=None)
    parser.add_argument("--link", default=None, help="P->D link preset (nvlink, rdma-400g, ...)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--node", type=_node_arg, action="append", required=True,
                        metavar="ROLE:PORT")
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="tokenizer directory (default: the emulator's own, built once)")
    parser.add_argument("--enable-prompt-tokens-details", action="store_true",
                        help="report usage.prompt_tokens_details.cached_tokens (as vLLM's flag)")
    parser.add_argument("--kv-events", action="store_true",
                        help="D and R nodes publish KV cache events (ZMQ XPUB on PORT+2000, "
                        "replay on PORT+3000, as `ppd cluster up` configures vLLM)")
    parser.add_argument("--num-gpu-blocks-override", type=int, default=None, metavar="N",
                        help="KV cache blocks per node instead of the preset's (as vLLM's flag)")
    parser.add_argument("--kv-readback-ttl", type=float, default=None, metavar="S",
                        help="D nodes name a finished turn's blocks for a readback, and P nodes "
                        "read them back (vLLM's bidirectional_kv_xfer; docs/readback.md)")
    return parser


async def _serve(args: argparse.Namespace) -> None:
    preset = resolve(args.emulate, args.model, args.link, args.max_model_len,
                     args.num_gpu_blocks_override)
    vocab = Vocabulary(args.tokenizer or tokenizer_dir())
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with hosted(preset, args.node, served_model=args.served_model_name, host=args.host,
                      vocab=vocab, report_cached_tokens=args.enable_prompt_tokens_details,
                      kv_events=args.kv_events,
                      readback_ttl_s=args.kv_readback_ttl) as nodes:  # fmt: skip
        for node in nodes:
            print(f"{node.service.spec.name} {node.url} emulated {preset.name} "
                  f"(link {preset.link.name})", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        asyncio.run(_serve(args))
    except (ValueError, OSError) as exc:
        print(f"emulated nodes: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())


class HostThread:
    """`hosted(...)` in a background thread with its own event loop, for synchronous callers
    (e2e tests, the benchmark): `with HostThread(preset, nodes) as host: host.nodes[0].url`."""

    def __init__(self, preset: Preset, nodes: Sequence[tuple[Role, int]], **kwargs: object
                 ) -> None:
        self._preset, self._specs, self._kwargs = preset, list(nodes), kwargs
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()),
                                        name="ppd-emulated-nodes", daemon=True)
        self.nodes: list[HostedNode] = []

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        try:
            async with hosted(self._preset, self._specs, **self._kwargs) as nodes:  # type: ignore[arg-type]
                self.nodes = nodes
                self._ready.set()
                await self._stop.wait()
        except BaseException as exc:  # hand start-up failures to the caller's thread
            self._error = exc
        finally:
            self._ready.set()

    def __enter__(self) -> HostThread:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

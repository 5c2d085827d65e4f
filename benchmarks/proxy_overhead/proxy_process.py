"""The proxy under test, in its own process: `ppd proxy` exactly, or with another stack.

    python -m benchmarks.proxy_overhead.proxy_process --stack default -- --prefill URL ...

`default` runs `proxy.cli.main` (what `ppd proxy` runs); `workers2` and `workers4` the same
with `--workers 2` / `--workers 4` (and their embedded session store). The other stacks serve
the same app with chosen legs (`proxy.upstream.legs`; `httpx`: httpx's own pool,
`proxy.upstream.httpx_legs`;
`aiohttp`: `proxy.upstream.aiohttp_legs`), ASGI server and event loop, so the parts can be compared
in
one run:
`TRANSPORT+SERVER[+asyncio]` (the loop is uvloop unless `+asyncio`), or `aiohttp+granian`.
`floor` is not ppd: the same parts relaying with no logic at all (`floor.py`), the cost of the
hops alone; `floor+granian` the same on granian (Rust I/O threads) instead of uvicorn.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import logging
import os
import signal
import sys
import time
from typing import Any

# Set to a file name, the proxy process can be profiled (cProfile, in CPU time: a wait for a
# core is not charged to the function that waited): SIGUSR1 starts the profiler, SIGUSR2
# stops it and writes its stats there, so a run profiles a steady state, not the start-up.
# A profiler slows every call: a profiled run's timings are not the proxy's.
PROFILE_ENV = "PPD_BENCH_PROFILE"

STACKS = ("default", "workers2", "workers4", "httpx+hypercorn+asyncio", "httpx+uvicorn",
          "aiohttp+hypercorn+asyncio", "aiohttp+uvicorn+asyncio", "aiohttp+uvicorn",
          "aiohttp+granian", "floor", "floor+granian")


def _legs(name: str) -> Any:
    """The legs' factory (`proxy.upstream.legs.LegsFactory`) a stack names."""
    from proxy.upstream.aiohttp_legs import AiohttpLegs
    from proxy.upstream.httpx_legs import HttpxLegs, httpx_pool

    if name == "aiohttp":
        return AiohttpLegs
    return lambda timeout, headers: HttpxLegs(httpx_pool(), timeout, headers)


async def _serve(app: Any, host: str, port: int, server: str) -> None:
    from proxy.serving.server import ServerKind, running

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with running(app, host, port, server=ServerKind(server)):
        await stop.wait()


def _granian(app: Any, host: str, port: int) -> None:
    from granian.constants import Interfaces
    from granian.server.embed import Server

    server = Server(app, address=host, port=port, interface=Interfaces.ASGI, backlog=2048,
                    log_enabled=False)

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, server.stop)
        await server.serve()

    import uvloop

    uvloop.run(main())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--stack", choices=STACKS, default="default")
    parser.add_argument("proxy_args", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    proxy_args = [a for a in args.proxy_args if a != "--"]
    if args.stack == "default" or args.stack.startswith("workers"):
        from proxy.cli import main as proxy_main

        workers = args.stack.removeprefix("workers")
        return proxy_main([*proxy_args, "--workers", workers] if workers.isdigit() else proxy_args)
    from proxy.config.settings import config_from_args
    from proxy.serving.app import create_app

    config = config_from_args(proxy_args)
    if args.stack.startswith("floor"):
        import uvloop

        from benchmarks.proxy_overhead.floor import FloorApp
        from proxy.shared.vocabulary import Role

        first = {node.role: node.url.rstrip("/") for node in reversed(config.nodes)}
        floor = FloorApp(first[Role.PREFILL], first[Role.DECODE], str(config.policy.kind))
        if args.stack == "floor+granian":
            _granian(floor, config.host, config.port)
        else:
            uvloop.run(_serve(floor, config.host, config.port, "uvicorn"))
        return 0
    transport, server, *loop = args.stack.split("+")
    app = create_app(config, legs=_legs(transport))
    # As `ppd proxy` configures it (INFO), so hot-path logging costs what it costs there.
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if server == "granian":
        _granian(app, config.host, config.port)
    elif loop == ["asyncio"]:
        asyncio.run(_serve(app, config.host, config.port, server))
    else:
        import uvloop

        uvloop.run(_serve(app, config.host, config.port, server))
    return 0


def _profiled(out: str) -> int:
    profiler = cProfile.Profile(time.process_time)

    def stop(*_: Any) -> None:
        profiler.disable()
        profiler.dump_stats(out)

    signal.signal(signal.SIGUSR1, lambda *_: profiler.enable())
    signal.signal(signal.SIGUSR2, stop)
    return main()


if __name__ == "__main__":
    sys.exit(_profiled(os.environ[PROFILE_ENV]) if os.environ.get(PROFILE_ENV) else main())

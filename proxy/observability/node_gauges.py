"""How busy each node is: its vLLM `/metrics`, scraped in the background, with their age.

(Busyness, not load: in ppd "load" is the offered rate of turns, `proxy.live.load_meter`.)

Three gauges per node (summed over the engines a node reports):
`vllm:num_requests_running`, `vllm:num_requests_waiting` and `vllm:kv_cache_usage_perc`
(vLLM < 0.10 called the last one `vllm:gpu_cache_usage_perc`; either is read), and its KV
capacity in blocks (the `num_gpu_blocks` label of `vllm:cache_config_info`). A scrape
runs every `interval` seconds for all nodes at once, never on a request's path; a node whose
scrape fails keeps its last reading, whose age then grows (a policy can distrust it). The
proxy's own in-flight count per node (`proxy.upstream.backends.Backend.in_flight`) is exact and
current and is read beside these.

Only the sample lines of those gauges are read (`proxy.observability.prometheus_text.sample_sums`,
which
finds them with str.find: a full parse of vLLM's page costs ~140x more per scrape).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import httpx

from proxy.observability.prometheus_text import label_ints, sample_sums

log = logging.getLogger("ppd.proxy.load")

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_USAGE = "vllm:kv_cache_usage_perc"
KV_USAGE_OLD = "vllm:gpu_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
_GAUGES = (RUNNING, WAITING, KV_USAGE, KV_USAGE_OLD)


@dataclass(frozen=True, slots=True)
class NodeMetrics:
    """One scrape of a node: requests running and waiting, KV cache usage in [0, 1]."""

    running: float
    waiting: float
    kv_usage: float | None
    at: float  # the monotonic clock when it was read
    # KV cache capacity in blocks (vllm:cache_config_info's num_gpu_blocks label, summed
    # over engines): what bounds the node's residency index. None: not on the page.
    kv_blocks: int | None = None
    kv_block_size: int | None = None  # tokens per block (the same line's block_size label)

    @property
    def free_kv_tokens(self) -> int | None:
        """Tokens of KV the node has room for: (1 - usage) x blocks x block size; None
        where the page lacks one of them."""
        if self.kv_usage is None or self.kv_blocks is None or self.kv_block_size is None:
            return None
        return int(max(0.0, 1.0 - self.kv_usage) * self.kv_blocks * self.kv_block_size)


def parse_metrics(text: str, at: float) -> NodeMetrics:
    """The three gauges of a Prometheus text page (0 when a gauge is missing)."""
    totals = sample_sums(text, _GAUGES)
    usage = totals.get(KV_USAGE, totals.get(KV_USAGE_OLD))
    # num_gpu_blocks summed over engines; the block size is the first line's.
    config = label_ints(text, CACHE_CONFIG, "num_gpu_blocks", "block_size")
    blocks = sum(config["num_gpu_blocks"])
    block_size = next((size for size in config["block_size"] if size), None)
    return NodeMetrics(totals.get(RUNNING, 0.0), totals.get(WAITING, 0.0), usage, at,
                       blocks or None, block_size)


class NodeGauges:
    """The latest scrape per node URL, and the scraping loop that keeps them fresh."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.latest: dict[str, NodeMetrics] = {}
        self.failures: dict[str, int] = {}
        # Called with (url, reading) after each successful scrape.
        self.listeners: list[Callable[[str, NodeMetrics], None]] = []
        self._task: asyncio.Task[None] | None = None

    def get(self, url: str | None) -> NodeMetrics | None:
        return self.latest.get(url) if url is not None else None

    def age(self, url: str) -> float | None:
        """Seconds since the node's last successful scrape (None: never scraped)."""
        reading = self.latest.get(url)
        return None if reading is None else self.clock() - reading.at

    async def scrape(self, client: httpx.AsyncClient, urls: Iterable[str]) -> None:
        """Scrape every node once, concurrently."""
        await asyncio.gather(*(self._scrape_one(client, url) for url in urls))

    async def _scrape_one(self, client: httpx.AsyncClient, url: str) -> None:
        try:
            response = await client.get(f"{url.rstrip('/')}/metrics")
            response.raise_for_status()
            reading = self.latest[url] = parse_metrics(response.text, self.clock())
            for listener in self.listeners:
                listener(url, reading)
        except (httpx.HTTPError, ValueError) as exc:
            self.failures[url] = self.failures.get(url, 0) + 1
            log.debug("metrics scrape of %s failed: %s", url, exc)

    def start(self, urls: Callable[[], Iterable[str]], interval: float,
              timeout: float = 2.0, transport: httpx.AsyncBaseTransport | None = None) -> None:
        """Scrape `urls()` (read each round: nodes come and go) every `interval` seconds."""

        async def loop() -> None:
            async with httpx.AsyncClient(timeout=timeout, transport=transport) as client:
                while True:
                    started = self.clock()
                    await self.scrape(client, list(urls()))
                    await asyncio.sleep(max(0.0, interval - (self.clock() - started)))

        self._task = asyncio.create_task(loop(), name="metrics scraper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

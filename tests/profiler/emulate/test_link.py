"""KV transfers in real time on the one link model: concurrent transfers split its bandwidth."""

from __future__ import annotations

import asyncio

from profiler.emulate.link import WallClockLink
from profiler.engine.transfer import Link

BANDWIDTH = 2e6  # bytes/s: 20 KB take 10 ms alone


def wall_link(latency_s: float = 0.0) -> WallClockLink:
    return WallClockLink(Link("test", BANDWIDTH, latency_s, "hand"))


async def timed(link: WallClockLink, nbytes: float) -> float:
    loop = asyncio.get_running_loop()
    start = loop.time()
    await link.transfer(nbytes)
    return loop.time() - start


async def test_two_transfers_share_the_link_and_every_byte_arrives() -> None:
    link = wall_link()
    alone = await timed(link, 20_000)
    both = await asyncio.gather(timed(link, 20_000), timed(link, 20_000))
    assert alone >= 20_000 / BANDWIDTH
    # Each got half the bandwidth while both ran: neither can finish before 2x alone's bytes.
    assert min(both) >= 40_000 / BANDWIDTH - 1e-3
    assert link.bytes_moved == 60_000 and link.transfers == 3 and link.in_flight == 0


async def test_a_short_transfer_leaves_early_and_the_long_one_speeds_up() -> None:
    link = wall_link()
    finished: list[int] = []

    async def send(nbytes: int) -> float:
        elapsed = await timed(link, nbytes)
        finished.append(nbytes)
        return elapsed

    short, long = await asyncio.gather(send(10_000), send(30_000))
    assert short >= 20_000 / BANDWIDTH - 1e-3  # 10 KB at half rate
    assert long >= 40_000 / BANDWIDTH - 1e-3  # 20 KB shared, then 20 KB alone
    # By completion order, not elapsed time: a starved event loop can wake both at once.
    assert finished == [10_000, 30_000]


async def test_a_cancelled_transfer_stops_competing() -> None:
    link = wall_link()
    doomed = asyncio.create_task(link.transfer(1_000_000))
    await asyncio.sleep(0.005)
    doomed.cancel()
    elapsed = await timed(link, 20_000)
    assert link.in_flight == 0
    assert elapsed >= 20_000 / BANDWIDTH
    # Alone it took its bytes' time, not a shared one (the doomed 1 MB would take 0.5 s).
    assert elapsed < 0.25
    # The doomed transfer counts only what crossed before it went (~5 ms at 2 MB/s).
    assert 20_000 < link.bytes_moved < 20_000 + 100_000


async def test_latency_comes_before_the_bytes() -> None:
    link = wall_link(latency_s=0.02)
    assert await timed(link, 0) >= 0.02
    assert await timed(link, 20_000) >= 0.02 + 20_000 / BANDWIDTH

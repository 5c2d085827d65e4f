"""A fake 1P1D cluster in its own process, the stand-in for `ppd cluster up` in
scripts/readme_check.sh (a real tiny vLLM cluster takes ~25 s to start and a CPU core per node).

    python -m tests.fakes.readme_cluster --state .ppd-cluster --model tiny

Starts a fake P and a fake D (tests.fakes.fake_vllm: P answers the P leg with
kv_transfer_params, D streams), writes STATE/cluster.json as `ppd cluster up` does, and serves
until SIGTERM or SIGINT. P answers after a short delay, so a P->D turn 2 is measurably slower
than a local one and a profiled table has something to decide.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from pathlib import Path

from tests.fakes.fake_vllm import FakeVLLM

P_DELAY_S = 0.03
REPLY = "a fake answer of a dozen words, enough for a TPOT and an ITL or two"


async def serve(state: Path, model: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with (FakeVLLM("p", model=model, reply=REPLY) as prefill,
                FakeVLLM("d", model=model, reply=REPLY, chunk_delay_s=0.002) as decode):
        prefill.faults.delay_s = P_DELAY_S
        nodes = [{"role": "prefill", "url": prefill.url, "pid": os.getpid(), "log": ""},
                 {"role": "decode", "url": decode.url, "pid": os.getpid(), "log": ""}]
        state.mkdir(parents=True, exist_ok=True)
        document = {"model": model, "layout": "1P1D", "nodes": nodes}
        tmp = state / "cluster.json.tmp"
        tmp.write_text(json.dumps(document, indent=2) + "\n")
        tmp.replace(state / "cluster.json")  # readers never see half a file
        await stop.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state", type=Path, default=Path(".ppd-cluster"))
    parser.add_argument("--model", default="tiny")
    args = parser.parse_args()
    asyncio.run(serve(args.state, args.model))


if __name__ == "__main__":
    main()
